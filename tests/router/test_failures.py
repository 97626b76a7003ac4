"""Failure handling against emulated engines: a crash under load, a hung engine, an erroring engine,
ejection and half-open recovery. Every request is bounded by a timeout: none may hang."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from greenserve.v1 import common_pb2, router_pb2


async def _stream(s: aiohttp.ClientSession, url: str, body: dict, committed: list[str] | None = None) -> dict:
    """One streamed request: engine header, tokens seen, whether it finished with [DONE]. The router
    sends its headers only with the first token, so the engine header names the engine the request
    was committed to; it is appended to ``committed`` as soon as it arrives."""
    out = {"status": None, "engine": None, "tokens": 0, "done": False, "error": None}
    async with s.post(url, json=body) as resp:
        out["status"] = resp.status
        out["engine"] = resp.headers.get("x-greenserve-engine")
        if committed is not None and out["engine"]:
            committed.append(out["engine"])
        if resp.status != 200:
            return out
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                out["done"] = True
                break
            obj = json.loads(data)
            if "error" in obj:
                out["error"] = obj["error"]
            elif obj.get("choices") and obj["choices"][0].get("text"):
                out["tokens"] += 1
    return out


async def _until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.005)


async def test_engine_killed_under_load_requests_without_first_token_complete_elsewhere(emulators, router) -> None:
    """Deterministic under a loaded machine: the crash happens once a request is known to be committed
    to the victim (its first token reached the client), not after a fixed sleep; the 30 later requests
    are all sent after the crash, so none of them has a first token from the victim; ejection is
    awaited (probes are periodic) rather than sampled at one instant."""
    emus = await emulators(3, time_scale=4.0)
    r = await router([e.url for e in emus])
    victim = emus[0]
    victim_id = victim.url.split("://")[1]
    body = {"model": victim.model, "prompt": "load " * 40, "max_tokens": 30, "stream": True}
    committed: list[str] = []
    async with aiohttp.ClientSession() as s:
        tasks = [asyncio.create_task(_stream(s, r.http + "/v1/completions", body, committed)) for _ in range(60)]
        await _until(lambda: victim_id in committed, 30, "a request is committed to the victim")
        victim.set_faults(crash=True)
        more = [asyncio.create_task(_stream(s, r.http + "/v1/completions", body)) for _ in range(30)]
        results = await asyncio.wait_for(asyncio.gather(*tasks, *more), timeout=60)
    assert all(res["status"] == 200 for res in results), [res["status"] for res in results]
    for res in results:
        if res["engine"] != victim_id:
            # never committed to the dead engine (or retried off it before the first token): complete
            assert res["done"] and res["tokens"] == 30, res
        else:
            # committed to the victim before it died: ends with an error event, never a hang or replay
            assert res["done"] or res["error"] is not None, res
    assert any(res["engine"] == victim_id for res in results)  # the committed branch was exercised
    assert sum(1 for res in results if res["engine"] != victim_id) >= 30
    assert all(res["engine"] != victim_id for res in results[60:])  # sent after the crash: elsewhere
    # failed requests and probes eject it (within a few probe intervals), and the circuit stays open:
    # no success can come from a dead engine (a first token already on the wire when it died is not
    # taken as a recovery: engines.record_success ignores successes sent before the ejection)
    await _until(lambda: r.core.registry.engines[victim_id].ejected_until > 0, 10, "the victim is ejected")
    await asyncio.sleep(0.5)
    assert r.core.registry.engines[victim_id].ejected_until > 0


async def test_hung_engine_is_retried_after_first_token_timeout_and_ejected(emulators, router) -> None:
    emus = await emulators(2)
    r = await router([e.url for e in emus], first_token_timeout_s=0.5)
    hung_id = emus[0].url.split("://")[1]
    emus[0].set_faults(hang=True)
    body = {"model": emus[0].model, "prompt": "x", "max_tokens": 4, "stream": True}
    async with aiohttp.ClientSession() as s:
        t0 = time.monotonic()
        results = await asyncio.wait_for(
            asyncio.gather(*(_stream(s, r.http + "/v1/completions", body) for _ in range(8))), timeout=20)
    assert all(res["status"] == 200 and res["done"] and res["engine"] != hung_id for res in results)
    assert time.monotonic() - t0 < 10
    for _ in range(50):  # the health probe (timeout 0.5 s) also fails: ejected without traffic
        if r.core.registry.engines[hung_id].ejected_until:
            break
        await asyncio.sleep(0.1)
    assert r.core.registry.engines[hung_id].ejected_until > 0


async def test_erroring_engine_is_ejected_then_recovers_half_open(emulators, router) -> None:
    emus = await emulators(2)
    r = await router([e.url for e in emus], eject_base_s=0.5, eject_after_failures=2)
    bad_id = emus[0].url.split("://")[1]
    emus[0].set_faults(error_rate=1.0)
    body = {"model": emus[0].model, "prompt": "x", "max_tokens": 2}
    async with aiohttp.ClientSession() as s:
        for _ in range(10):
            async with s.post(r.http + "/v1/completions", json=body) as resp:
                assert resp.status == 200  # retried on the healthy engine before any token
                assert resp.headers["x-greenserve-engine"] != bad_id
        bad = r.core.registry.engines[bad_id]
        assert bad.ejected_until > 0
        listed = await r.stub.ListEngines(router_pb2.ListEnginesRequest())
        assert {e.engine.id: e.engine.state for e in listed.engines}[bad_id] == common_pb2.ENGINE_STATE_EJECTED
        emus[0].set_faults(error_rate=0.0)
        for _ in range(60):  # backoff passes; the next probe or request closes the circuit
            if not bad.ejected_until:
                break
            await asyncio.sleep(0.1)
        assert not bad.ejected_until and bad.consecutive_failures == 0
        seen = set()
        for _ in range(8):
            async with s.post(r.http + "/v1/completions", json=body) as resp:
                seen.add(resp.headers["x-greenserve-engine"])
        assert bad_id in seen


async def test_all_engines_down_gives_clean_503_quickly(emulators, router) -> None:
    emus = await emulators(2)
    r = await router([e.url for e in emus])
    for e in emus:
        e.set_faults(crash=True)
    async with aiohttp.ClientSession() as s:
        t0 = time.monotonic()
        async with s.post(r.http + "/v1/completions", json={"model": emus[0].model, "prompt": "x"}) as resp:
            assert resp.status == 503
            assert "no engine could serve" in (await resp.json())["error"]["message"]
        assert time.monotonic() - t0 < 5
