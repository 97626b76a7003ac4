"""The router's plan in force never goes back to an older plan its WatchPlans stream delivers late, after a newer
one came from the shared database (plans.py, PlanFollower.resubscribe); an operator's rollback still applies.

The optimizer is the in-test PlanPeer, its stream ``LAG_S`` late; "the database" is ``ActivePlan.apply`` without
``rollback``, the call the shared-state reload makes (core.py, sync_state)."""

from __future__ import annotations

import asyncio
import time

import grpc
from greenserve.common.plan_follow import APPLIED, REFUSED
from greenserve.router.routing.enforcer import ActivePlan, PlanWatcher
from greenserve.v1 import common_pb2

from tests.plan_peer import PlanPeer, interval, serve

LAG_S = 0.5


class LaggingPeer(PlanPeer):
    """WatchPlans delivers each plan LAG_S after the one before (so a plan published right after another waits)."""

    async def WatchPlans(self, request, context):
        async for event in super().WatchPlans(request, context):
            await asyncio.sleep(LAG_S)
            yield event


def _plan(version: int, weight: float) -> common_pb2.Plan:
    now = time.time()
    iv = interval(now - 60, now + 3600)
    iv.routing_weights.add(pool="p", engine_id="e", weight=weight)
    return common_pb2.Plan(version=version, intervals=[iv])


async def _until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_a_late_stream_plan_older_than_the_stored_one_is_skipped_and_a_rollback_still_applies() -> None:
    peer = LaggingPeer()
    server, address = await serve(peer)
    channel = grpc.aio.insecure_channel(address)
    store = ActivePlan(None)
    watcher = PlanWatcher(store, channel, backoff_max_s=0.2, instance="r1")
    watcher.start()
    versions: list[int] = []

    async def sample() -> None:
        while True:
            versions.append(store.version)
            await asyncio.sleep(0.005)

    sampler = asyncio.ensure_future(sample())
    try:
        await peer.publish(_plan(1, 1.0))
        await _until(lambda: store.version == 1)
        # v2 then v3 activated; the stream has v2 on its way when v3 comes from the database
        await peer.publish(_plan(2, 2.0))
        await peer.publish(_plan(3, 3.0))
        assert store.apply(_plan(3, 3.0))
        skipped = await peer.wait_report(lambda r: r.plan_version == 2 and r.state == REFUSED)
        assert skipped.detail.startswith("plan v2 skipped as stale: v3"), skipped.detail
        await asyncio.sleep(3 * LAG_S)  # v3 again from the stream, if it sends it: nothing changes
        assert store.version == 3 and watcher.follower.version == 3
        assert not any(r.plan_version == 2 and r.state == APPLIED for r in peer.reports)
        assert peer.watch_requests[-1] == 3  # it watched again after the stored plan
        seen = list(versions)
        assert seen == sorted(seen), seen  # never backwards

        # an operator's rollback to v2 comes through the (new) stream and is applied, and reported
        await peer.publish(_plan(2, 2.0))
        await _until(lambda: store.version == 2)
        assert store.weights_for("p")[0] == {"e": 2.0}
        await peer.wait_report(lambda r: r.plan_version == 2 and r.state == APPLIED)
        # the database holds v3 still (stored before the rollback): it does not take the router back there
        assert not store.apply(_plan(3, 3.0)) and store.version == 2
        assert store.apply(_plan(4, 4.0)) and store.version == 4  # a newer stored plan does
    finally:
        sampler.cancel()
        await watcher.stop()
        await channel.close()
        await server.stop(0)
