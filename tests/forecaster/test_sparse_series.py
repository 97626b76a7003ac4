"""Issue 21, defect 5 (and the service side of defect 2): a series with a few points spread over years, or a
point long after the model's last one, never makes the service build a grid or feed an update over the span.

GetPoints built a dense array over the whole span on the event loop (28 s, health checks blocked), Backtest a
1.7 GB grid, and an update after a jump handed the model one NaN per missing step."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from greenserve.forecaster import ingest
from greenserve.forecaster.service import build
from greenserve.forecaster.settings import ForecasterSettings
from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc

from .conftest import DAY0_S, daily_series

CI_SE = common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key="SE",
                             carbon_signal=common_pb2.CARBON_SIGNAL_DIRECT)
YEAR_S = 365 * 86_400
#: Most steps any grid may have here: a fit window, or the days a backtest scores with their history.
GRID_BOUND_STEPS = 2_000


def points(times_s, values) -> list[common_pb2.TimeSeriesPoint]:
    return [common_pb2.TimeSeriesPoint(time=Timestamp(seconds=int(t)), value=float(v))
            for t, v in zip(times_s, values, strict=True)]


@pytest.fixture
def grid_sizes(monkeypatch) -> list[int]:
    """The length of every grid the service builds from stored points."""
    sizes: list[int] = []
    real = ingest.load_grid

    def spy(*args, **kwargs):
        first, grid = real(*args, **kwargs)
        sizes.append(len(grid))
        return first, grid

    monkeypatch.setattr(ingest, "load_grid", spy)
    return sizes


async def test_sparse_series_over_decades_is_served_from_what_is_stored(start_inprocess, grid_sizes) -> None:
    svc = await start_inprocess(ForecasterSettings, build, forecast_model="seasonal_naive")
    recent = DAY0_S + np.arange(5 * 24) * 3600  # five days of hourly points at the end
    times = np.concatenate([[3600, 30 * YEAR_S], recent, [ingest.TIME_MAX_S - 3600 * 200]])
    values = np.concatenate([[1.0, 2.0], daily_series(5), [3.0]])
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(series=CI_SE, resolution_s=3600,
                                                                   points=points(times, values)))
        reply = await stub.GetPoints(forecaster_pb2.GetPointsRequest(series=CI_SE))
        assert [p.time.seconds for p in reply.points] == sorted(times.tolist())
        ranged = await stub.GetPoints(forecaster_pb2.GetPointsRequest(
            series=CI_SE, start=Timestamp(seconds=2 * 3600), end=Timestamp(seconds=int(recent[0]))))
        assert [(p.time.seconds, p.value) for p in ranged.points] == [(30 * YEAR_S, 2.0)]
        health = health_pb2_grpc.HealthStub(channel)
        assert (await health.Check(health_pb2.HealthCheckRequest())).status == health_pb2.HealthCheckResponse.SERVING
        # a backtest of the stored series reads the days it scores, not the 129 years before them
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Backtest(forecaster_pb2.BacktestRequest(series=CI_SE, history_hours=48, horizon_hours=24,
                                                               days=2, model="seasonal_naive"))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # its last days hold one point
        inline = await stub.Backtest(forecaster_pb2.BacktestRequest(
            inline=forecaster_pb2.InlineSeries(points=points(np.concatenate([[3600], recent]),
                                                             np.concatenate([[1.0], daily_series(5)]))),
            history_hours=48, horizon_hours=24, days=2, model="seasonal_naive"))
        assert inline.points == 48
        with pytest.raises(grpc.aio.AioRpcError) as err:  # the last 4 days before its last point hold one point
            await stub.GetForecast(forecaster_pb2.GetForecastRequest(series=CI_SE))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert grid_sizes and max(grid_sizes) <= GRID_BOUND_STEPS


async def test_a_point_long_after_the_fit_refits_instead_of_feeding_every_missing_step(start_inprocess) -> None:
    settings = {"forecast_model": "sarima_fourier", "fit_history_hours": 72, "refit_interval_s": 3600}
    svc = await start_inprocess(ForecasterSettings, build, **settings)
    servicer = svc.server.registrations[0].servicer
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(
            series=CI_SE, resolution_s=3600, points=points(DAY0_S + np.arange(72) * 3600, daily_series(3, noise=3.0))))
        state = next(iter(servicer.states.values()))
        for _ in range(600):  # the first fit runs in a worker process
            if state.model is not None:
                break
            await asyncio.sleep(0.1)
        assert state.model is not None
        fed: list[int] = []
        real_update = state.model.update
        state.model.update = lambda values: (fed.append(len(values)), real_update(values))[1]
        end = DAY0_S + 71 * 3600
        await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(  # the next hour: an online update
            series=CI_SE, resolution_s=3600, points=points([end + 3600], [200.0])))
        assert fed == [1]
        await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(  # ten years later: a refit, not an update
            series=CI_SE, resolution_s=3600, points=points([end + 10 * YEAR_S], [200.0])))
        assert fed == [1] and state.stale
        assert state.history_end_s == end + 3600
        forecast = (await stub.GetForecast(forecaster_pb2.GetForecastRequest(series=CI_SE))).forecast
        assert forecast.history_end.seconds == end + 3600  # says which history it comes from
