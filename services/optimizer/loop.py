"""The optimizer's side of the loop: fleet + plans + planner + scheduler + the event monitors, in one object the
servicer calls.

``compute(trigger)`` gathers the inputs once (``inputs.gather``), runs the planner, stores the plan and activates it
unless plans are held for approval. When a forecast the computation needs is older than ``forecast_max_age_s`` and
the forecaster does not answer, it runs the safe planner instead (safe_plan.py: every engine awake and weighted
equally, the rest kept as in force). The CI monitor compares, every ``monitor_interval_s`` of the clock, the actual
CI of each region (GetCurrentCarbonIntensity) and a fresh forecast with what the plan in force assumed, and asks the
scheduler for a new plan when one moved by more than ``ci_change_fraction``, debounced, with hysteresis and at most
once per ``ci_change_cooldown_s`` per region and signal (triggers.py); and, once the forecaster answers again, when
the plan in force was made on cached or expired forecasts (the loop converges back without an operator).
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from greenserve.common.carbon_params import CarbonParams
from greenserve.common.clock import clock, hour_floor_s
from greenserve.common.errors import FailedPrecondition, InvalidArgument
from greenserve.common.persistence import Database
from greenserve.common.plan_follow import interval_at
from greenserve.common.tasks import cancel_and_wait
from greenserve.optimizer import inputs as planning_inputs
from greenserve.optimizer import safe_plan
from greenserve.optimizer.fleet import FleetStore
from greenserve.optimizer.plan_store import PlanStore
from greenserve.optimizer.plan_builder import Planner
from greenserve.optimizer.scheduler import PlanScheduler, plan_start_s
from greenserve.optimizer.solvers import default_solvers
from greenserve.optimizer.triggers import ThresholdTrigger, relative_deviation
from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc, optimizer_pb2

log = logging.getLogger("greenserve.optimizer.loop")

MAX_HORIZON_HOURS = 168
DEFAULT_HORIZON_HOURS = 24
SLO_MIN_REQUESTS = 20
# After a breach the planner counts this share of the predicted capacity (x DERATE_STEP per breach, at least
# MIN_DERATE); a report DERATE_RECOVERY_MARGIN above target wins back x 1 / DERATE_RECOVERY, at most once per
# DERATE_RECOVERY_S (the evaluation replays the same rule: evaluation/day.py).
DERATE_STEP = 0.85
DERATE_RECOVERY = 0.95
DERATE_RECOVERY_MARGIN = 0.02
DERATE_RECOVERY_S = 3600.0
MIN_DERATE = 0.5


class OptimizerLoop:
    def __init__(self, *, db: Database, forecaster: grpc.aio.Channel | None, profiler: grpc.aio.Channel | None,
                 cache_manager: grpc.aio.Channel | None = None, params: CarbonParams, hold_plans: bool = False, horizon_hours: int = DEFAULT_HORIZON_HOURS,
                 lead_s: float = 600.0, debounce_s: float = 5.0, schedule: bool = True,
                 ci_change_fraction: float = 0.05, monitor_interval_s: float = 900.0,
                 forecast_max_age_s: float = 6 * 3600.0, solver_timeout_s: float = 10.0,
                 ci_signal: common_pb2.CarbonSignal = common_pb2.CARBON_SIGNAL_DIRECT, solvers: list | None = None,
                 slo_breach_cooldown_s: float = 900.0, forecast_timeout_s: float = 10.0,
                 ci_change_confirm_checks: int = 2, ci_change_cooldown_s: float = 3600.0) -> None:
        self.db = db
        self.fleet = FleetStore(db)
        self.plans = PlanStore(db)
        self.forecaster = forecaster
        self.profiler = profiler
        self.cache_manager = cache_manager
        self.params = params
        self.hold_plans = hold_plans
        self.horizon_hours = horizon_hours
        self.lead_s = lead_s
        self.ci_change_fraction = ci_change_fraction
        self.monitor_interval_s = monitor_interval_s
        self.slo_breach_cooldown_s = slo_breach_cooldown_s
        self.forecasts = planning_inputs.ForecastSource(db, forecaster, ci_signal=ci_signal,
                                                        max_age_s=forecast_max_age_s, timeout_s=forecast_timeout_s)
        self.planner = Planner(solvers if solvers is not None else default_solvers(),
                               solver_timeout_s=solver_timeout_s)
        self.safe_planner = safe_plan.safe_planner(self.planner)
        self.ci_trigger = ThresholdTrigger(ci_change_fraction, confirm_checks=ci_change_confirm_checks,
                                           cooldown_s=ci_change_cooldown_s)
        self.scheduler = PlanScheduler(self._scheduled_compute, lead_s=lead_s, debounce_s=debounce_s,
                                       enabled=schedule)
        self._monitor_task: asyncio.Task[None] | None = None
        self._breach_at: dict[str, float] = {}
        # pool -> share of the predicted capacity plans may count: lowered on a measured breach (the model promised
        # more than the engines gave), won back after good hours (PlanningInputs.capacity_derate)
        self.capacity_derate: dict[str, float] = {}
        self._recovered_at: dict[str, float] = {}

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(self.fleet.load)
        await asyncio.to_thread(self.plans.load)
        self.plans.bind_loop(asyncio.get_running_loop())
        self.scheduler.start()
        if self.scheduler.enabled and self.forecaster is not None and self.monitor_interval_s > 0:
            self._monitor_task = asyncio.get_running_loop().create_task(self._monitor(), name="ci-monitor")

    async def stop(self) -> None:
        await self.scheduler.stop()
        await cancel_and_wait(self._monitor_task)
        self.planner.close()
        self.safe_planner.close()

    # -- computing ------------------------------------------------------------------------------------

    async def compute(self, *, trigger: str, horizon_hours: int = 0, params: CarbonParams | None = None,
                      carbon_weight_fraction: float = 1.0, dry_run: bool = False,
                      hold: bool | None = None) -> tuple[common_pb2.Plan, float]:
        hours = horizon_hours or self.horizon_hours
        if not 1 <= hours <= MAX_HORIZON_HOURS:
            raise InvalidArgument("horizon_hours", f"must be in 1..{MAX_HORIZON_HOURS} (0 means {self.horizon_hours})")
        now = clock().now_s()
        start = plan_start_s(now, self.lead_s) if trigger == "schedule" else hour_floor_s(now)
        fleet = self.fleet.merged()
        started = time.perf_counter()
        inputs = await planning_inputs.gather(
            fleet=fleet, forecasts=self.forecasts, profiler=self.profiler, params=params or self.params,
            start_s=start, hours=hours, now_s=now, current=self.plans.active,
            carbon_weight_fraction=carbon_weight_fraction, declared=self.fleet.declared,
            cache_manager=self.cache_manager,
            traffic_history=any(getattr(s, "wants_traffic_history", False) for s in self.planner.solvers))
        inputs.capacity_derate = dict(self.capacity_derate)
        expired = safe_plan.expired_series(inputs)
        if expired:
            log.warning("forecasts of %s older than %.0f s and the forecaster does not answer: safe plan",
                        ", ".join(expired), self.forecasts.max_age_s)
        planner = self.safe_planner if expired else self.planner
        result = await asyncio.to_thread(planner.plan, inputs, trigger=trigger, created_s=now)
        plan = result.plan
        plan.forecasts.extend(planning_inputs.plan_forecasts(inputs, self.forecasts.ci_signal))
        if dry_run:
            return plan, time.perf_counter() - started
        activate = not (self.hold_plans if hold is None else hold)
        stored = await asyncio.to_thread(self.plans.store, plan, activate)
        log.info("plan v%d computed (%s)%s", stored.version, trigger, "" if activate else ", held for approval")
        return stored, time.perf_counter() - started

    async def _scheduled_compute(self, trigger: str) -> common_pb2.Plan:
        plan, _ = await self.compute(trigger=trigger)
        return plan

    # -- events ---------------------------------------------------------------------------------------

    def fleet_changed(self) -> None:
        self.scheduler.trigger("fleet_change")

    def report_attainment(self, request: optimizer_pb2.ReportAttainmentRequest) -> bool:
        if len(request.instance) > 253 or any(c in request.instance for c in "\n\r\x00"):
            raise InvalidArgument("instance", "at most 253 characters, one line")
        if len(request.pools) > 1024:
            raise InvalidArgument("pools", "at most 1024 pools per report")
        for i, p in enumerate(request.pools):
            if not 0.0 <= p.attainment_fraction <= 1.0:
                raise InvalidArgument(f"pools[{i}].attainment_fraction", "must be in [0, 1]")
            if not 1.0 <= p.window_s <= 86400.0:
                raise InvalidArgument(f"pools[{i}].window_s", "must be in [1, 86400]")
        slos = {pool.name: pool.slo for pool in self.fleet.merged().pools}
        now = clock().now_s()
        breached = False
        for p in request.pools:
            slo = slos.get(p.pool)
            if slo is None or p.requests < SLO_MIN_REQUESTS:
                continue
            if p.attainment_fraction >= slo.attainment_fraction:
                derate = self.capacity_derate.get(p.pool, 1.0)
                if (derate < 1.0 and p.attainment_fraction >= slo.attainment_fraction + DERATE_RECOVERY_MARGIN
                        and now - self._recovered_at.get(p.pool, -1e18) >= DERATE_RECOVERY_S):
                    self.capacity_derate[p.pool] = min(1.0, derate / DERATE_RECOVERY)
                    self._recovered_at[p.pool] = now
                continue
            if now - self._breach_at.get(p.pool, -1e18) < self.slo_breach_cooldown_s:
                continue
            self._breach_at[p.pool] = now
            self._recovered_at[p.pool] = now
            self.capacity_derate[p.pool] = max(MIN_DERATE, self.capacity_derate.get(p.pool, 1.0) * DERATE_STEP)
            log.warning("pool %s: attainment %.3f below target %.3f over %.0f s", p.pool, p.attainment_fraction,
                        slo.attainment_fraction, p.window_s)
            breached = True
        return breached and self.scheduler.trigger("slo_breach")

    async def check_ci(self) -> str | None:
        """One look at actual and forecast CI against the plan in force; the trigger to fire, if any.

        Every region of the interval in force is looked at (each look counts for its debounce, triggers.py):
        ``ci_change`` when a region's actual CI moved from what the plan assumed, ``forecast`` when its fresh
        forecast did, or when the plan in force was made on cached or expired forecasts and the forecaster answers
        again."""
        plan = self.plans.active
        if plan is None or self.forecaster is None:
            return None
        now = clock().now_s()
        idx, interval = interval_at(plan, now)
        if interval is None or not interval.start.ToSeconds() <= now < interval.end.ToSeconds():
            return None  # no interval of the plan covers now: nothing it assumed to compare (the schedule re-plans)
        stub = forecaster_pb2_grpc.ForecasterServiceStub(self.forecaster)
        degraded = [f for f in plan.forecasts if f.source in planning_inputs.DEGRADED_SOURCES]
        region_of = {p.name: p.region for p in self.fleet.merged().pools}
        regions: dict[str, str] = {}  # region -> the first pool of the interval in it
        for pool in interval.pools:
            if region_of.get(pool.pool):
                regions.setdefault(region_of[pool.pool], pool.pool)
        reason: str | None = None
        for region, pool_name in sorted(regions.items()):
            assumed_now = next(pp.ci_g_per_kwh for pp in interval.pools if pp.pool == pool_name)
            try:
                reply = await stub.GetCurrentCarbonIntensity(
                    forecaster_pb2.GetCurrentCarbonIntensityRequest(region=region), timeout=5.0)
                actual = reply.carbon_intensity.ci_g_per_kwh if reply.HasField("carbon_intensity") else None
                sample = (reply.carbon_intensity.time.seconds, actual)  # the hour read, and its value
            except grpc.aio.AioRpcError:
                actual = None
            if actual is not None and self.ci_trigger.look(("actual", region), relative_deviation(assumed_now, actual),
                                                           now, sample):
                log.info("region %s: actual CI %.0f vs %.0f assumed by plan v%d", region, actual, assumed_now,
                         plan.version)
                reason = reason or "ci_change"
            ref = common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key=region,
                                       carbon_signal=self.forecasts.ci_signal, unit=common_pb2.UNIT_G_PER_KWH)
            remaining = len(plan.intervals) - idx
            try:
                fresh = await self.forecasts.get(ref, interval.start.ToSeconds(), remaining, now, [])
            except FailedPrecondition:
                fresh = None
            if fresh is None or fresh.source != "forecaster":  # a cached forecast is no news
                continue
            if degraded:
                log.info("the forecaster answers again; plan v%d was made on %s forecasts: re-planning", plan.version,
                         "/".join(sorted({f.source for f in degraded})))
                reason = reason or "forecast"
                continue
            assumed = [next((pp.ci_g_per_kwh for pp in iv.pools if pp.pool == pool_name), 0.0)
                       for iv in plan.intervals[idx:]]
            if assumed and self.ci_trigger.look(("forecast", region), relative_deviation(
                    sum(assumed) / len(assumed), sum(fresh.mean) / len(fresh.mean)), now,
                    fresh.history_end_s or None):  # a forecast is news when its history grew
                reason = reason or "forecast"
        return reason

    async def monitor_once(self) -> str | None:
        """One round of the CI monitor: look (``check_ci``) and ask the scheduler for a plan when it says so."""
        reason = await self.check_ci()
        if reason:
            self.scheduler.trigger(reason)
        return reason

    async def _monitor(self) -> None:
        while True:
            await clock().sleep(self.monitor_interval_s)
            try:
                await self.monitor_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                log.warning("CI monitor: %s", exc)
