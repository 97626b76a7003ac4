"""Issue 35: one CI per hour feeds the plan, the forecast and the receipt.

`greenserve up` seeds the forecaster with history and asks for the first plan at once, while the forecaster's first
fit of the series still runs. The optimizer then planned on the forecaster's stand-in (seasonal naive: yesterday's
value of each hour, 64.9 g/kWh for the hour the fit put at 129.7), and every later reader (`forecast get`, the
router's receipts) saw the fit's value. Here the plan is asked for right after the ingest, as `up` does, and its
hour must carry the CI the forecast and the router's receipt source give for that hour; the plan names the forecast.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from greenserve.common.clock import hour_floor_s
from greenserve.optimizer.service import OptimizerSettings
from greenserve.optimizer.service import build as build_optimizer
from greenserve.router.accounting.receipt import CarbonIntensityCache
from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc, optimizer_pb2, optimizer_pb2_grpc
from greenserve_client.local_loop import demo_history

from tests.optimizer.conftest import ForecasterSettings, build_forecaster, ci_ref, engine, load_ref, pool


def _points(values: list[tuple[float, float]]) -> list[common_pb2.TimeSeriesPoint]:
    out = []
    for t, v in values:
        p = common_pb2.TimeSeriesPoint(value=v)
        p.time.FromSeconds(int(t))
        out.append(p)
    return out


@pytest.mark.slow
async def test_first_plan_forecast_and_receipt_agree_on_the_hour(start_inprocess) -> None:
    if time.time() - hour_floor_s(time.time()) > 3600 - 90:  # the three readers must see the same hour
        await asyncio.sleep(3600 - (time.time() - hour_floor_s(time.time())) + 1)
    # The forecaster as `greenserve up` runs it: its default model (an ensemble, fitted in a worker process).
    forecaster = await start_inprocess(ForecasterSettings, build_forecaster)
    optimizer = await start_inprocess(OptimizerSettings, build_optimizer, forecaster_addr=forecaster.address,
                                      profiler_addr="127.0.0.1:9", cache_manager_addr="127.0.0.1:9",
                                      schedule_plans=False, ci_monitor_interval_s=0, cache_solver="keep",
                                      mig_solver="keep", log_level="WARNING")
    async with grpc.aio.insecure_channel(forecaster.address) as fc, \
            grpc.aio.insecure_channel(optimizer.address) as oc:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(fc)
        opt = optimizer_pb2_grpc.OptimizerServiceStub(oc)
        ci, load = demo_history(time.time())  # the shipped ES history, its last hour the one before now
        ingested = time.time()
        await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(series=ci_ref("ES"), resolution_s=3600,
                                                                   points=_points(ci), source="test"))
        await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(
            series=load_ref("chat"), resolution_s=3600, points=_points([(t, v / 100.0) for t, v in load]),
            source="test"))
        await opt.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(
            pools=[pool("chat", [engine("e1")], region="ES")])))
        plan = (await opt.ComputePlan(optimizer_pb2.ComputePlanRequest(trigger="manual"), timeout=120)).plan
        planned_at = time.time()

        forecast = (await stub.GetForecast(forecaster_pb2.GetForecastRequest(series=ci_ref("ES"),
                                                                             horizon_steps=24))).forecast
        receipts = CarbonIntensityCache(0.0, fc)
        receipts.get("ES")
        await receipts.refresh_once()

    hour = plan.intervals[0].start.ToSeconds()
    assert hour == hour_floor_s(time.time())
    planned = plan.intervals[0].pools[0].ci_g_per_kwh
    forecast_ci = next(p.mean for p in forecast.points if p.time.ToSeconds() == hour)
    assert planned == pytest.approx(forecast_ci, rel=1e-9)
    assert receipts.values["ES"] == pytest.approx(forecast_ci, rel=1e-9)
    # Every hour of the plan is the forecast's, not the naive stand-in's.
    by_time = {p.time.ToSeconds(): p.mean for p in forecast.points}
    for interval in plan.intervals:
        assert interval.pools[0].ci_g_per_kwh == pytest.approx(by_time[interval.start.ToSeconds()], rel=1e-9)
    # The plan names the forecast it used: the same model, made for this plan, on history to the hour before.
    (used,) = [f for f in plan.forecasts if f.series.kind == common_pb2.SERIES_KIND_CARBON_INTENSITY]
    assert used.series.key == "ES" and used.model == forecast.model and used.model != "seasonal_naive"
    assert used.source == "forecaster" and used.history_end.ToSeconds() == hour - 3600
    assert ingested <= used.generated_at.ToNanoseconds() / 1e9 <= planned_at
    assert [f.series.key for f in plan.forecasts] == ["ES", "chat"]
