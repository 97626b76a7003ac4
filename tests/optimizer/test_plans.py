"""Plans end to end inside the optimizer: fleet, ComputePlan, activation, rollback, watchers, status, errors."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc

from tests.optimizer.conftest import ci_ref, engine, ingest_daily, load_ref, pool


async def _setup(forecaster, optimizer, **overrides):
    fc_channel = grpc.aio.insecure_channel(forecaster.address)
    await ingest_daily(fc_channel, ci_ref("FR"), 50.0, 20.0)
    await ingest_daily(fc_channel, load_ref("chat"), 2.0, 1.0)
    running = await optimizer(**overrides)
    channel = grpc.aio.insecure_channel(running.address)
    return running, optimizer_pb2_grpc.OptimizerServiceStub(channel), fc_channel


FLEET = common_pb2.FleetInventory(pools=[pool("chat", [engine("a100", "A100-80GB"),
                                                       engine("mig", "A100-80GB-MIG-3g.40gb")])])


async def test_compute_activate_rollback_and_watch(forecaster, optimizer) -> None:
    _, stub, _ = await _setup(forecaster, optimizer, schedule_plans=False)
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=FLEET))
    watch = stub.WatchPlans(optimizer_pb2.WatchPlansRequest())
    first = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=6))).plan
    assert first.version == 1 and first.state == common_pb2.PLAN_STATE_ACTIVE
    assert len(first.intervals) == 6
    iv = first.intervals[0]
    weights = {w.engine_id: w.weight for w in iv.routing_weights}
    assert set(weights) == {"a100", "mig"} and abs(sum(weights.values()) - 1) < 1e-6
    # The whole A100 spends less energy per request than the 3g slice: it gets the load first.
    assert weights["a100"] > weights["mig"]
    assert iv.pools[0].capacity_requests_per_s > 0 and iv.expected_carbon.total_g > 0
    assert 0 < first.expected_slo_attainment_fraction <= 1
    assert "pool chat:" in first.explanation and "predicted by the simulator" in first.explanation
    assert {o.knob for o in first.solver_outcomes} == {"routing_weights", "cache_targets", "mig_layouts",
                                                       "serving_modes", "engine_runs", "gpu_power"}
    got = await asyncio.wait_for(watch.read(), 5)
    assert got.plan.version == 1
    second = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=6))).plan
    assert second.version == 2 and second.previous_version == 1
    assert (await asyncio.wait_for(watch.read(), 5)).plan.version == 2
    listed = (await stub.ListPlans(optimizer_pb2.ListPlansRequest(page_size=1))).plans
    assert [p.version for p in listed] == [2] and not listed[0].intervals
    # Rollback: activating v1 puts it in force and watchers get it.
    rolled = (await stub.ActivatePlan(optimizer_pb2.ActivatePlanRequest(version=1))).plan
    assert rolled.version == 1 and rolled.state == common_pb2.PLAN_STATE_ACTIVE
    assert (await asyncio.wait_for(watch.read(), 5)).plan.version == 1
    assert (await stub.GetPlan(optimizer_pb2.GetPlanRequest(version=2))).plan.state == common_pb2.PLAN_STATE_SUPERSEDED
    assert (await stub.GetPlan(optimizer_pb2.GetPlanRequest())).plan.version == 1
    watch.cancel()


async def test_hold_for_approval_and_status(forecaster, optimizer) -> None:
    _, stub, _ = await _setup(forecaster, optimizer, schedule_plans=False, hold_plans=True)
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=FLEET))
    plan = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2))).plan
    assert plan.state == common_pb2.PLAN_STATE_PROPOSED
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetPlan(optimizer_pb2.GetPlanRequest())
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    await stub.ActivatePlan(optimizer_pb2.ActivatePlanRequest(version=plan.version))
    report = optimizer_pb2.EnforcementReport(component="router", instance="r1", plan_version=plan.version,
                                             state=optimizer_pb2.ENFORCEMENT_STATE_APPLIED, detail="weights")
    await stub.ReportEnforcement(optimizer_pb2.ReportEnforcementRequest(report=report))
    report2 = optimizer_pb2.EnforcementReport(component="cache-manager", instance="c1", plan_version=plan.version,
                                              state=optimizer_pb2.ENFORCEMENT_STATE_FAILED, detail="LMCache down")
    await stub.ReportEnforcement(optimizer_pb2.ReportEnforcementRequest(report=report2))
    status = await stub.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest())
    assert {(r.component, r.state) for r in status.reports} == {
        ("router", optimizer_pb2.ENFORCEMENT_STATE_APPLIED), ("cache-manager", optimizer_pb2.ENFORCEMENT_STATE_FAILED)}
    assert not status.fleet_matches_plan
    # A newer plan: the components that enforced v1 are pending on it until they report.
    held = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2, hold_for_approval=False))).plan
    await stub.ActivatePlan(optimizer_pb2.ActivatePlanRequest(version=held.version))
    status = await stub.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest())
    assert status.pending_components == ["cache-manager/c1", "router/r1"] and not status.fleet_matches_plan
    for comp, inst in (("router", "r1"), ("cache-manager", "c1")):
        await stub.ReportEnforcement(optimizer_pb2.ReportEnforcementRequest(report=optimizer_pb2.EnforcementReport(
            component=comp, instance=inst, plan_version=held.version, state=optimizer_pb2.ENFORCEMENT_STATE_APPLIED)))
    assert (await stub.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest())).fleet_matches_plan


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda f: f.pools[0].slo.__setattr__("tpot_s", float("nan")), "fleet.pools[0].slo.tpot_s"),
    (lambda f: f.pools.add().CopyFrom(f.pools[0]), "fleet.pools[1].name"),
    (lambda f: f.pools[0].__setattr__("name", "chat\n"), "fleet.pools[0].name"),
    (lambda f: f.pools[0].engines[0].__setattr__("gpu_uuid", "GPU-unknown"), "fleet.pools[0].engines[0].gpu_uuid"),
    (lambda f: f.gpus.add(uuid="GPU-1", pool="nope"), "fleet.gpus[0].pool"),
    (lambda f: f.pools[0].engines[0].__setattr__("model_variant", "int4"), "fleet.pools[0].engines[0].model_variant"),
])
async def test_bad_fleet_is_refused_naming_the_field(forecaster, optimizer, mutate, field) -> None:
    _, stub, _ = await _setup(forecaster, optimizer, schedule_plans=False)
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=FLEET))
    bad = common_pb2.FleetInventory()
    bad.CopyFrom(FLEET)
    mutate(bad)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=bad))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()
    assert (await stub.GetFleet(optimizer_pb2.GetFleetRequest())).fleet == FLEET  # unchanged


async def test_reported_gpus_merge_and_conflict(forecaster, optimizer) -> None:
    _, stub, _ = await _setup(forecaster, optimizer, schedule_plans=False)
    gpu = common_pb2.Gpu(uuid="GPU-a", model=common_pb2.GPU_MODEL_A100_80GB, mig_enabled=True,
                         instances=[common_pb2.MigInstance(uuid="MIG-1", profile="3g.40gb")])
    await stub.ReportGpus(optimizer_pb2.ReportGpusRequest(node="n1", gpus=[gpu]))
    fleet = common_pb2.FleetInventory()
    fleet.CopyFrom(FLEET)
    fleet.gpus.add(uuid="GPU-a", pool="chat")
    fleet.pools[0].engines[1].gpu_uuid = "GPU-a"
    merged = (await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=fleet))).fleet
    (g,) = merged.gpus
    assert g.pool == "chat" and g.node == "n1" and g.reported_by == "gpu-partitioner/n1" and g.mig_enabled
    fleet.gpus[0].node = "n2"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=fleet))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "fleet.gpus[0].node" in err.value.details()
    # every layout of the GPU names its node: that node's partitioner knows it as its own even once NVML loses it
    plan = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2))).plan
    layouts = [m for interval in plan.intervals for m in interval.mig_layouts]
    assert len(layouts) == 2 and {(m.gpu_uuid, m.node) for m in layouts} == {("GPU-a", "n1")}, layouts


async def test_forecaster_down_plans_on_stale_forecasts_then_makes_the_safe_plan(forecaster, optimizer) -> None:
    """Up to --forecast-max-age-s the plan is made on the cached forecasts, their age stated; past it (issue 36:
    it was refused, leaving whatever the last plan did in force, e.g. engines unloaded on a low forecast) the
    plan is the safe plan: every engine weighted equally, and the explanation opens with it."""
    running, stub, _ = await _setup(forecaster, optimizer, schedule_plans=False, forecast_max_age_s=3600)
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=FLEET))
    await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=3))
    await forecaster.server.stop(0)
    plan = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=3))).plan
    assert any("stale" in note for note in plan.input_notes) and "stale" in plan.explanation
    assert {f.source for f in plan.forecasts} == {"cache"} and "SAFE PLAN" not in plan.explanation
    # Older than the maximum age: the safe plan.
    from greenserve.common.clock import VirtualClock, set_clock
    import time

    previous = set_clock(VirtualClock(time.time() + 7200, 1.0))
    try:
        safe = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=3))).plan
    finally:
        set_clock(previous)
    assert safe.explanation.startswith("SAFE PLAN:"), safe.explanation
    assert {f.source for f in safe.forecasts} == {"expired"} and all(f.stale_s > 3600 for f in safe.forecasts)
    engines = {e.id for p in FLEET.pools for e in p.engines}
    for interval in safe.intervals:
        assert {w.engine_id for w in interval.routing_weights} == engines
        assert len({w.weight for w in interval.routing_weights}) == 1
    routing = next(o for o in safe.solver_outcomes if o.knob == "routing_weights")
    assert routing.solver == "routing_weights.even"
    del running


async def test_failing_solver_keeps_its_knob(forecaster, optimizer) -> None:
    running, stub, _ = await _setup(forecaster, optimizer, schedule_plans=False)
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=FLEET))
    first = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2))).plan
    servicer_loop = next(r.servicer for r in running.server.registrations).loop

    class Broken:
        knob, name = "routing_weights", "routing_weights.broken"

        def solve(self, inputs):
            raise RuntimeError("solver exploded")

    servicer_loop.planner.solvers[0] = Broken()
    plan = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2))).plan
    outcome = next(o for o in plan.solver_outcomes if o.knob == "routing_weights")
    assert outcome.status == "failed" and "solver exploded" in outcome.detail
    assert list(plan.intervals[0].routing_weights) == list(first.intervals[0].routing_weights)
    assert "failed" in plan.explanation


async def test_bad_requests_are_invalid_argument(forecaster, optimizer) -> None:
    _, stub, _ = await _setup(forecaster, optimizer, schedule_plans=False)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ComputePlan(optimizer_pb2.ComputePlanRequest())
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "no pools" in err.value.details()
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=FLEET))
    for request, field in ((optimizer_pb2.ComputePlanRequest(horizon_hours=500), "horizon_hours"),
                           (optimizer_pb2.ComputePlanRequest(trigger="whim"), "trigger"),
                           (optimizer_pb2.ComputePlanRequest(carbon_weight_fraction=2.0), "carbon_weight_fraction")):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ComputePlan(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ActivatePlan(optimizer_pb2.ActivatePlanRequest(version=7))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ReportEnforcement(optimizer_pb2.ReportEnforcementRequest(report=optimizer_pb2.EnforcementReport(
            component="toaster", plan_version=1, state=optimizer_pb2.ENFORCEMENT_STATE_APPLIED)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "report.component" in err.value.details()


def _loop(running):
    return next(r.servicer for r in running.server.registrations).loop


async def test_slo_breach_report_triggers_a_new_plan(forecaster, optimizer) -> None:
    running, stub, _ = await _setup(forecaster, optimizer, plan_lead_s=0, slo_breach_cooldown_s=3600)
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=FLEET))
    ok = optimizer_pb2.PoolAttainment(pool="chat", window_s=300, requests=500, attainment_fraction=0.95)
    assert not (await stub.ReportAttainment(optimizer_pb2.ReportAttainmentRequest(instance="r", pools=[ok]))).replan_triggered
    few = optimizer_pb2.PoolAttainment(pool="chat", window_s=300, requests=3, attainment_fraction=0.1)
    assert not (await stub.ReportAttainment(optimizer_pb2.ReportAttainmentRequest(instance="r", pools=[few]))).replan_triggered
    assert _loop(running).capacity_derate == {}  # no breach yet: the predicted capacity counts whole
    bad = optimizer_pb2.PoolAttainment(pool="chat", window_s=300, requests=500, attainment_fraction=0.7)
    assert (await stub.ReportAttainment(optimizer_pb2.ReportAttainmentRequest(instance="r", pools=[bad]))).replan_triggered
    # The breach derates the capacity the next plans count (the model promised more than the engines gave) ...
    assert _loop(running).capacity_derate == {"chat": pytest.approx(0.85)}
    # ... and within the cooldown a second breach neither re-plans nor derates again.
    assert not (await stub.ReportAttainment(optimizer_pb2.ReportAttainmentRequest(instance="r", pools=[bad]))).replan_triggered
    assert _loop(running).capacity_derate == {"chat": pytest.approx(0.85)}
    # A good report within the hour after the breach wins nothing back yet.
    great = optimizer_pb2.PoolAttainment(pool="chat", window_s=300, requests=500, attainment_fraction=1.0)
    await stub.ReportAttainment(optimizer_pb2.ReportAttainmentRequest(instance="r", pools=[great]))
    assert _loop(running).capacity_derate == {"chat": pytest.approx(0.85)}
    for _ in range(200):
        plans = (await stub.ListPlans(optimizer_pb2.ListPlansRequest())).plans
        if any(p.trigger == "slo_breach" for p in plans):
            break
        await asyncio.sleep(0.05)
    assert any(p.trigger == "slo_breach" for p in plans), [p.trigger for p in plans]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ReportAttainment(optimizer_pb2.ReportAttainmentRequest(pools=[optimizer_pb2.PoolAttainment(
            pool="chat", window_s=300, requests=5, attainment_fraction=float("nan"))]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "pools[0].attainment_fraction" in err.value.details()
    del running


async def test_ci_moving_more_than_5_percent_from_the_plan_triggers(forecaster, optimizer) -> None:
    from greenserve.common.clock import hour_floor_s, now_s
    from greenserve.v1 import forecaster_pb2, forecaster_pb2_grpc

    running, stub, fc_channel = await _setup(forecaster, optimizer, schedule_plans=False)
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=FLEET))
    plan = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=3))).plan
    loop = _loop(running)
    assert await loop.check_ci() is None  # the actual CI is what the plan assumed (seasonal naive: yesterday's)
    assumed = plan.intervals[0].pools[0].ci_g_per_kwh
    point = common_pb2.TimeSeriesPoint(value=assumed * 1.5)
    point.time.FromSeconds(int(hour_floor_s(now_s()) + 3600))
    await forecaster_pb2_grpc.ForecasterServiceStub(fc_channel).IngestPoints(forecaster_pb2.IngestPointsRequest(
        series=ci_ref("FR"), resolution_s=3600, points=[point], source="test"))
    from greenserve.common.clock import VirtualClock, set_clock

    previous = set_clock(VirtualClock(hour_floor_s(now_s()) + 3600 + 60, 1.0))
    try:
        assert await loop.check_ci() in ("ci_change", "forecast")
    finally:
        set_clock(previous)


async def test_an_instance_that_is_gone_is_pending_on_the_next_plan_only(forecaster, optimizer) -> None:
    """A router replica is named after its pod: a rollout renames every replica. The old names were expected on every
    later plan for ever (any instance that had ever reported), so the fleet never matched a plan again."""
    _, stub, _ = await _setup(forecaster, optimizer, schedule_plans=False)
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=FLEET))

    async def plan_with(*instances: str) -> optimizer_pb2.GetPlanStatusResponse:
        version = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2))).plan.version
        for instance in instances:
            await stub.ReportEnforcement(optimizer_pb2.ReportEnforcementRequest(report=optimizer_pb2.EnforcementReport(
                component="router", instance=instance, plan_version=version,
                state=optimizer_pb2.ENFORCEMENT_STATE_APPLIED)))
        return await stub.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest(version=version))

    assert (await plan_with("router-7d9f-a", "router-7d9f-b")).fleet_matches_plan
    rolled = await plan_with("router-5c2e-a", "router-5c2e-b")  # the rollout: new pod names
    assert rolled.pending_components == ["router/router-7d9f-a", "router/router-7d9f-b"]
    assert not rolled.fleet_matches_plan
    settled = await plan_with("router-5c2e-a", "router-5c2e-b")
    assert settled.pending_components == [] and settled.fleet_matches_plan
    # one replica down for a plan: pending on it; and a later plan without any report still expects the live ones
    down = await plan_with("router-5c2e-a")
    assert down.pending_components == ["router/router-5c2e-b"]
    silent = await plan_with()
    assert silent.pending_components == ["router/router-5c2e-a"] and not silent.fleet_matches_plan
