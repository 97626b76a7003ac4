"""Fault 3 of issue 36: the forecaster late, then down, at planning time, then back.

Real processes: the forecaster runs in its own process (stopped with SIGSTOP: late; killed with SIGKILL: down;
started again on its database: back); the optimizer and a router following its plans run in this process with
two emulated engines. What must hold at every step:

* the fleet keeps serving: requests through the router are answered, on the plan in force;
* late (no answer within --forecast-timeout-s): the plan is made on the cached forecasts within the timeout, and
  says so: every forecast it names is source "cache" with its age, and the explanation opens with the stale
  forecasts;
* down past --forecast-max-age-s: the plan is the safe plan (every engine awake and weighted equally, BASE-like
  capacity; the explanation opens with "SAFE PLAN:"), applied by the router;
* back: the CI monitor sees that the plan in force was made on cached forecasts and re-plans on fresh ones
  (trigger "forecast") with no operator call; the router converges to that plan and reports it applied.
"""

from __future__ import annotations

import asyncio
import signal
import time

import grpc
import pytest
from greenserve.optimizer.service import OptimizerSettings
from greenserve.optimizer.service import build as build_optimizer
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc, router_pb2

from tests.conftest import free_port
from tests.forecaster.process import start_forecaster
from tests.optimizer.conftest import ci_ref, ingest_daily, load_ref

from .conftest import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TIMEOUT_S = 1.0  # --forecast-timeout-s
MAX_AGE_S = 4.0  # --forecast-max-age-s
SLO = common_pb2.Slo(ttft_s=2.0, tpot_s=0.2, attainment_fraction=0.9)


async def serve_some(handle, version: int, n: int = 4) -> None:
    """``n`` requests through the router, each answered, routed on plan ``version``."""
    request = router_pb2.RequestDescriptor(pool="chat", completion=router_pb2.CompletionInput(prompt="hello"))
    for _ in range(n):
        route = await handle.stub.Route(router_pb2.RouteRequest(request=request), timeout=10)
        assert route.plan_version == version
        chunks = [c async for c in handle.stub.Generate(router_pb2.GenerateRequest(
            request=request, sampling=router_pb2.SamplingParams(max_tokens=4)), timeout=20)]
        assert chunks and chunks[-1].finish_reason


async def test_forecaster_late_then_down_then_back(tmp_path, start_inprocess, emulators, router) -> None:
    fc_port = free_port()
    env = {"GREENSERVE_FORECAST_MODEL": "seasonal_naive"}
    forecaster = await asyncio.to_thread(start_forecaster, tmp_path / "forecaster", fc_port, **env)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{fc_port}") as fc:
            await ingest_daily(fc, ci_ref("FR"), 60.0, 25.0)
            await ingest_daily(fc, load_ref("chat"), 0.3, 0.1)
        engines = await emulators(2)
        opt_port = free_port()
        handle = await router(engines=[e.url for e in engines], watch_plans=True, optimizer_addr=f"127.0.0.1:{opt_port}",
                              default_pool="chat")
        optimizer = await start_inprocess(
            OptimizerSettings, build_optimizer, port=opt_port, forecaster_addr=f"127.0.0.1:{fc_port}",
            profiler_addr="127.0.0.1:9", cache_manager_addr="127.0.0.1:9", cache_solver="keep", mig_solver="keep",
            modes_solver="keep", plan_lead_s=0, plan_debounce_s=0.05, ci_monitor_interval_s=0.5,
            forecast_timeout_s=TIMEOUT_S, forecast_max_age_s=MAX_AGE_S, plan_horizon_hours=3, log_level="WARNING")
        stub = optimizer_pb2_grpc.OptimizerServiceStub(grpc.aio.insecure_channel(optimizer.address))
        listed = (await handle.stub.ListEngines(router_pb2.ListEnginesRequest())).engines
        pool = common_pb2.Pool(name="chat", model="meta-llama/Meta-Llama-3-8B-Instruct", region="FR", slo=SLO)
        for status in listed:
            pool.engines.add(id=status.engine.id, url=status.engine.url, hardware="A100-80GB")
        engine_ids = {e.id for e in pool.engines}
        await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(pools=[pool])))

        async def in_force(version: int) -> None:
            await until(lambda: handle.core.plans.version == version, 20, f"the router on plan v{version}")
            await serve_some(handle, version)

        async def planned() -> bool:  # SetFleet asks for a plan (trigger fleet_change)
            try:
                return (await stub.GetPlan(optimizer_pb2.GetPlanRequest())).plan.version > 0
            except grpc.aio.AioRpcError:
                return False

        await until(planned, 30, "the plan of the new fleet")
        fresh = (await stub.GetPlan(optimizer_pb2.GetPlanRequest())).plan
        assert {f.source for f in fresh.forecasts} == {"forecaster"}
        assert "SAFE PLAN" not in fresh.explanation
        assert all(o.solver != "routing_weights.even" for o in fresh.solver_outcomes)  # the configured planner
        await in_force(fresh.version)

        # late: the forecaster stops answering; the plan is made on the cache within the timeout, ages stated
        forecaster.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        late = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(), timeout=60)).plan
        took = time.monotonic() - t0
        assert took < TIMEOUT_S + 5.0, f"planning with a late forecaster took {took:.1f} s"
        assert {f.source for f in late.forecasts} == {"cache"}
        assert all(0 < f.stale_s <= MAX_AGE_S for f in late.forecasts), [f.stale_s for f in late.forecasts]
        assert late.explanation.startswith("stale forecasts:"), late.explanation
        assert any("DEADLINE_EXCEEDED" in note for note in late.input_notes), late.input_notes
        await in_force(late.version)

        # down, past the age a plan may use: the safe plan, applied
        forecaster.send_signal(signal.SIGKILL)
        forecaster.wait(10)
        await asyncio.sleep(MAX_AGE_S)
        safe = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(), timeout=60)).plan
        assert safe.explanation.startswith("SAFE PLAN:"), safe.explanation
        assert {f.source for f in safe.forecasts} == {"expired"}
        assert all(f.stale_s > MAX_AGE_S for f in safe.forecasts)
        for interval in safe.intervals:
            weights = {w.engine_id: w.weight for w in interval.routing_weights}
            assert set(weights) == engine_ids and len(set(weights.values())) == 1, weights
            assert not interval.engine_runs and not interval.gpu_power  # every engine awake, default clocks
        assert {o.solver for o in safe.solver_outcomes if o.knob == "routing_weights"} == {"routing_weights.even"}
        await in_force(safe.version)
        assert handle.core.plans.weights_for("chat")[0] is not None

        # back: no operator call; the CI monitor re-plans on fresh forecasts and the router follows
        forecaster = await asyncio.to_thread(start_forecaster, tmp_path / "forecaster", fc_port, **env)

        async def replanned() -> bool:
            plan = (await stub.GetPlan(optimizer_pb2.GetPlanRequest())).plan
            return plan.version > safe.version and {f.source for f in plan.forecasts} == {"forecaster"}

        await until(replanned, 60, "a plan on fresh forecasts after the forecaster's return", every_s=0.3)
        back = (await stub.GetPlan(optimizer_pb2.GetPlanRequest())).plan
        assert back.trigger == "forecast" and "SAFE PLAN" not in back.explanation
        await in_force(back.version)

        async def reported() -> bool:
            status = await stub.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest(version=back.version))
            return any(r.component == "router" and r.state == optimizer_pb2.ENFORCEMENT_STATE_APPLIED
                       for r in status.reports)

        await until(reported, 20, "the router's APPLIED report of the plan made after the return")
        # one plan per step and one on the return (and the hourly one if the test crossed an hour): no loop
        plans = (await stub.ListPlans(optimizer_pb2.ListPlansRequest())).plans
        triggers = [p.trigger for p in sorted(plans, key=lambda p: p.version) if p.trigger != "schedule"]
        assert triggers == ["fleet_change", "manual", "manual", "forecast"], triggers
    finally:
        if forecaster.poll() is None:
            forecaster.send_signal(signal.SIGCONT)
            forecaster.kill()
            forecaster.wait()
