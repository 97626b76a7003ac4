"""PlanFollower (greenserve.common.plan_follow): the interval in force, reconciles on a new plan and at interval
boundaries of the shared clock, never overlapping, reports queued while the optimizer is down, a raising
reconcile reported as failed, and the plan kept in a file. The optimizer is a tiny in-test servicer."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from google.protobuf.message import DecodeError

from greenserve.common.clock import VirtualClock, set_clock
from greenserve.common.plan_follow import (
    APPLIED,
    APPLYING,
    FAILED,
    REFUSED,
    Outcome,
    PlanFollower,
    interval_at,
    next_boundary_s,
    plan_file_store,
)
from greenserve.v1 import common_pb2

from tests.conftest import free_port
from tests.plan_peer import PlanPeer, interval, serve

HOUR_S = 3600.0
T0 = 1_800_000_000.0  # an hour boundary
DONE = Outcome(APPLIED, "done")


def _plan(version: int, hours: int = 3, start_s: float = T0) -> common_pb2.Plan:
    return common_pb2.Plan(version=version, intervals=[
        interval(start_s + h * HOUR_S, start_s + (h + 1) * HOUR_S) for h in range(hours)])


class Recorder:
    """A reconcile that records (plan version, interval start) and how many ran at once."""

    def __init__(self, outcome: Outcome = DONE, delay_s: float = 0.0) -> None:
        self.calls: list[tuple[int, int]] = []
        self.outcome = outcome
        self.delay_s = delay_s
        self.active = 0
        self.max_active = 0

    async def __call__(self, plan: common_pb2.Plan, iv: common_pb2.PlanInterval | None) -> Outcome:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            self.calls.append((plan.version, iv.start.seconds if iv is not None else -1))
            return self.outcome
        finally:
            self.active -= 1


@pytest.fixture
def use_clock():
    previous = []
    yield lambda c: previous.append(set_clock(c))
    if previous:
        set_clock(previous[0])


async def _until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_interval_at_and_next_boundary() -> None:
    plan = _plan(1)
    assert interval_at(plan, T0 - 10) == (0, plan.intervals[0])  # before the plan: its first interval
    assert interval_at(plan, T0 + 10)[0] == 0
    assert interval_at(plan, T0 + HOUR_S)[0] == 1  # start inclusive, end exclusive
    assert interval_at(plan, T0 + 2 * HOUR_S - 0.001)[0] == 1
    assert interval_at(plan, T0 + 99 * HOUR_S) == (2, plan.intervals[2])  # past it: the last one stays
    assert interval_at(common_pb2.Plan(version=1), T0) == (-1, None)
    assert next_boundary_s(plan, T0 + 10) == T0 + HOUR_S
    assert next_boundary_s(plan, T0 + 2 * HOUR_S) == float("inf")


async def test_reconciles_on_offer_and_again_when_the_clock_enters_the_next_interval(use_clock) -> None:
    use_clock(VirtualClock(T0 + HOUR_S - 2.0, speed=4.0))  # the next interval starts in 0.5 real s
    rec = Recorder()
    follower = PlanFollower(component="test", instance="i", channel=None, reconcile=rec)
    await follower.start()
    try:
        await follower.offer(_plan(1))
        assert rec.calls == [(1, int(T0))]
        await follower.offer(_plan(1))  # not newer: nothing
        assert await follower.reconcile_now() == Outcome(APPLIED, "done")  # that interval is done: not re-run
        assert rec.calls == [(1, int(T0))]
        await _until(lambda: len(rec.calls) == 2)
        assert rec.calls[1] == (1, int(T0 + HOUR_S))
        assert follower.reporter.last.interval_start.seconds == int(T0 + HOUR_S)
        await follower.reconcile_now(force=True)
        assert rec.calls[-1] == (1, int(T0 + HOUR_S)) and len(rec.calls) == 3
    finally:
        await follower.stop()


async def test_reconciles_never_overlap() -> None:
    rec = Recorder(delay_s=0.05)
    follower = PlanFollower(component="test", instance="i", channel=None, reconcile=rec)
    await follower.start()
    try:
        now = time.time()
        await asyncio.gather(follower.offer(_plan(1, start_s=now - 60)), follower.offer(_plan(2, start_s=now - 60)),
                             follower.reconcile_now(force=True), follower.reconcile_now(force=True))
        assert rec.max_active == 1 and len(rec.calls) >= 2
        assert follower.version == 2 and rec.calls[-1][0] == 2
    finally:
        await follower.stop()


async def test_a_raising_reconcile_is_reported_failed_and_the_follower_goes_on() -> None:
    calls = []

    async def reconcile(plan, iv):
        calls.append(plan.version)
        if plan.version == 1:
            raise RuntimeError("boom")
        return Outcome(REFUSED, "no")

    follower = PlanFollower(component="test", instance="i", channel=None, reconcile=reconcile)
    await follower.start()
    try:
        await follower.offer(_plan(1, start_s=time.time()))
        assert follower.last_outcome == Outcome(FAILED, "RuntimeError: boom")
        assert follower.reporter.last.state == FAILED
        await follower.offer(_plan(2, start_s=time.time()))
        assert calls == [1, 2] and follower.last_outcome.state == REFUSED
    finally:
        await follower.stop()


async def test_follows_watch_plans_and_reports_queued_while_the_optimizer_is_down() -> None:
    port = free_port()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[
        ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 300)])
    rec = Recorder()
    follower = PlanFollower(component="cache-manager", instance="n1", channel=channel, reconcile=rec,
                            backoff_max_s=0.3)
    await follower.start()
    peer = PlanPeer()
    server = None
    try:
        await follower.offer(_plan(1, start_s=time.time() - 60))  # while the optimizer is down
        await asyncio.sleep(0.3)
        assert follower.reporter.sent == 0 and len(follower.reporter._pending) == 1  # APPLYING replaced by APPLIED
        server, _ = await serve(peer, port)
        delivered = await peer.wait_report(lambda r: r.plan_version == 1)
        assert (delivered.component, delivered.instance, delivered.state) == ("cache-manager", "n1", APPLIED)
        assert delivered.detail == "done" and delivered.HasField("reported_at")

        await _until(lambda: follower.connected or peer.watch_requests, 10)
        assert peer.watch_requests[0] == 1  # it asks only for plans newer than the one it holds
        await peer.publish(_plan(2, start_s=time.time() - 60))
        final = await peer.wait_report(lambda r: r.plan_version == 2 and r.state != APPLYING)
        assert final.state == APPLIED and rec.calls[-1][0] == 2 and follower.version == 2
    finally:
        await follower.stop()
        await channel.close()
        if server is not None:
            await server.stop(0)


async def test_plan_file_store_round_trip_and_a_corrupt_file_starts_without_plan(tmp_path) -> None:
    path = tmp_path / "sub" / "plan.pb"
    save, load = plan_file_store(path)
    assert await load() is None
    plan = _plan(7, start_s=time.time() - 60)
    await save(plan)
    assert await load() == plan
    assert [p.name for p in path.parent.iterdir()] == ["plan.pb"]  # no temp file left

    rec = Recorder()
    follower = PlanFollower(component="t", instance="i", channel=None, reconcile=rec, save=save, load=load)
    await follower.start()
    assert follower.version == 7 and rec.calls == []  # in force already: not re-applied at start
    await follower.offer(_plan(8, start_s=time.time() - 60))
    await follower.stop()
    assert (await load()).version == 8 and rec.calls[0][0] == 8

    path.write_bytes(b"\xff\xff not a plan")
    with pytest.raises(DecodeError):
        await load()
    fresh = PlanFollower(component="t", instance="i", channel=None, reconcile=rec, save=save, load=load)
    await fresh.start()
    try:
        assert fresh.plan is None and fresh.version == 0
        assert await fresh.reconcile_now() is None
    finally:
        await fresh.stop()


async def test_an_older_plan_offered_is_a_rollback_and_is_reconciled() -> None:
    rec = Recorder()
    follower = PlanFollower(component="t", instance="i", channel=None, reconcile=rec)
    await follower.start()
    try:
        now = time.time()
        await follower.offer(_plan(5, start_s=now - 60))
        await follower.offer(_plan(4, start_s=now - 60))  # the optimizer re-activated v4
        await follower.offer(_plan(4, start_s=now - 60))  # the one held: nothing
        assert [c[0] for c in rec.calls] == [5, 4] and follower.version == 4
    finally:
        await follower.stop()
