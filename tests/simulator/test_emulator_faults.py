"""Fault injection of the engine emulator: error rate, hang, slow, crash/restart, mid-stream death, admin API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from greenserve.simulator.emulator import EmulatorConfig, EngineEmulator
from openai import AsyncOpenAI

from tests.simulator.test_emulator_api import MODEL, scrape


@pytest.fixture
async def emu() -> AsyncIterator[EngineEmulator]:
    e = EngineEmulator(EmulatorConfig(port=0, model=MODEL, time_scale=100.0))
    await e.start()
    yield e
    await e.stop()


def client(emu: EngineEmulator, **kw: object) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=emu.url + "/v1", api_key="x", max_retries=0, **kw)  # type: ignore[arg-type]


async def test_error_rate_answers_500_deterministically(emu: EngineEmulator) -> None:
    emu.set_faults(error_rate=1.0)
    with pytest.raises(openai.InternalServerError):
        await client(emu).completions.create(model=MODEL, prompt="x", max_tokens=2)

    async def outcomes(seed: int) -> list[int]:
        emu.set_faults(error_rate=0.5, seed=seed)
        async with httpx.AsyncClient() as c:
            return [
                (await c.post(emu.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1})).status_code
                for _ in range(16)
            ]

    first, again = await outcomes(7), await outcomes(7)
    assert first == again and set(first) == {200, 500}
    emu.set_faults(error_rate=0.0)
    r = await client(emu).completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert r.usage.completion_tokens == 2


async def test_hang_blocks_tokens_and_health_until_cleared(emu: EngineEmulator) -> None:
    emu.set_faults(hang=True)
    async with httpx.AsyncClient() as c:
        with pytest.raises(httpx.TimeoutException):
            await c.get(emu.url + "/health", timeout=0.3)
        pending = asyncio.create_task(
            c.post(emu.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 3}, timeout=10)
        )
        await asyncio.sleep(0.3)
        assert not pending.done()
        m = await scrape(emu)
        assert m["vllm:generation_tokens_total"] == 0 and m["vllm:num_requests_waiting"] + m["vllm:num_requests_running"] == 1
        emu.set_faults(hang=False)
        r = await pending
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert (await c.get(emu.url + "/health", timeout=2)).status_code == 200


async def test_slow_factor_stretches_engine_time(emu: EngineEmulator) -> None:
    c = client(emu)

    async def e2e_sum() -> float:
        return (await scrape(emu))["vllm:e2e_request_latency_seconds_sum"]

    t0 = await e2e_sum()
    await c.completions.create(model=MODEL, prompt="same prompt here", max_tokens=10)
    t1 = await e2e_sum()
    emu.set_faults(slow_factor=4.0)
    await c.completions.create(model=MODEL, prompt="same prompt here", max_tokens=10)
    t2 = await e2e_sum()
    # engine time of the same request is 4x (the second one even has a cache hit, which here saves
    # nothing: the prompt is shorter than one block)
    assert (t2 - t1) == pytest.approx(4 * (t1 - t0), rel=0.05)


async def test_crash_mid_stream_then_restart(emu: EngineEmulator) -> None:
    c = client(emu)
    prompt = "a long enough prompt " * 20
    await c.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    warm = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert warm.usage.prompt_tokens_details.cached_tokens > 0
    emu_slow = emu.engine.time_scale
    emu.engine.time_scale = 2.0  # slow down so the crash lands mid-stream
    stream = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=500, stream=True)
    got = 0
    with pytest.raises((openai.APIConnectionError, httpx.RemoteProtocolError, httpx.ReadError)):
        async for _chunk in stream:
            got += 1
            if got == 3:
                emu.set_faults(crash=True)
    assert got >= 3
    with pytest.raises(openai.APIConnectionError):
        await c.completions.create(model=MODEL, prompt="x", max_tokens=1)
    emu.engine.time_scale = emu_slow
    emu.set_faults(crash=False)
    await emu.wait_listening()
    r = await client(emu).completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    # a restarted engine has lost its prefix cache, and the crash freed every block
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    assert emu.engine.pool.used_blocks == 0 and not emu.engine.running


async def test_fail_after_tokens_cuts_streams(emu: EngineEmulator) -> None:
    emu.set_faults(fail_after_tokens=5)
    c = client(emu)
    stream = await c.completions.create(model=MODEL, prompt="x", max_tokens=50, stream=True)
    texts = []
    with pytest.raises((openai.APIConnectionError, httpx.RemoteProtocolError, httpx.ReadError)):
        async for chunk in stream:
            texts.append(chunk.choices[0].text)
    assert len(texts) == 5
    with pytest.raises(openai.APIConnectionError):
        await c.completions.create(model=MODEL, prompt="x", max_tokens=50)
    # short requests finish before the fault point
    r = await c.completions.create(model=MODEL, prompt="x", max_tokens=4)
    assert r.usage.completion_tokens == 4
    await asyncio.sleep(0.05)
    m = await scrape(emu)
    assert m["vllm:request_success_total:abort"] == 2 and m["vllm:num_requests_running"] == 0


async def test_admin_endpoint(emu: EngineEmulator) -> None:
    async with httpx.AsyncClient() as c:
        got = (await c.get(emu.url + "/admin/faults")).json()
        assert got == {"crash": False, "hang": False, "slow_factor": 1.0, "error_rate": 0.0, "seed": 0, "fail_after_tokens": 0}
        r = await c.post(emu.url + "/admin/faults", json={"slow_factor": 2.5, "error_rate": 0.25, "seed": 3})
        assert r.status_code == 200 and r.json()["slow_factor"] == 2.5
        assert emu.faults.error_rate == 0.25 and emu.faults.seed == 3
        for body, param in [
            ({"slow_factor": 0}, "slow_factor"),
            ({"error_rate": 1.5}, "error_rate"),
            ({"crash": "yes"}, "crash"),
            ({"errror_rate": 0.1}, "errror_rate"),
            ([1, 2], "body"),
        ]:
            r = await c.post(emu.url + "/admin/faults", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param
        assert emu.faults.slow_factor == 2.5  # a rejected update changes nothing
        r = await c.post(emu.url + "/admin/faults", json={"crash": True})
        assert r.status_code == 200 and r.json()["crash"] is True
        with pytest.raises(httpx.ConnectError):
            await c.get(emu.url + "/health")
    with pytest.raises(ValueError, match="slow_factor"):
        emu.set_faults(slow_factor=-1)


async def test_a_connection_that_escaped_the_crash_is_not_served(emu: EngineEmulator,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection the server accepted while the crash ran (its connection_made came after the crash aborted the
    open ones) stayed open, and a client's keep-alive pool kept getting 200 from /health on it: a router's health
    probes never failed, and it never ejected the "crashed" engine (a replicas test waited 15 s for it in CI). A
    crashed engine now answers nothing on any connection."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.get(f"{emu.url}/health") as resp:  # the connection is now in the client's pool
            assert resp.status == 200
            await resp.read()
        monkeypatch.setattr(emu, "_abort_connections", lambda: None)  # as if this one had escaped the abort
        emu.set_faults(crash=True)
        with pytest.raises(aiohttp.ClientError):
            async with session.get(f"{emu.url}/health") as resp:
                await resp.read()
    monkeypatch.undo()
    emu.set_faults(crash=False)
    await emu.wait_listening()
