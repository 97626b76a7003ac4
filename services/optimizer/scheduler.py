"""When to plan: ahead of every hour, and on events, debounced, never two computations at once.

* **Schedule**: ``lead_s`` before each hour (by the shared clock) the next plan is computed, so cache warm-up and
  MIG changes can happen before the hour starts. A plan computed at 10:50 starts at 11:00: ``plan_start_s`` takes
  the next hour when the lead window is open.
* **Events** (each a trigger name in the plan): ``ci_change`` (the CI forecast or the actual CI of a region moved
  by more than ``ci_change_fraction`` from what the plan in force assumed, CLOVER's 5 % rule), ``slo_breach``
  (a router reported attainment below a pool's target over its window), ``fleet_change`` (SetFleet, a GPU
  report), ``forecast`` (a fresh forecast differs from the plan's by more than the CI rule, checked every
  ``forecast_check_s``). Events arriving within ``debounce_s`` of each other make one computation.
* A computation that fails is logged and retried at the next trigger; the plan in force stays.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable

from greenserve.common.clock import clock, hour_floor_s
from greenserve.common.tasks import cancel_and_wait

log = logging.getLogger("greenserve.optimizer.scheduler")


def plan_start_s(now_s: float, lead_s: float) -> float:
    """Start of the hour a plan computed now covers first: the next hour once its lead window has opened."""
    next_hour = hour_floor_s(now_s) + 3600.0
    return next_hour if next_hour - now_s <= lead_s else hour_floor_s(now_s)


class PlanScheduler:
    def __init__(self, compute: Callable[[str], Awaitable[object]], *, lead_s: float = 600.0,
                 debounce_s: float = 5.0, enabled: bool = True) -> None:
        self.compute = compute
        self.lead_s = lead_s
        self.debounce_s = debounce_s
        self.enabled = enabled
        self._events: asyncio.Queue[str] = asyncio.Queue(maxsize=256)
        self._tasks: list[asyncio.Task[None]] = []
        self.lock = asyncio.Lock()  # one computation at a time (ComputePlan RPCs take it too)
        self.computed = 0
        self.last_trigger = ""
        self.last_scheduled_hour_s = -math.inf

    def start(self) -> None:
        if not self.enabled:
            return
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._schedule(), name="plan-schedule"),
                       loop.create_task(self._consume(), name="plan-events")]

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks = []

    def trigger(self, reason: str) -> bool:
        """Asks for a computation (debounced); False when the queue is full (one is coming anyway)."""
        if not self.enabled:
            return False
        try:
            self._events.put_nowait(reason)
            return True
        except asyncio.QueueFull:
            return False

    async def run_once(self, reason: str) -> object | None:
        async with self.lock:
            try:
                result = await self.compute(reason)
                self.computed += 1
                self.last_trigger = reason
                return result
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the plan in force stays; the next trigger retries
                log.warning("plan computation (%s) failed: %s", reason, exc)
                return None

    async def _consume(self) -> None:
        while True:
            reason = await self._events.get()
            reasons = [reason]
            # Debounce: gather the events that arrive within debounce_s (virtual-clock aware) into one computation.
            deadline = asyncio.get_running_loop().time() + clock().real_delay_s(self.debounce_s)
            while True:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    reasons.append(await asyncio.wait_for(self._events.get(), timeout=left))
                except TimeoutError:
                    break
            # The most specific reason names the plan ("schedule" < "fleet_change" < "forecast" < "ci_change" < ...).
            order = ["manual", "schedule", "forecast", "fleet_change", "ci_change", "slo_breach"]
            chosen = max(reasons, key=lambda r: order.index(r) if r in order else 0)
            await self.run_once(chosen)

    async def _schedule(self) -> None:
        """Computes the next hour's plan when its lead window opens (and once at start when none is in force)."""
        while True:
            c = clock()
            now = c.now_s()
            next_hour = hour_floor_s(now) + 3600.0
            due = next_hour - self.lead_s
            if now >= due and self.last_scheduled_hour_s < next_hour:
                self.last_scheduled_hour_s = next_hour
                self.trigger("schedule")
                continue
            wait = c.real_delay_s(due - now) if now < due else c.real_delay_s(next_hour + 1.0 - now)
            await asyncio.sleep(min(max(wait, 0.01), 30.0))
