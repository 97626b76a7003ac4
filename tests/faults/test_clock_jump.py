"""Fault 5 of issue 36, the clock's part: the virtual clock jumping under the loop, and plans arriving after their
intervals started. (Racing plans and a watcher back on an old version: test_optimizer_killed.py.)

Real processes: the optimizer in its own process on the wall clock, a router and a cache-manager following its
plans in this process (test_optimizer_killed's loop). The clock of this process, which both enforcers read, is
replaced by a virtual clock hours ahead, then one back before the plan's first interval, then the wall clock again.

What must hold: after each jump both enforcers are on the plan in force and on the interval of it that covers their
clock (the router's weights and both enforcers' reports), within a couple of seconds, with no operator call; a
plan made while their clock is hours ahead (every interval of it started, by their clock) is put in force on the
interval covering their clock, or its last; no plan is activated twice (one active plan, versions with no gap).
"""

from __future__ import annotations

import time

import pytest
from greenserve.common.clock import VirtualClock, set_clock
from greenserve.common.plan_follow import interval_at
from greenserve.v1 import common_pb2, optimizer_pb2

from .conftest import until
from .test_optimizer_killed import loop  # noqa: F401  (the loop fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

AGREE_S = 5.0  # the enforcers look at the clock every second; room for two loaded cores


@pytest.fixture
def jump():
    """``jump(offset_s)``: this process's clock reads ``offset_s`` from the wall clock from now on; restored after."""
    previous = set_clock(VirtualClock(time.time()))

    def to(offset_s: float) -> None:
        set_clock(VirtualClock(time.time() + offset_s, 1.0, time.time()))

    yield to
    set_clock(previous)


async def _everyone_on_interval(loop, plan: common_pb2.Plan, offset_s: float) -> None:  # noqa: F811 - the imported fixture
    """Both enforcers hold ``plan``, the router routes on the interval covering its clock and both report it."""
    want = interval_at(plan, time.time() + offset_s)[1].start.ToSeconds()

    def router_weights_on_it() -> bool:
        interval = loop.handle.core.plans.interval_in_force()
        return loop.handle.core.plans.version == plan.version and interval is not None \
            and interval.start.ToSeconds() == want

    async def both_report_it() -> bool:
        status = await loop.stub.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest(version=plan.version), timeout=10)
        latest: dict[str, optimizer_pb2.EnforcementReport] = {}
        for r in sorted(status.reports, key=lambda r: r.reported_at.ToNanoseconds()):
            latest[r.component] = r
        return {c: r.interval_start.ToSeconds() for c, r in latest.items()
                if r.state == optimizer_pb2.ENFORCEMENT_STATE_APPLIED} == {"router": want, "cache-manager": want}

    await until(router_weights_on_it, AGREE_S, f"the router's weights on v{plan.version}'s interval at {want:.0f}")
    await until(lambda: loop.cache_manager_version() == plan.version, AGREE_S, f"the cache-manager on v{plan.version}")
    await until(both_report_it, AGREE_S, f"both enforcers reporting v{plan.version}'s interval at {want:.0f}",
                every_s=0.2)


async def test_clock_jumping_forward_and_back_keeps_every_enforcer_on_the_interval_in_force(loop, jump) -> None:  # noqa: F811 - the imported fixture
    plan = (await loop.stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=8))).plan
    assert len(plan.intervals) >= 6
    await _everyone_on_interval(loop, plan, 0.0)

    for offset_s in (3 * 3600.0, 5 * 3600.0, -2 * 3600.0, 1 * 3600.0, 0.0):  # forward, further, before it, back
        t0 = time.monotonic()
        jump(offset_s)
        await _everyone_on_interval(loop, plan, offset_s)
        print(f"clock jumped {offset_s / 3600:+.0f} h: both enforcers on the covering interval in "
              f"{time.monotonic() - t0:.2f} s")
        await loop.serve(plan.version, n=1)

    # a plan arriving while the enforcers' clock is 5 h ahead: all its intervals started, by their clock
    jump(5 * 3600.0)
    late = (await loop.stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2))).plan
    assert late.version == plan.version + 1
    assert interval_at(late, time.time() + 5 * 3600.0)[1] == late.intervals[-1]  # past its end: the last one
    await _everyone_on_interval(loop, late, 5 * 3600.0)
    await loop.serve(late.version, n=1)
    jump(0.0)
    await _everyone_on_interval(loop, late, 0.0)

    # no plan activated twice, none skipped
    plans = await loop.plans()
    assert sorted(p.version for p in plans) == list(range(1, late.version + 1))
    assert [p.version for p in plans if p.state == common_pb2.PLAN_STATE_ACTIVE] == [late.version]
