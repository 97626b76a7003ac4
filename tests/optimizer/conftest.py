"""Fixtures of the optimizer tests: a forecaster holding CI and load history, and an optimizer planning on it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from greenserve.common.clock import hour_floor_s, now_s
from greenserve.forecaster.service import build as build_forecaster
from greenserve.forecaster.settings import ForecasterSettings
from greenserve.optimizer.service import OptimizerSettings
from greenserve.optimizer.service import build as build_optimizer
from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc

GIB = 1024**3


def ci_ref(region: str) -> common_pb2.SeriesRef:
    return common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key=region,
                                carbon_signal=common_pb2.CARBON_SIGNAL_DIRECT, unit=common_pb2.UNIT_G_PER_KWH)


def load_ref(pool: str) -> common_pb2.SeriesRef:
    return common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_LOAD, key=pool, unit=common_pb2.UNIT_REQUESTS_PER_S)


async def ingest_daily(channel: grpc.aio.Channel, ref: common_pb2.SeriesRef, base: float, amplitude: float,
                       days: int = 4) -> None:
    """``days`` of hourly history ending at the current hour: a daily sine around ``base``."""
    stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
    end = hour_floor_s(now_s())
    points = []
    for h in range(days * 24):
        t = end - (days * 24 - 1 - h) * 3600
        ts = common_pb2.TimeSeriesPoint(value=base + amplitude * math.sin(2 * math.pi * ((t / 3600) % 24) / 24))
        ts.time.FromSeconds(int(t))
        points.append(ts)
    await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(series=ref, resolution_s=3600, points=points,
                                                               source="test"))


def pool(name: str, engines: list[common_pb2.Engine], region: str = "FR", **kw: Any) -> common_pb2.Pool:
    return common_pb2.Pool(name=name, model="meta-llama/Meta-Llama-3-8B-Instruct", region=region,
                           slo=common_pb2.Slo(ttft_s=1.0, tpot_s=0.1, attainment_fraction=0.9), engines=engines, **kw)


def engine(engine_id: str, hardware: str = "A100-80GB", url: str = "") -> common_pb2.Engine:
    return common_pb2.Engine(id=engine_id, url=url or f"http://127.0.0.1:9/{engine_id}", hardware=hardware,
                             kind=common_pb2.ENGINE_KIND_SIMULATED)


@pytest.fixture
async def forecaster(start_inprocess: Callable[..., Any]) -> Any:
    return await start_inprocess(ForecasterSettings, build_forecaster, forecast_model="seasonal_naive")


@pytest.fixture
async def optimizer(start_inprocess: Callable[..., Any], forecaster: Any) -> Callable[..., Any]:
    async def start(**overrides: Any) -> Any:
        values = {"forecaster_addr": forecaster.address, "profiler_addr": "127.0.0.1:9", "cache_manager_addr": "127.0.0.1:9", "plan_debounce_s": 0.05,
                  "ci_monitor_interval_s": 0, **overrides}
        return await start_inprocess(OptimizerSettings, build_optimizer, **values)

    return start
