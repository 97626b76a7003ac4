"""The forecaster over real gRPC: ingestion rules, forecasts with intervals, StreamLoad, restart persistence."""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from greenserve.common.errors import error_detail_from_rpc_error
from greenserve.forecaster.service import build
from greenserve.forecaster.settings import ForecasterSettings
from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc

from .conftest import DAY0_S, daily_series

CI_ES = common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key="ES",
                             carbon_signal=common_pb2.CARBON_SIGNAL_LIFECYCLE)
FAST = {"forecast_model": "sarima_fourier", "fit_history_hours": 120, "refit_interval_s": 3600}


def points(values, start_s: int = DAY0_S, step_s: int = 3600) -> list[common_pb2.TimeSeriesPoint]:
    return [common_pb2.TimeSeriesPoint(time=Timestamp(seconds=start_s + i * step_s), value=float(v))
            for i, v in enumerate(values)]


async def ingest(stub, values, start_s: int = DAY0_S, series=CI_ES):
    return await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(series=series, resolution_s=3600,
                                                                      points=points(values, start_s)))


async def stored(stub, series=CI_ES) -> list[float]:
    reply = await stub.GetPoints(forecaster_pb2.GetPointsRequest(series=series))
    return [p.value for p in reply.points]


async def wait_for_fit(stub, series=CI_ES, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reply = await stub.ListSeries(forecaster_pb2.ListSeriesRequest())
        for info in reply.series:
            if info.series.key == series.key and info.model:
                return info.model
        await asyncio.sleep(0.2)
    raise AssertionError("no fit within the timeout")


@pytest.mark.parametrize(("bad_value", "index"), [(float("nan"), 3), (-5.0, 7), (float("inf"), 0)])
async def test_bad_point_rejects_the_whole_batch(start_inprocess, bad_value, index) -> None:
    svc = await start_inprocess(ForecasterSettings, build, **FAST)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await ingest(stub, [100.0, 101.0])
        values = list(daily_series(1))
        values[index] = bad_value
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ingest(stub, values, start_s=DAY0_S + 2 * 3600)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_detail_from_rpc_error(err.value).field == f"points[{index}].value"
        assert await stored(stub) == [100.0, 101.0]  # nothing of the bad batch


async def test_duplicates_are_idempotent_conflicts_rejected_and_gaps_reported(start_inprocess) -> None:
    svc = await start_inprocess(ForecasterSettings, build, **FAST)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        first = await ingest(stub, [1.0, 2.0, 3.0])
        assert (first.inserted_points, first.duplicate_points, list(first.gaps)) == (3, 0, [])
        again = await ingest(stub, [1.0, 2.0, 3.0])
        assert (again.inserted_points, again.duplicate_points) == (0, 3)
        # 3 hours later: a gap of 2 missing steps at 03:00, reported, not filled
        later = await ingest(stub, [6.0], start_s=DAY0_S + 5 * 3600)
        assert later.inserted_points == 1
        assert [(g.start.seconds, g.missing_points) for g in later.gaps] == [(DAY0_S + 3 * 3600, 2)]
        assert await stored(stub) == [1.0, 2.0, 3.0, 6.0]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ingest(stub, [1.0, 2.5])  # 01:00 already stored as 2.0
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_detail_from_rpc_error(err.value).field == "points[1].value"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(
                series=CI_ES, resolution_s=3600, points=points([1.0], start_s=DAY0_S + 1800)))
        assert error_detail_from_rpc_error(err.value).field == "points[0].time"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ingest(stub, [1.0], series=common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY,
                                                                  key="ES"))
        assert error_detail_from_rpc_error(err.value).field == "series.carbon_signal"


async def test_forecast_with_intervals_over_grpc_and_restart_keeps_history_and_model(start_inprocess,
                                                                                      tmp_path) -> None:
    settings = {**FAST, "data_dir": tmp_path / "fc"}
    svc = await start_inprocess(ForecasterSettings, build, **settings)
    values = daily_series(6, noise=3.0)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await ingest(stub, values)
        model = await wait_for_fit(stub)
        assert model.startswith("sarima_fourier")
        reply = await stub.GetForecast(forecaster_pb2.GetForecastRequest(series=CI_ES, horizon_steps=24,
                                                                         interval_coverage_fraction=0.8))
        f = reply.forecast
        assert f.model == model and f.interval_coverage_fraction == pytest.approx(0.8)
        assert len(f.points) == 24 and f.resolution_s == 3600
        end = DAY0_S + (len(values) - 1) * 3600
        assert f.history_end.seconds == end and f.points[0].time.seconds == end + 3600
        for p in f.points:
            assert p.lower < p.mean < p.upper
        truth = daily_series(7, noise=0.0)[-24:]
        mean = np.array([p.mean for p in f.points])
        assert np.mean(np.abs(mean - truth) / truth) < 0.05  # a clean daily cycle is forecast well
        # online update: one more hour moves the forecast origin without a refit
        await ingest(stub, [truth[0]], start_s=end + 3600)
        moved = (await stub.GetForecast(forecaster_pb2.GetForecastRequest(series=CI_ES))).forecast
        assert moved.history_end.seconds == end + 3600 and moved.model == model
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetForecast(forecaster_pb2.GetForecastRequest(series=CI_ES, horizon_steps=500))
        assert error_detail_from_rpc_error(err.value).field == "horizon_steps"
        before = [(p.mean, p.lower, p.upper) for p in moved.points]
    await svc.server.stop(0)

    again = await start_inprocess(ForecasterSettings, build, **settings)
    async with grpc.aio.insecure_channel(again.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        listed = (await stub.ListSeries(forecaster_pb2.ListSeriesRequest())).series
        assert len(listed) == 1 and listed[0].point_count == len(values) + 1 and listed[0].model == model
        restored = (await stub.GetForecast(forecaster_pb2.GetForecastRequest(series=CI_ES))).forecast
        assert restored.model == model and restored.history_end.seconds == end + 3600
        after = [(p.mean, p.lower, p.upper) for p in restored.points]
        assert np.allclose(after, before, rtol=1e-6)


async def test_forecast_before_any_fit_is_seasonal_naive_and_says_so(start_inprocess) -> None:
    svc = await start_inprocess(ForecasterSettings, build, **{**FAST, "forecast_model": "auto"})
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await ingest(stub, daily_series(1))  # 24 points: too few to fit (48), enough for naive
        f = (await stub.GetForecast(forecaster_pb2.GetForecastRequest(series=CI_ES))).forecast
        assert f.model == "seasonal_naive" and len(f.points) == 24
        assert np.allclose([p.mean for p in f.points], daily_series(1))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetForecast(forecaster_pb2.GetForecastRequest(series=common_pb2.SeriesRef(
                kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key="XX", carbon_signal=common_pb2.CARBON_SIGNAL_DIRECT)))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_current_carbon_intensity_is_the_latest_measurement(start_inprocess) -> None:
    svc = await start_inprocess(ForecasterSettings, build, **FAST)
    now = int(time.time()) // 3600 * 3600
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await ingest(stub, [10.0, 20.0, 30.0], start_s=now - 2 * 3600)
        reply = await stub.GetCurrentCarbonIntensity(forecaster_pb2.GetCurrentCarbonIntensityRequest(
            region="ES", carbon_signal=common_pb2.CARBON_SIGNAL_LIFECYCLE))
        ci = reply.carbon_intensity
        assert ci.ci_g_per_kwh == 30.0 and ci.time.seconds == now and not ci.forecast


async def test_stream_load_becomes_hourly_rates(start_inprocess) -> None:
    # samples are taken within a window around the service clock: it reads 02:00 on DAY0
    svc = await start_inprocess(ForecasterSettings, build, **FAST, clock_start=str(DAY0_S + 2 * 3600))

    def sample(minute: int, requests: int) -> forecaster_pb2.StreamLoadRequest:
        return forecaster_pb2.StreamLoadRequest(pool="llama/a", time=Timestamp(seconds=DAY0_S + (minute + 1) * 60),
                                                window_s=60.0, requests=requests, input_tokens=requests * 100,
                                                output_tokens=requests * 10)

    async def samples():
        for minute in range(0, 30):  # the router covered half of hour 0 only
            yield sample(minute, 120)
        yield sample(66, 60)  # a sample of hour 1 ending past hour 0's grace (300 s) completes hour 0

    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        reply = await stub.StreamLoad(samples())
        assert reply.accepted_samples == 31
        load = common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_LOAD, key="llama/a",
                                    unit=common_pb2.UNIT_REQUESTS_PER_S)
        assert await stored(stub, load) == [pytest.approx(2.0)]  # 120 per 60 s covered, not diluted to 1.0
        tokens = common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_LOAD, key="llama/a",
                                      unit=common_pb2.UNIT_INPUT_TOKENS_PER_S)
        assert await stored(stub, tokens) == [pytest.approx(200.0)]


async def test_stream_load_covered_seconds_with_several_reporters(start_inprocess) -> None:
    """Issue 22: router workers and replicas each send samples of the same pool and hour. Covered seconds are
    min(summed windows, span of the windows, 1 h), not the summed windows (N reporters over half an hour)."""
    svc = await start_inprocess(ForecasterSettings, build, **FAST, clock_start=str(DAY0_S + 2 * 3600))

    def sample(pool: str, end_s: float, window_s: float, requests: int) -> forecaster_pb2.StreamLoadRequest:
        return forecaster_pb2.StreamLoadRequest(pool=pool, time=Timestamp(seconds=DAY0_S + int(end_s)),
                                                window_s=window_s, requests=requests)

    def one_reporter(pool: str, minutes, requests: int = 60) -> list[forecaster_pb2.StreamLoadRequest]:
        return [sample(pool, (m + 1) * 60, 60.0, requests) for m in minutes]

    half_hour = range(30)
    two = []  # worker A: 60 s windows; worker B: 30 s windows, interleaved; 1 request/s each over 00:00-00:30
    for m in half_hour:
        two.append(sample("two", m * 60 + 30, 30.0, 30))
        two.append(sample("two", (m + 1) * 60, 60.0, 60))
        two.append(sample("two", (m + 1) * 60, 30.0, 30))
    paused = [s for m in [*range(10), *range(20, 30)] for s in one_reporter("paused", [m]) * 2]
    items = [*one_reporter("one", half_hour, 120), *two,
             *one_reporter("gap", [*range(10), *range(20, 30)]),  # one reporter, silent 00:10-00:20
             *[sample("edge", 30 + 60 * k, 60.0, 60) for k in range(10)],  # first window 23:59:30-00:00:30
             *paused]
    pools = ("one", "two", "gap", "edge", "paused")
    items += [sample(pool, 3600 + 600, 60.0, 1) for pool in pools]  # hour 1, past the grace: completes hour 0

    async def gen():
        for item in items:
            yield item

    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        assert (await stub.StreamLoad(gen())).accepted_samples == len(items)
        rates = {}
        for pool in pools:
            ref = common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_LOAD, key=pool, unit=common_pb2.UNIT_REQUESTS_PER_S)
            rates[pool] = await stored(stub, ref)
    # two reporters give what one reporter counting both gives (summed windows would read 1.0)
    assert rates["one"] == rates["two"] == [pytest.approx(2.0)]
    # one reporter with a gap: count / summed windows (the span, 30 min, would read 0.67)
    assert rates["gap"] == [pytest.approx(1.0)]
    # a window straddling the hour's start counts whole: exact (clipped to the hour it would read 1.05)
    assert rates["edge"] == [pytest.approx(1.0)]
    # the documented approximation: two reporters that both pause have the pause counted as covered
    assert rates["paused"] == [pytest.approx(2400 / 1800)]


async def test_backtest_rpc_on_inline_points(start_inprocess) -> None:
    svc = await start_inprocess(ForecasterSettings, build, **FAST)
    values = daily_series(6)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        reply = await stub.Backtest(forecaster_pb2.BacktestRequest(
            inline=forecaster_pb2.InlineSeries(points=points(values), name="clean"), history_hours=72,
            horizon_hours=24, days=2, model="seasonal_naive"))
        assert reply.points == 48 and reply.mape_percent == pytest.approx(0.0, abs=1e-9)
        assert reply.interval_coverage_fraction == 1.0  # a clean cycle: every truth on the forecast
        assert [d.interval_coverage_fraction for d in reply.days] == [1.0, 1.0]
        assert [d.day.seconds for d in reply.days] == [DAY0_S + 4 * 86400, DAY0_S + 5 * 86400]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Backtest(forecaster_pb2.BacktestRequest(
                inline=forecaster_pb2.InlineSeries(points=points(values)), history_hours=10, days=1))
        assert error_detail_from_rpc_error(err.value).field == "history_hours"


async def test_an_ingest_does_not_wait_behind_a_fit_whose_store_waits_for_the_database(start_inprocess,
                                                                                       monkeypatch) -> None:
    """A fit's store (FittedModel row) that waits for the database, another writer holding SQLite's write lock, held
    the ingest lock meanwhile: an ingest behind it waited for the fit's busy timeout and then for its own
    (tests/faults/test_sqlite_locked.py took 30 s, twice the 15 s timeout, when the first fit ended under the lock).
    The store runs outside the ingest lock; the points ingested meanwhile are replayed into the new fit."""
    import threading

    from greenserve.forecaster.series_state import FittedSeries

    storing, release = threading.Event(), threading.Event()
    real = FittedSeries._persist_fit

    def waits_for_the_database(self, *args):
        storing.set()
        assert release.wait(60)
        return real(self, *args)

    monkeypatch.setattr(FittedSeries, "_persist_fit", waits_for_the_database)
    svc = await start_inprocess(ForecasterSettings, build, **{**FAST, "forecast_model": "seasonal_naive"})
    values = daily_series(3)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await ingest(stub, values)  # the first fit starts
        try:
            assert await asyncio.to_thread(storing.wait, 60), "the fit was never stored"
            end = DAY0_S + (len(values) - 1) * 3600
            reply = await asyncio.wait_for(ingest(stub, [values[0]], start_s=end + 3600), 10)  # not held up
            assert reply.inserted_points == 1
        finally:
            release.set()
        await wait_for_fit(stub)
        f = (await stub.GetForecast(forecaster_pb2.GetForecastRequest(series=CI_ES))).forecast
        assert f.history_end.seconds == end + 3600  # the point ingested meanwhile is in the new fit
