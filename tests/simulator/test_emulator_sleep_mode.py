"""The emulator's sleep mode behaves as vLLM's (``--enable-sleep-mode``): routes, what happens to requests held and
arriving, the emptied prefix cache, the modelled wake-up time and the power while asleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from greenserve.simulator.emulator import EmulatorConfig, EngineEmulator, sleep_mode
from prometheus_client.parser import text_string_to_metric_families

MODEL = "sleepy"
PROMPT = " ".join(f"word{i % 29} shared context {i}" for i in range(80))
TIME_SCALE = 100.0
WAKE_S = 30.0  # engine seconds: 0.3 s of wall time at TIME_SCALE


async def metrics(emu: EngineEmulator) -> dict[str, float]:
    async with httpx.AsyncClient() as c:
        text = (await c.get(emu.url + "/metrics")).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name
            for label in ("finished_reason", "sleep_state"):
                if label in s.labels:
                    key += ":" + s.labels[label]
            out[key] = s.value
    return out


@pytest.fixture
async def emu() -> AsyncIterator[EngineEmulator]:
    e = EngineEmulator(EmulatorConfig(port=0, model=MODEL, time_scale=TIME_SCALE, enable_sleep_mode=True,
                                      sleep_s=1.0, wake_up_s=WAKE_S))
    await e.start()
    yield e
    await e.stop()


async def complete(c: httpx.AsyncClient, url: str, max_tokens: int = 4) -> dict:
    r = await c.post(url + "/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens})
    assert r.status_code == 200, r.text
    return r.json()


async def test_routes_exist_only_with_sleep_mode_enabled() -> None:
    plain = EngineEmulator(EmulatorConfig(port=0, model=MODEL, time_scale=TIME_SCALE))
    await plain.start()
    try:
        async with httpx.AsyncClient() as c:
            assert (await c.post(plain.url + "/sleep")).status_code == 404
            assert (await c.get(plain.url + "/is_sleeping")).status_code == 404
            assert (await c.post(plain.url + "/wake_up")).status_code == 404
    finally:
        await plain.stop()


async def test_sleep_empties_the_prefix_cache_holds_new_requests_and_wake_up_serves_them(emu: EngineEmulator) -> None:
    async with httpx.AsyncClient(timeout=30) as c:
        await complete(c, emu.url)
        warm = await complete(c, emu.url)
        assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the prompt is in the prefix cache
        assert (await c.get(emu.url + "/is_sleeping")).json() == {"is_sleeping": False}

        assert (await c.post(emu.url + "/sleep", params={"level": "1"})).status_code == 200
        assert (await c.get(emu.url + "/is_sleeping")).json() == {"is_sleeping": True}
        m = await metrics(emu)
        assert m["vllm:engine_sleep_state:weights_offloaded"] == 1 and m["vllm:engine_sleep_state:awake"] == 0
        assert emu.engine.pool.cached_blocks == 0 and m["vllm:kv_cache_usage_perc"] == 0
        # asleep: the GPU's bare idle draw (the profile's idle power)
        assert m["greenserve:engine_power_watts"] == pytest.approx(emu.engine.timer.idle_power_w)
        assert (await c.get(emu.url + "/health")).status_code == 200  # vLLM's /health answers while asleep

        # a request sent to an asleep engine is accepted and held: no answer until the engine wakes
        held = asyncio.ensure_future(complete(c, emu.url))
        await asyncio.sleep(0.3)  # 30 engine seconds: far longer than the request takes awake
        assert not held.done()
        assert (await metrics(emu))["vllm:num_requests_waiting"] == 1

        t0 = time.perf_counter()
        assert (await c.post(emu.url + "/wake_up")).status_code == 200
        took = time.perf_counter() - t0
        assert took == pytest.approx(WAKE_S / TIME_SCALE, abs=0.15)  # the modelled wake-up, scaled
        assert (await c.get(emu.url + "/is_sleeping")).json() == {"is_sleeping": False}
        served = await asyncio.wait_for(held, 5)
        assert served["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the cache did not survive
        m = await metrics(emu)
        assert m["vllm:engine_sleep_state:awake"] == 1 and m["vllm:engine_sleep_state:weights_offloaded"] == 0
        # the held request's queue time is the time it waited, measured on the engine's clock
        assert emu.metrics.queue_time.sum >= 30.0


async def test_mode_abort_ends_requests_in_flight_and_mode_wait_lets_them_finish(emu: EngineEmulator) -> None:
    async with httpx.AsyncClient(timeout=30) as c:
        long = asyncio.ensure_future(c.post(emu.url + "/v1/completions",
                                            json={"model": MODEL, "prompt": PROMPT, "max_tokens": 4000}))
        while not emu.engine.running:
            await asyncio.sleep(0.005)
        assert (await c.post(emu.url + "/sleep")).status_code == 200  # level 1, mode abort: vLLM's defaults
        r = await long
        assert r.status_code == 500 and "aborted" in r.text
        assert (await metrics(emu))["vllm:request_success_total:abort"] == 1
        await c.post(emu.url + "/wake_up")

        finishing = asyncio.ensure_future(c.post(emu.url + "/v1/completions",
                                                 json={"model": MODEL, "prompt": PROMPT, "max_tokens": 300}))
        while not emu.engine.running:
            await asyncio.sleep(0.005)
        assert (await c.post(emu.url + "/sleep", params={"mode": "wait"})).status_code == 200
        r = await finishing
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["usage"]["completion_tokens"] == 300
        assert (await c.get(emu.url + "/is_sleeping")).json() == {"is_sleeping": True}


async def test_mode_keep_recomputes_frozen_requests_after_the_wake_up(emu: EngineEmulator) -> None:
    async with httpx.AsyncClient(timeout=30) as c:
        kept = asyncio.ensure_future(c.post(emu.url + "/v1/completions",
                                            json={"model": MODEL, "prompt": PROMPT, "max_tokens": 400}))
        while not emu.engine.running:
            await asyncio.sleep(0.005)
        assert (await c.post(emu.url + "/sleep", params={"mode": "keep"})).status_code == 200
        assert not emu.engine.running and len(emu.engine.waiting) == 1 and emu.engine.pool.used_blocks == 0
        await asyncio.sleep(0.1)
        assert not kept.done()
        await c.post(emu.url + "/wake_up")
        r = await asyncio.wait_for(kept, 10)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 400


async def test_sleep_and_wake_up_are_idempotent_and_bad_arguments_name_the_parameter(emu: EngineEmulator) -> None:
    async with httpx.AsyncClient(timeout=30) as c:
        r = await c.post(emu.url + "/sleep", params={"level": "3"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "level"
        r = await c.post(emu.url + "/sleep", params={"mode": "later"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "mode"
        t0 = time.perf_counter()
        assert (await c.post(emu.url + "/wake_up")).status_code == 200  # awake: nothing to do, no wake-up time
        assert time.perf_counter() - t0 < WAKE_S / TIME_SCALE / 2
        await c.post(emu.url + "/sleep", params={"level": "2"})
        assert (await metrics(emu))["vllm:engine_sleep_state:discard_all"] == 1
        assert (await c.post(emu.url + "/sleep", params={"level": "1"})).status_code == 200
        assert emu.engine.sleep_level == 2  # asleep already: unchanged


async def test_energy_asleep_is_idle_power_and_a_wake_up_costs_peak_power_for_its_time(emu: EngineEmulator) -> None:
    async with httpx.AsyncClient(timeout=30) as c:
        await c.post(emu.url + "/sleep")
        e0, t0 = emu.engine.energy_j(), emu.engine.now_s()
        await asyncio.sleep(0.2)
        e1, t1 = emu.engine.energy_j(), emu.engine.now_s()
        assert (e1 - e0) / (t1 - t0) == pytest.approx(emu.engine.timer.idle_power_w, rel=1e-3)
        await c.post(emu.url + "/wake_up")
        e2, t2 = emu.engine.energy_j(), emu.engine.now_s()
    idle = emu.engine.timer.idle_power_w
    extra = (e2 - e1) - idle * (t2 - t1)
    assert emu.engine.transfer_power_w > idle
    assert extra == pytest.approx((emu.engine.transfer_power_w - idle) * WAKE_S, rel=1e-3)


def test_modelled_transfer_times_follow_the_weights_and_the_host_link() -> None:
    emu = EngineEmulator(EmulatorConfig(port=0, enable_sleep_mode=True))
    p = emu.profile
    expected = p.weight_bytes / p.dram_bandwidth_bytes_per_s + sleep_mode.TRANSFER_FIXED_S
    assert sleep_mode.wake_up_s(p) == pytest.approx(expected)
    assert sleep_mode.sleep_s(p, 1) == pytest.approx(expected)
    assert sleep_mode.sleep_s(p, 2) == sleep_mode.TRANSFER_FIXED_S  # level 2 discards: nothing to copy
    assert 0.5 < expected < 10.0  # an 8B-class model over a PCIe Gen4 link: about a second, not a cold start
