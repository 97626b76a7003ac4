"""Fault 7 of issue 36: flapping input. CI or load oscillating around a re-plan threshold does not re-plan per sample.

A forecaster and an optimizer (in this process, over gRPC) on a virtual clock stepped 15 minutes at a time, the CI
monitor's look (``OptimizerLoop.monitor_once``, what its timer runs) at each step. The CI history is flat at 100
g/kWh (so every forecast, and every plan, assumes 100 for the hours ahead); each new hour gets a measured value:

* A, across the band's edge: 106.5 and 103.5 in turn (6.5 % and 3.5 % off, the threshold 5 %): before, every
  sample above the threshold re-planned (3 in 6 hours); now none (never beyond in two consecutive samples);
* B, hovering at the threshold: 105.4 and 104.6 in turn: one move, one re-plan (before: 3), hysteresis;
* C, back to 100, then a persistent move to 106.5 for 3 hours: one re-plan at its second sample (before: 3);
* D, a jump to 130: a re-plan at its first look.

And the load: a router reporting attainment just under and just over its pool's target every 5 minutes for an
hour re-plans at most once per --slo-breach-cooldown-s, not at every breaching report.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from greenserve.common.clock import VirtualClock, hour_floor_s, now_s, set_clock
from greenserve.forecaster.service import build as build_forecaster
from greenserve.forecaster.settings import ForecasterSettings
from greenserve.optimizer.service import OptimizerSettings
from greenserve.optimizer.service import build as build_optimizer
from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc, optimizer_pb2, optimizer_pb2_grpc

from tests.optimizer.conftest import ci_ref, engine, load_ref, pool

from .conftest import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

THRESHOLD = 0.05


async def flat_history(stub, ref: common_pb2.SeriesRef, value: float, end_s: float) -> None:
    points = []
    for h in range(4 * 24):
        point = common_pb2.TimeSeriesPoint(value=value)
        point.time.FromSeconds(int(end_s - (4 * 24 - 1 - h) * 3600))
        points.append(point)
    await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(series=ref, resolution_s=3600, points=points))


@pytest.fixture
def restore_clock():
    previous = set_clock(VirtualClock(now_s(), 1.0))
    set_clock(previous)
    yield
    set_clock(previous)


async def test_ci_oscillating_around_the_threshold_does_not_replan_per_sample(start_inprocess,
                                                                               restore_clock) -> None:
    h0 = hour_floor_s(now_s())
    forecaster = await start_inprocess(ForecasterSettings, build_forecaster, forecast_model="seasonal_naive",
                                       log_level="WARNING")
    fc = forecaster_pb2_grpc.ForecasterServiceStub(grpc.aio.insecure_channel(forecaster.address))
    await flat_history(fc, ci_ref("FR"), 100.0, h0)
    await flat_history(fc, load_ref("chat"), 1.0, h0)
    optimizer = await start_inprocess(
        OptimizerSettings, build_optimizer, forecaster_addr=forecaster.address, profiler_addr="127.0.0.1:9",
        cache_manager_addr="127.0.0.1:9", cache_solver="keep", mig_solver="keep", modes_solver="keep",
        plan_lead_s=0, plan_debounce_s=0.05, ci_monitor_interval_s=0, plan_horizon_hours=24,
        ci_change_fraction=THRESHOLD, log_level="WARNING")
    loop = optimizer.server.registrations[0].servicer.loop
    stub = optimizer_pb2_grpc.OptimizerServiceStub(grpc.aio.insecure_channel(optimizer.address))
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(
        pools=[pool("chat", [engine("e1"), engine("e2")])])))
    await until(lambda: loop.scheduler.computed >= 1, 60, "the plan of the fleet")

    hour = 0

    async def hours(values: list[float]) -> tuple[int, int]:
        """Each value measured in the next hour, looked at 4 times in it; (re-plans, samples beyond the threshold,
        the re-plans a bare threshold made: one per such sample)."""
        nonlocal hour
        replans = beyond = 0
        for value in values:
            hour += 1
            at = h0 + hour * 3600
            point = common_pb2.TimeSeriesPoint(value=value)
            point.time.FromSeconds(int(at))
            await fc.IngestPoints(forecaster_pb2.IngestPointsRequest(series=ci_ref("FR"), resolution_s=3600,
                                                                     points=[point]))
            beyond += abs(value - 100.0) / 100.0 > THRESHOLD
            for minute in (5, 20, 35, 50):
                set_clock(VirtualClock(at + minute * 60, 1.0))
                before = loop.scheduler.computed
                if await loop.monitor_once():
                    replans += 1
                    await until(lambda before=before: loop.scheduler.computed > before, 60, "the re-plan asked for")
        return replans, beyond

    replans, beyond = await hours([106.5, 103.5] * 3)  # A
    assert (replans, beyond) == (0, 3)
    replans, beyond = await hours([105.4, 104.6] * 3)  # B
    assert (replans, beyond) == (1, 3)
    replans, beyond = await hours([100.0, 100.0, 106.5, 106.5, 106.5])  # C
    assert (replans, beyond) == (1, 3)
    replans, _ = await hours([130.0])  # D
    assert replans == 1
    plans = (await stub.ListPlans(optimizer_pb2.ListPlansRequest())).plans
    assert sum(p.trigger in ("ci_change", "forecast") for p in plans) == 3, [p.trigger for p in plans]


async def test_attainment_flapping_around_the_target_replans_once_per_cooldown(start_inprocess, restore_clock) -> None:
    h0 = hour_floor_s(now_s())
    forecaster = await start_inprocess(ForecasterSettings, build_forecaster, forecast_model="seasonal_naive",
                                       log_level="WARNING")
    fc = forecaster_pb2_grpc.ForecasterServiceStub(grpc.aio.insecure_channel(forecaster.address))
    await flat_history(fc, ci_ref("FR"), 100.0, h0)
    await flat_history(fc, load_ref("chat"), 1.0, h0)
    cooldown_s = 900.0
    optimizer = await start_inprocess(
        OptimizerSettings, build_optimizer, forecaster_addr=forecaster.address, profiler_addr="127.0.0.1:9",
        cache_manager_addr="127.0.0.1:9", cache_solver="keep", mig_solver="keep", modes_solver="keep",
        plan_lead_s=0, plan_debounce_s=0.05, ci_monitor_interval_s=0, plan_horizon_hours=6,
        slo_breach_cooldown_s=cooldown_s, log_level="WARNING")
    loop = optimizer.server.registrations[0].servicer.loop
    stub = optimizer_pb2_grpc.OptimizerServiceStub(grpc.aio.insecure_channel(optimizer.address))
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(
        pools=[pool("chat", [engine("e1"), engine("e2")])])))
    await until(lambda: loop.scheduler.computed >= 1, 60, "the plan of the fleet")
    target = 0.9
    triggered = breaching = 0
    for i in range(12):  # a report every 5 minutes for an hour, just under and just over the target in turn
        set_clock(VirtualClock(h0 + 3600 + i * 300, 1.0))
        attainment = target - 0.01 if i % 2 == 0 else target + 0.01
        breaching += attainment < target
        report = optimizer_pb2.PoolAttainment(pool="chat", window_s=300, requests=500, attainment_fraction=attainment)
        reply = await stub.ReportAttainment(optimizer_pb2.ReportAttainmentRequest(instance="r1", pools=[report]))
        triggered += reply.replan_triggered
    # breaching reports at 0, 10, ..., 50 min; with a 15 min cooldown those at 0, 20 and 40 min re-plan
    assert (breaching, triggered) == (6, 3)
    await until(lambda: loop.scheduler.computed >= 2, 60, "the SLO re-plan")
    await asyncio.sleep(0.2)
    plans = (await stub.ListPlans(optimizer_pb2.ListPlansRequest())).plans
    assert 1 <= sum(p.trigger == "slo_breach" for p in plans) <= triggered
