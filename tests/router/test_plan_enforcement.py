"""The router's part of the control loop: it reads the interval in force by the shared clock and reports to the
optimizer what it did with each plan (applied with what it weights, refused with the reason), again at each
interval boundary; weighted engines it cannot find even through GetFleet are named in the report."""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest
from greenserve.common.clock import VirtualClock, set_clock
from greenserve.common.persistence import Database
from greenserve.common.plan_follow import APPLIED, REFUSED
from greenserve.router.routing.enforcer import ActivePlan, PlanWatcher
from greenserve.v1 import common_pb2

from tests.plan_peer import PlanPeer, interval, serve

HOUR_S = 3600.0
T0 = 1_800_000_000.0  # an hour boundary (2027-01-15 08:00 UTC)


@pytest.fixture
def restore_clock():
    previous = []
    yield lambda clock: previous.append(set_clock(clock))
    if previous:
        set_clock(previous[0])


@pytest.fixture
async def peer():
    p = PlanPeer()
    server, address = await serve(p)
    channel = grpc.aio.insecure_channel(address)
    yield p, channel
    await channel.close()
    await server.stop(0)


def _weights(**by_engine: float) -> list[common_pb2.RoutingWeight]:
    return [common_pb2.RoutingWeight(pool="p", engine_id=e, weight=w) for e, w in by_engine.items()]


def _two_hour_plan(version: int) -> common_pb2.Plan:
    second = _weights(e1=0.0, e2=1.0) + [common_pb2.RoutingWeight(pool="q", engine_id="ghost", weight=1.0)]
    return common_pb2.Plan(version=version, intervals=[
        interval(T0, T0 + HOUR_S, routing_weights=_weights(e1=1.0, e2=0.0)),
        interval(T0 + HOUR_S, T0 + 2 * HOUR_S, routing_weights=second)])


def _final(version: int, start_s: float | None = None):
    return lambda r: (r.plan_version == version and r.state in (APPLIED, REFUSED)
                      and (start_s is None or r.interval_start.seconds == int(start_s)))


async def test_weights_follow_the_virtual_clock_and_each_interval_is_reported(peer, restore_clock, tmp_path) -> None:
    p, channel = peer
    restore_clock(VirtualClock(T0 + HOUR_S - 3.0, speed=1.0))  # 3 s before the second interval
    db = Database.open(f"sqlite:///{tmp_path / 'r.db'}", "router")
    store = ActivePlan(db)
    watcher = PlanWatcher(store, channel, instance="r1", known_engines=lambda: {"e1", "e2"})
    watcher.start()
    try:
        await p.publish(_two_hour_plan(1))
        first = await p.wait_report(_final(1))
        assert (first.component, first.instance, first.state) == ("router", "r1", APPLIED)
        assert first.interval_start.seconds == int(T0)
        assert first.detail == "plan v1: weights for 1 pool(s), 2 engine(s)"
        assert store.weights_for("p") == ({"e1": 1.0, "e2": 0.0}, 1)

        second = await p.wait_report(_final(1, T0 + HOUR_S), timeout_s=30)  # the clock crossed the boundary
        assert second.state == APPLIED
        assert second.detail.startswith("plan v1: weights for 2 pool(s), 3 engine(s); 1 weighted engine(s) unknown")
        assert second.detail.endswith(": ghost")
        assert store.weights_for("p") == ({"e1": 0.0, "e2": 1.0}, 1)

        bad = _two_hour_plan(2)
        bad.intervals[1].routing_weights[0].weight = math.nan
        await p.publish(bad)
        refused = await p.wait_report(_final(2))
        assert refused.state == REFUSED
        assert refused.detail == ("plan.intervals[1].routing_weights[0].weight must be finite and >= 0; "
                                  "routing stays on plan v1")
        assert store.version == 1 and watcher.rejected == 1

        third = _two_hour_plan(3)
        await p.publish(third)
        await p.wait_report(_final(3))
        assert store.weights_for("p")[1] == 3
        since = len(p.reports)
        await p.publish(_two_hour_plan(1))  # an operator re-activates v1: the older plan is the one in force
        rolled = await p.wait_report(_final(1), since=since)
        assert rolled.state == APPLIED and store.version == 1 and store.plan.version == 1
    finally:
        await watcher.stop()

    # a restarted router holds the stored plan and asks only for newer ones
    again = ActivePlan(db)
    assert again.load_persisted() and again.version == 1
    restarted = PlanWatcher(again, channel)
    restarted.start()
    try:
        for _ in range(500):
            if len(p.watch_requests) >= 2:
                break
            await asyncio.sleep(0.02)
        assert p.watch_requests == [0, 1]
    finally:
        await restarted.stop()
        db.close()


async def test_a_plan_without_weights_routes_by_load_and_is_applied(peer) -> None:
    p, channel = peer
    store = ActivePlan(None)
    watcher = PlanWatcher(store, channel, instance="r2")
    watcher.start()
    try:
        await p.publish(common_pb2.Plan(version=3, intervals=[common_pb2.PlanInterval()]))
        report = await p.wait_report(_final(3))
        assert report.state == APPLIED and "no routing weights in this interval" in report.detail
        assert store.weights_for("p") == (None, 3)
    finally:
        await watcher.stop()


async def test_router_names_weighted_engines_it_cannot_find_after_get_fleet(peer, emulators, router) -> None:
    p, _ = peer
    server, address = await serve(p)  # a second port on the same peer, for the router's own channel
    try:
        emus = await emulators(2)
        extra = await emulators(1)
        r = await router([e.url for e in emus], watch_plans=True, optimizer_addr=address)
        ids = sorted(r.core.registry.engines)
        p.fleet = common_pb2.FleetInventory(pools=[common_pb2.Pool(
            name="default", model=emus[0].model,
            engines=[common_pb2.Engine(id="planned", url=extra[0].url, pool="default", model=emus[0].model)])])
        await p.publish(common_pb2.Plan(version=4, intervals=[common_pb2.PlanInterval(routing_weights=[
            common_pb2.RoutingWeight(pool="default", engine_id=e, weight=1.0)
            for e in (ids[0], ids[1], "planned", "ghost")])]))
        report = await p.wait_report(_final(4))
        assert report.state == APPLIED
        assert report.detail.startswith("plan v4: weights for 1 pool(s), 4 engine(s); 1 weighted engine(s) unknown")
        assert report.detail.endswith(": ghost")  # "planned" came from GetFleet and is registered
        assert "planned" in r.core.registry.engines
    finally:
        await server.stop(0)
