"""OptimizerService wiring: servicer and the build function the process entry point runs (settings: settings.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from greenserve.common import carbon
from greenserve.common.app import ServiceContext
from greenserve.common.carbon_messages import (
    breakdown_to_proto,
    params_from_proto,
    params_to_proto,
    require_finite,
)
from greenserve.common.carbon_params import load_default_params
from greenserve.common.client import create_channel
from greenserve.common.embodied_carbon import cache_embodied_g
from greenserve.common.errors import InvalidArgument
from greenserve.common.server import Registration, registration
from greenserve.optimizer.loop import OptimizerLoop
from greenserve.optimizer.plan_store import PlanStore, summary
from greenserve.optimizer.settings import OptimizerSettings
from greenserve.optimizer.solvers import default_solvers
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc


# Documented ranges of EstimateCarbonRequest (protos/greenserve/v1/optimizer.proto): within them every
# result is finite (the largest embodied term, 1,024 components x 1e6 x 1e12 g x 3.2e9 s / 1 s, is ~3e30 g).
MAX_ENERGY_KWH = 1e9
MAX_CI_G_PER_KWH = 1e4
MAX_DURATION_S = 3.2e9  # about 100 years
MAX_BATCH_SIZE = 1e6
MAX_CACHE_BYTES = 1 << 60
MAX_PUE = 10.0
MAX_SSD_EMBODIED_G_PER_TB = 1e9
MAX_COMPONENT_EMBODIED_G = 1e12
MIN_LIFETIME_S = 1.0
MAX_COMPONENTS = 1024
MAX_COMPONENT_COUNT = 1_000_000


def _check_carbon_params(msg: common_pb2.CarbonParams) -> None:
    """Upper bounds of carbon_params (params_from_proto checks the rest: pue >= 1, known components...)."""
    if msg.pue != 0:
        require_finite("carbon_params.pue", msg.pue, minimum=1.0, maximum=MAX_PUE)
    require_finite("carbon_params.ssd_embodied_g_per_tb", msg.ssd_embodied_g_per_tb, minimum=0.0,
                   maximum=MAX_SSD_EMBODIED_G_PER_TB)
    if msg.ssd_lifetime_s != 0:
        require_finite("carbon_params.ssd_lifetime_s", msg.ssd_lifetime_s, minimum=MIN_LIFETIME_S,
                       maximum=MAX_DURATION_S)
    if len(msg.components) > MAX_COMPONENTS:
        raise InvalidArgument("carbon_params.components", f"at most {MAX_COMPONENTS} components")
    for i, comp in enumerate(msg.components):
        path = f"carbon_params.components[{i}]"
        require_finite(f"{path}.embodied_g", comp.embodied_g, minimum=0.0, maximum=MAX_COMPONENT_EMBODIED_G)
        if comp.lifetime_s != 0:
            require_finite(f"{path}.lifetime_s", comp.lifetime_s, minimum=MIN_LIFETIME_S, maximum=MAX_DURATION_S)
        if comp.count > MAX_COMPONENT_COUNT:
            raise InvalidArgument(f"{path}.count", f"must be 0-{MAX_COMPONENT_COUNT}, got {comp.count}")


def estimate_carbon(request: optimizer_pb2.EstimateCarbonRequest) -> optimizer_pb2.EstimateCarbonResponse:
    """GreenLLM Eq. 1-3 for the compute platform plus GreenCache Eq. 4 for allocated cache storage.

    Every number is checked against its documented range first (InvalidArgument naming the field), so the
    results are finite."""
    energy_kwh = require_finite("energy_kwh", request.energy_kwh, minimum=0.0, maximum=MAX_ENERGY_KWH)
    ci = require_finite("ci_g_per_kwh", request.ci_g_per_kwh, minimum=0.0, maximum=MAX_CI_G_PER_KWH)
    duration_s = require_finite("duration_s", request.duration_s, minimum=0.0, maximum=MAX_DURATION_S)
    batch = require_finite("mean_batch_size", request.mean_batch_size or 1.0, minimum=1.0, maximum=MAX_BATCH_SIZE)
    if request.cache_allocated_bytes > MAX_CACHE_BYTES:
        raise InvalidArgument("cache_allocated_bytes", f"must be 0-2^60 bytes, got {request.cache_allocated_bytes}")
    _check_carbon_params(request.carbon_params)
    params, platform = params_from_proto(request.carbon_params)
    compute = carbon.request_carbon(
        duration_s=duration_s, energy_kwh=energy_kwh, ci_g_per_kwh=ci, mean_batch_size=batch,
        platform=platform, pue=params.pue,
    )
    storage_g = cache_embodied_g(
        allocated_bytes=request.cache_allocated_bytes, duration_s=duration_s,
        lifetime_s=params.ssd_lifetime_s, ssd_embodied_g_per_tb=params.ssd_embodied_g_per_tb,
    )
    return optimizer_pb2.EstimateCarbonResponse(
        carbon=breakdown_to_proto(
            operational_g=compute.operational_g, embodied_compute_g=compute.embodied_g,
            embodied_storage_g=storage_g, energy_kwh=energy_kwh, ci_g_per_kwh=ci,
        ),
        carbon_params=params_to_proto(params, platform),
    )


TRIGGERS = ("schedule", "ci_change", "slo_breach", "fleet_change", "forecast", "manual")


class OptimizerServicer(optimizer_pb2_grpc.OptimizerServiceServicer):
    """greenserve.v1.OptimizerService."""

    def __init__(self, ctx: ServiceContext, loop: OptimizerLoop) -> None:
        self.ctx = ctx
        self.loop = loop

    # -- plans ------------------------------------------------------------------------------------------

    async def ComputePlan(self, request: optimizer_pb2.ComputePlanRequest,
                          context: grpc.aio.ServicerContext) -> optimizer_pb2.ComputePlanResponse:
        trigger = request.trigger or "manual"
        if trigger not in TRIGGERS:
            raise InvalidArgument("trigger", f"must be one of {', '.join(TRIGGERS)}")
        weight = 1.0
        if request.HasField("carbon_weight_fraction"):
            weight = require_finite("carbon_weight_fraction", request.carbon_weight_fraction, minimum=0.0)
            if weight > 1.0:
                raise InvalidArgument("carbon_weight_fraction", "must be in [0, 1]")
        params = None
        if request.HasField("carbon_params"):
            _check_carbon_params(request.carbon_params)  # the documented ranges: else the plan's carbon may be inf
            params, _ = params_from_proto(request.carbon_params)
        async with self.loop.scheduler.lock:
            plan, solve_s = await self.loop.compute(
                trigger=trigger, horizon_hours=request.horizon_hours, params=params, carbon_weight_fraction=weight,
                dry_run=request.dry_run, hold=True if request.hold_for_approval else None)
        return optimizer_pb2.ComputePlanResponse(plan=plan, solve_s=solve_s)

    async def GetPlan(self, request: optimizer_pb2.GetPlanRequest,
                      context: grpc.aio.ServicerContext) -> optimizer_pb2.GetPlanResponse:
        _version("version", request.version)
        plan = await asyncio.to_thread(self.loop.plans.get, request.version)
        return optimizer_pb2.GetPlanResponse(plan=plan)

    async def ListPlans(self, request: optimizer_pb2.ListPlansRequest,
                        context: grpc.aio.ServicerContext) -> optimizer_pb2.ListPlansResponse:
        size = request.page_size or 50
        if not 1 <= size <= 1000:
            raise InvalidArgument("page_size", "must be in 1..1000 (0 means 50)")
        before = None
        if request.page_token:
            # ASCII digits only ('²'.isdigit() but int() refuses it) and a version, not a number SQLite overflows on
            if not (request.page_token.isascii() and request.page_token.isdigit() and len(request.page_token) <= 16
                    and int(request.page_token) <= 2**53):
                raise InvalidArgument("page_token", "is not a token ListPlans returned")
            before = int(request.page_token)
        plans, nxt = await asyncio.to_thread(self.loop.plans.list, size, before)
        return optimizer_pb2.ListPlansResponse(plans=plans, next_page_token="" if nxt is None else str(nxt))

    async def ActivatePlan(self, request: optimizer_pb2.ActivatePlanRequest,
                           context: grpc.aio.ServicerContext) -> optimizer_pb2.ActivatePlanResponse:
        _version("version", request.version)
        plan = await asyncio.to_thread(self.loop.plans.activate, request.version)
        return optimizer_pb2.ActivatePlanResponse(plan=plan)

    async def WatchPlans(self, request: optimizer_pb2.WatchPlansRequest,
                         context: grpc.aio.ServicerContext) -> AsyncIterator[optimizer_pb2.WatchPlansResponse]:
        _version("after_version", request.after_version)
        queue = self.loop.plans.subscribe()
        try:
            active = self.loop.plans.active
            sent = request.after_version
            if active is not None and active.version != sent:
                # After a rollback the plan in force may be older than what the watcher holds: send it anyway
                # when the watcher asked for "what is newer than v", the active plan IS the news.
                yield optimizer_pb2.WatchPlansResponse(plan=active)
                sent = active.version
            while True:
                plan = await queue.get()
                if plan is None:
                    return  # too slow: the client reconnects
                if plan.version != sent:
                    sent = plan.version
                    yield optimizer_pb2.WatchPlansResponse(plan=plan)
        finally:
            self.loop.plans.unsubscribe(queue)

    # -- fleet ------------------------------------------------------------------------------------------

    async def SetFleet(self, request: optimizer_pb2.SetFleetRequest,
                       context: grpc.aio.ServicerContext) -> optimizer_pb2.SetFleetResponse:
        fleet = await asyncio.to_thread(self.loop.fleet.set_declared, request.fleet)
        self.loop.fleet_changed()
        return optimizer_pb2.SetFleetResponse(fleet=fleet)

    async def GetFleet(self, request: optimizer_pb2.GetFleetRequest,
                       context: grpc.aio.ServicerContext) -> optimizer_pb2.GetFleetResponse:
        reply = optimizer_pb2.GetFleetResponse(fleet=self.loop.fleet.merged())
        if self.loop.fleet.updated_at is not None:
            reply.updated_at.FromDatetime(self.loop.fleet.updated_at)
        return reply

    async def ReportGpus(self, request: optimizer_pb2.ReportGpusRequest,
                         context: grpc.aio.ServicerContext) -> optimizer_pb2.ReportGpusResponse:
        fleet, changed = await asyncio.to_thread(self.loop.fleet.report_gpus, request)
        if changed:
            self.loop.fleet_changed()
        return optimizer_pb2.ReportGpusResponse(fleet=fleet)

    # -- enforcement --------------------------------------------------------------------------------------

    async def ReportEnforcement(self, request: optimizer_pb2.ReportEnforcementRequest,
                                context: grpc.aio.ServicerContext) -> optimizer_pb2.ReportEnforcementResponse:
        if not request.HasField("report"):
            raise InvalidArgument("report", "is required")
        await asyncio.to_thread(self.loop.plans.record_report, request.report)
        return optimizer_pb2.ReportEnforcementResponse()

    async def GetPlanStatus(self, request: optimizer_pb2.GetPlanStatusRequest,
                            context: grpc.aio.ServicerContext) -> optimizer_pb2.GetPlanStatusResponse:
        _version("version", request.version)
        return await asyncio.to_thread(plan_status, self.loop.plans, request.version)

    async def ReportAttainment(self, request: optimizer_pb2.ReportAttainmentRequest,
                               context: grpc.aio.ServicerContext) -> optimizer_pb2.ReportAttainmentResponse:
        return optimizer_pb2.ReportAttainmentResponse(replan_triggered=self.loop.report_attainment(request))

    async def EstimateCarbon(
        self, request: optimizer_pb2.EstimateCarbonRequest, context: grpc.aio.ServicerContext
    ) -> optimizer_pb2.EstimateCarbonResponse:
        return estimate_carbon(request)


def _version(field: str, value: int) -> None:
    if value > 2**53:
        raise InvalidArgument(field, "is not a plan version")


def plan_status(plans: PlanStore, version: int) -> optimizer_pb2.GetPlanStatusResponse:
    """The latest report of every component about a plan, and whether the fleet matches it."""
    plan = plans.get(version)
    reports = plans.reports(plan.version)
    reported = {(r.component, r.instance) for r in reports}
    expected = plans.previous_reporters(plan.version) | reported
    pending = sorted(f"{c}/{i}" if i else c for c, i in expected - reported)
    matches = bool(reports) and not pending and all(
        r.state == optimizer_pb2.ENFORCEMENT_STATE_APPLIED for r in reports)
    return optimizer_pb2.GetPlanStatusResponse(plan=summary(plan), reports=reports, fleet_matches_plan=matches,
                                               pending_components=pending)


def mig_options(settings: OptimizerSettings) -> dict[str, Any]:
    return {"change_s": settings.mig_change_s, "max_ged_per_hour": settings.mig_max_ged_per_hour or None,
            "max_accuracy_loss_fraction": settings.mig_max_accuracy_loss_fraction or None,
            "resolve_change_fraction": settings.mig_resolve_change_fraction,
            "time_budget_s": 0.8 * settings.solver_timeout_s}


async def build(ctx: ServiceContext) -> list[Registration]:
    settings = ctx.settings
    assert isinstance(settings, OptimizerSettings)
    forecaster = create_channel(settings.channel_config(settings.forecaster_addr))
    profiler = create_channel(settings.channel_config(settings.profiler_addr))
    cache_manager = create_channel(settings.channel_config(settings.cache_manager_addr))
    loop = OptimizerLoop(
        db=ctx.db, forecaster=forecaster, profiler=profiler, cache_manager=cache_manager, params=load_default_params(),
        hold_plans=settings.hold_plans, horizon_hours=settings.plan_horizon_hours, lead_s=settings.plan_lead_s,
        debounce_s=settings.plan_debounce_s, schedule=settings.schedule_plans,
        ci_change_fraction=settings.ci_change_fraction, monitor_interval_s=settings.ci_monitor_interval_s,
        forecast_max_age_s=settings.forecast_max_age_s, solver_timeout_s=settings.solver_timeout_s,
        ci_signal=common_pb2.CARBON_SIGNAL_LIFECYCLE if settings.ci_signal == "lifecycle"
        else common_pb2.CARBON_SIGNAL_DIRECT,
        solvers=default_solvers(settings.routing_headroom_fraction, settings.routing_load,
                                cache=settings.cache_solver, cache_per_hour_slo=settings.cache_slo_per_hour,
                                cache_kareto_ttl_max_s=settings.cache_kareto_ttl_max_s,
                                mig=settings.mig_solver, mig_options=mig_options(settings),
                                modes=settings.modes_solver, planner=settings.planner,
                                attainment_floor_fraction=settings.attainment_floor_fraction),
        slo_breach_cooldown_s=settings.slo_breach_cooldown_s, forecast_timeout_s=settings.forecast_timeout_s,
        ci_change_confirm_checks=settings.ci_change_confirm_checks, ci_change_cooldown_s=settings.ci_change_cooldown_s,
    )
    await loop.start()

    async def stop() -> None:
        await loop.stop()
        await forecaster.close()
        await profiler.close()
        await cache_manager.close()

    ctx.on_stop.append(stop)
    return [registration(optimizer_pb2, optimizer_pb2_grpc, "OptimizerService", OptimizerServicer(ctx, loop))]
