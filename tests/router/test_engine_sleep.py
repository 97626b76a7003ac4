"""Engines that step down (issue 33): the router applies the plan's ``engine_runs`` to emulated vLLM engines with
sleep mode: drains an engine before ``POST /sleep``, routes nothing to it asleep, wakes it and routes to it only once
``/is_sleeping`` says false and ``/health`` passes; a wake-up that does not finish in time is reported and retried
with back-off while the awake engines serve; an engine without sleep mode, and a pool the plan would leave with no
engine awake, stay awake. Every step shows in ListEngines and in the enforcement report."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from greenserve.common.plan_follow import APPLIED, APPLYING, FAILED
from greenserve.router.routing.enforcer import PlanError, validate_plan
from greenserve.v1 import common_pb2, router_pb2

from tests.plan_peer import PlanPeer, serve

AWAKE = common_pb2.ENGINE_RUN_STATE_AWAKE
SLEEPING = common_pb2.ENGINE_RUN_STATE_SLEEPING


@pytest.fixture
async def peer():
    p = PlanPeer()
    server, address = await serve(p)
    yield p, address
    await server.stop(0)


def plan(version: int, weights: dict[str, float], runs: dict[str, int]) -> common_pb2.Plan:
    return common_pb2.Plan(version=version, intervals=[common_pb2.PlanInterval(
        routing_weights=[common_pb2.RoutingWeight(pool="default", engine_id=e, weight=w) for e, w in weights.items()],
        engine_runs=[common_pb2.EngineRunTarget(pool="default", engine_id=e, state=s) for e, s in runs.items()])])


def final(version: int, *states: int):
    return lambda r: r.plan_version == version and r.state in states


async def states(r) -> dict[str, int]:
    reply = await r.stub.ListEngines(router_pb2.ListEnginesRequest())
    return {s.engine.id: s.engine.state for s in reply.engines}


async def ask(http: str, n: int = 1, max_tokens: int = 4) -> None:
    async with httpx.AsyncClient(timeout=20) as c:
        for _ in range(n):
            resp = await c.post(http + "/v1/completions", json={"model": "m", "prompt": "hello there", "max_tokens": max_tokens})
            assert resp.status_code == 200, resp.text


def served(emu) -> int:
    return sum(emu.metrics.request_success.values())


async def test_drain_then_sleep_route_around_then_wake_and_route_again(peer, emulators, router) -> None:
    p, address = peer
    emus = await emulators(2, model="m", enable_sleep_mode=True, sleep_s=0.5, wake_up_s=2.0)
    r = await router([e.url for e in emus], watch_plans=True, optimizer_addr=address)
    ids = {e.url.split("://")[1]: e for e in emus}
    # a long request in flight to the engine the plan will put to sleep: it must finish, not be aborted
    async with httpx.AsyncClient(timeout=60) as c:
        long = asyncio.ensure_future(c.post(r.http + "/v1/completions", json={
            "model": "m", "prompt": "a long answer please", "max_tokens": 400}))
        while not any(e.in_flight for e in r.core.registry.engines.values()):
            await asyncio.sleep(0.01)
        busy = next(eid for eid, e in r.core.registry.engines.items() if e.in_flight)
        other = next(eid for eid in ids if eid != busy)
        await p.publish(plan(1, {other: 1.0, busy: 0.0}, {other: AWAKE, busy: SLEEPING}))
        draining = await p.wait_report(lambda rep: rep.plan_version == 1 and rep.state == APPLYING
                                       and "going to sleep" in rep.detail)
        assert f"1 going to sleep ({busy})" in draining.detail
        assert (await states(r))[busy] == common_pb2.ENGINE_STATE_DRAINING
        assert not await ids[busy].engine.is_sleeping()  # not while its request runs
        done = await long
    assert done.status_code == 200 and done.json()["choices"][0]["finish_reason"] == "length"
    report = await p.wait_report(final(1, APPLIED), timeout_s=30)
    assert f"engines 1 asleep ({busy}), 1 awake" in report.detail
    assert await ids[busy].engine.is_sleeping()
    assert ids[busy].metrics.request_success.get("abort", 0) == 0
    assert (await states(r))[busy] == common_pb2.ENGINE_STATE_SLEEPING
    assert r.core.sleeper.calls == [(busy, "sleep")]

    before = served(ids[busy])
    await ask(r.http, 6)  # nothing reaches the asleep engine (it would hold the request until woken)
    assert served(ids[busy]) == before and not ids[busy].engine._held

    await p.publish(plan(2, {other: 1.0, busy: 1.0}, {other: AWAKE, busy: AWAKE}))
    t0 = time.monotonic()
    woken = await p.wait_report(final(2, APPLIED), timeout_s=30)
    assert time.monotonic() - t0 >= 2.0 / 20.0  # the modelled wake-up (2 engine-s at time scale 20) was waited for
    assert "1 asleep" not in woken.detail and not await ids[busy].engine.is_sleeping()
    assert (await states(r))[busy] == common_pb2.ENGINE_STATE_HEALTHY
    assert r.core.sleeper.calls == [(busy, "sleep"), (busy, "wake_up")]
    await ask(r.http, 12)
    assert served(ids[busy]) > before  # routed to again


async def test_an_engine_that_does_not_wake_in_time_is_reported_retried_with_back_off_and_routed_around(
        peer, emulators, router) -> None:
    p, address = peer
    emus = await emulators(2, model="m", enable_sleep_mode=True, sleep_s=0.1, wake_up_s=2000.0)  # 100 s wall
    r = await router([e.url for e in emus], watch_plans=True, optimizer_addr=address, wake_timeout_s=0.5,
                     sleep_retry_max_s=3.0)
    a, b = sorted(r.core.registry.engines)
    await p.publish(plan(1, {a: 1.0, b: 0.0}, {a: AWAKE, b: SLEEPING}))
    await p.wait_report(final(1, APPLIED), timeout_s=30)
    await p.publish(plan(2, {a: 1.0, b: 1.0}, {a: AWAKE, b: AWAKE}))
    failed = await p.wait_report(final(2, FAILED), timeout_s=30)
    assert f"{b}: did not wake within 0.5 s" in failed.detail and "the pool's awake engines serve" in failed.detail
    assert (await states(r))[b] == common_pb2.ENGINE_STATE_WAKING
    await ask(r.http, 6)  # the awake engine serves; the one still asleep gets nothing
    assert r.core.registry.get(b).sleep_hold
    await asyncio.sleep(2.0)
    wakes = [c for c in r.core.sleeper.calls if c == (b, "wake_up")]
    assert len(wakes) == 1  # back-off: the next try waits 3 s (no retry storm)
    await asyncio.sleep(2.0)
    assert len([c for c in r.core.sleeper.calls if c == (b, "wake_up")]) == 2  # tried again after its back-off


async def test_engine_without_sleep_mode_stays_awake_and_a_pool_keeps_one_engine_awake(
        peer, emulators, router) -> None:
    p, address = peer
    plain = await emulators(1, model="m")  # vLLM without --enable-sleep-mode: /sleep is 404
    sleepy = await emulators(1, model="m", enable_sleep_mode=True, sleep_s=0.1, wake_up_s=0.1)
    r = await router([plain[0].url, sleepy[0].url], watch_plans=True, optimizer_addr=address)
    a, b = plain[0].url.split("://")[1], sleepy[0].url.split("://")[1]
    await p.publish(plan(1, {a: 0.0, b: 1.0}, {a: SLEEPING, b: AWAKE}))
    report = await p.wait_report(final(1, APPLIED), timeout_s=30)
    assert f"{a} kept awake: no sleep mode (GET /is_sleeping answered 404" in report.detail
    assert (await states(r))[a] == common_pb2.ENGINE_STATE_HEALTHY and not r.core.registry.get(a).sleep_hold
    assert r.core.sleeper.calls == []  # found before any drain or POST /sleep

    await p.publish(plan(2, {a: 0.0, b: 0.0}, {a: SLEEPING, b: SLEEPING}))
    report = await p.wait_report(final(2, APPLIED), timeout_s=30)
    assert "pool default: the plan puts every engine to sleep, all kept awake" in report.detail
    assert not await sleepy[0].engine.is_sleeping()
    await ask(r.http, 2)


async def test_a_restarted_router_wakes_an_engine_it_finds_asleep(peer, emulators, router) -> None:
    p, address = peer
    emus = await emulators(2, model="m", enable_sleep_mode=True, sleep_s=0.1, wake_up_s=0.1)
    await emus[1].engine.sleep(1, "abort", 0.1)  # put to sleep before this router started
    r = await router([e.url for e in emus], watch_plans=True, optimizer_addr=address)
    b = emus[1].url.split("://")[1]
    await p.publish(common_pb2.Plan(version=1, intervals=[common_pb2.PlanInterval()]))  # no engine_runs: all awake
    report = await p.wait_report(final(1, APPLIED), timeout_s=30)
    await r.core.sleeper.settled(10)
    assert not await emus[1].engine.is_sleeping()
    assert r.core.sleeper.calls == [(b, "wake_up")]
    assert (await states(r))[b] == common_pb2.ENGINE_STATE_HEALTHY
    assert report.state == APPLIED


def test_engine_runs_are_validated_before_the_plan_is_taken() -> None:
    def runs(*targets: common_pb2.EngineRunTarget) -> common_pb2.Plan:
        return common_pb2.Plan(version=1, intervals=[common_pb2.PlanInterval(engine_runs=list(targets))])

    with pytest.raises(PlanError, match=r"engine_runs\[1\]: engine 'e1' is named twice"):
        validate_plan(runs(common_pb2.EngineRunTarget(engine_id="e1", state=SLEEPING),
                           common_pb2.EngineRunTarget(engine_id="e1", state=AWAKE)))
    with pytest.raises(PlanError, match=r"engine_runs\[0\].engine_id is empty"):
        validate_plan(runs(common_pb2.EngineRunTarget(state=SLEEPING)))
    with pytest.raises(PlanError, match=r"engine_runs\[0\].state 9 is not an EngineRunState"):
        validate_plan(runs(common_pb2.EngineRunTarget(engine_id="e1", state=9)))
