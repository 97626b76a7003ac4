"""When to plan: ahead of each hour by the shared clock, on events, debounced, one computation at a time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from greenserve.common.clock import VirtualClock, set_clock
from greenserve.optimizer.scheduler import PlanScheduler, plan_start_s


def _at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_plan_start_takes_the_next_hour_once_its_lead_window_opens() -> None:
    assert plan_start_s(_at("2026-01-01T10:40:00"), 600) == _at("2026-01-01T10:00:00")
    assert plan_start_s(_at("2026-01-01T10:50:00"), 600) == _at("2026-01-01T11:00:00")
    assert plan_start_s(_at("2026-01-01T10:59:59"), 0) == _at("2026-01-01T10:00:00")


@pytest.fixture
def virtual_clock():
    clocks = []

    def install(start: str, speed: float) -> VirtualClock:
        clock = VirtualClock(_at(start), speed)
        clocks.append(set_clock(clock))
        return clock

    yield install
    if clocks:
        set_clock(clocks[0])


async def test_schedule_fires_lead_s_before_each_hour_on_a_virtual_clock(virtual_clock) -> None:
    clock = virtual_clock("2026-01-01T10:48:00", 1800.0)  # 30 virtual minutes per real second
    fired: list[float] = []

    async def compute(reason: str) -> None:
        assert reason == "schedule"
        fired.append(clock.now_s())

    scheduler = PlanScheduler(compute, lead_s=600.0, debounce_s=1.0)
    scheduler.start()
    try:
        for _ in range(100):
            if len(fired) >= 2:
                break
            await asyncio.sleep(0.05)
    finally:
        await scheduler.stop()
    assert len(fired) >= 2
    # First at 10:50 (+ debounce), next at 11:50: ten virtual minutes ahead of 11:00 and 12:00.
    assert _at("2026-01-01T10:50:00") <= fired[0] < _at("2026-01-01T11:00:00")
    assert _at("2026-01-01T11:50:00") <= fired[1] < _at("2026-01-01T12:00:00")


async def test_events_are_debounced_and_never_overlap() -> None:
    running = 0
    overlaps = 0
    reasons: list[str] = []

    async def compute(reason: str) -> None:
        nonlocal running, overlaps
        running += 1
        overlaps += running > 1
        reasons.append(reason)
        await asyncio.sleep(0.05)
        running -= 1

    scheduler = PlanScheduler(compute, lead_s=0.0, debounce_s=0.3)
    scheduler._tasks = [asyncio.get_running_loop().create_task(scheduler._consume())]  # events only, no schedule
    try:
        for reason in ("fleet_change", "forecast", "ci_change", "fleet_change"):
            assert scheduler.trigger(reason)
            await asyncio.sleep(0.02)
        manual = asyncio.create_task(scheduler.run_once("manual"))
        await asyncio.sleep(0.8)
        await manual
    finally:
        await scheduler.stop()
    # One computation for the burst (named by its most specific event) and the manual one, never at once.
    assert sorted(reasons) == ["ci_change", "manual"]
    assert overlaps == 0


async def test_failed_computation_keeps_going() -> None:
    calls = 0

    async def compute(reason: str) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("forecaster down")

    scheduler = PlanScheduler(compute, debounce_s=0.0)
    assert await scheduler.run_once("manual") is None
    assert await scheduler.run_once("manual") is None
    assert calls == 2 and scheduler.computed == 0
