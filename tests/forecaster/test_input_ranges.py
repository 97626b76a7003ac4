"""Issue 21 (defects 6, 8, 10, 12): every numeric field of the forecaster has a checked range, a refused call
stores nothing, StreamLoad is all or nothing and takes samples only within a window around now, and forecasts
are always finite."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from greenserve.common.errors import error_detail_from_rpc_error
from greenserve.forecaster.forecast_models import Prediction
from greenserve.forecaster.ingest import MAX_POINT_VALUE
from greenserve.forecaster import service as service_module
from greenserve.forecaster.predictions import finite_prediction
from greenserve.forecaster.service import build
from greenserve.forecaster.settings import ForecasterSettings
from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc

from .conftest import DAY0_S, daily_series

CI_FR = common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key="FR",
                             carbon_signal=common_pb2.CARBON_SIGNAL_DIRECT)
SETTINGS = {"forecast_model": "seasonal_naive", "fit_history_hours": 120}
#: The service clock in the StreamLoad tests: 10:30 on DAY0, standing (almost) still.
NOW_S = DAY0_S + 10 * 3600 + 1800
AT_NOW = {"clock_start": str(NOW_S), "clock_speed": 1e-6}


def load_ref(pool: str, unit: int = common_pb2.UNIT_REQUESTS_PER_S) -> common_pb2.SeriesRef:
    return common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_LOAD, key=pool, unit=unit)


def request(times_s, values, resolution_s: int = 3600, series=CI_FR) -> forecaster_pb2.IngestPointsRequest:
    return forecaster_pb2.IngestPointsRequest(series=series, resolution_s=resolution_s, points=[
        common_pb2.TimeSeriesPoint(time=Timestamp(seconds=int(t)), value=float(v))
        for t, v in zip(times_s, values, strict=True)])


async def refused(call, field: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert error_detail_from_rpc_error(err.value).field == field
    return err.value.details()


@pytest.mark.parametrize(("times_s", "resolution_s", "field"), [
    ([0, 2**32 + 10], 1, "points[1].time"),  # a span of 2^32 steps (it overflowed the gaps' uint32)
    ([253_402_300_800], 3600, "points[0].time"),  # year 10000
    ([-3600], 3600, "points[0].time"),  # before 1970
    ([4_102_444_800], 3600, "points[0].time"),  # 2100-01-01: the first instant out of range
])
async def test_out_of_range_times_are_refused_before_anything_is_stored(start_inprocess, times_s, resolution_s,
                                                                        field) -> None:
    svc = await start_inprocess(ForecasterSettings, build, **SETTINGS)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        message = await refused(stub.IngestPoints(request(times_s, [1.0] * len(times_s), resolution_s)), field)
        assert "1970-01-01" in message and "2100-01-01" in message
        assert not (await stub.ListSeries(forecaster_pb2.ListSeriesRequest())).series  # nothing stored
        # the series is not poisoned: it takes good points and answers every read
        await stub.IngestPoints(request([DAY0_S, DAY0_S + 3600], [5.0, 6.0], resolution_s))
        reply = await stub.GetPoints(forecaster_pb2.GetPointsRequest(series=CI_FR))
        assert [(p.time.seconds, p.value) for p in reply.points] == [(DAY0_S, 5.0), (DAY0_S + 3600, 6.0)]
        assert len((await stub.ListSeries(forecaster_pb2.ListSeriesRequest())).series) == 1


async def test_numeric_fields_have_checked_ranges(start_inprocess) -> None:
    svc = await start_inprocess(ForecasterSettings, build, **SETTINGS)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await refused(stub.IngestPoints(request([DAY0_S], [1e300])), "points[0].value")
        await refused(stub.IngestPoints(request([DAY0_S], [1.0], resolution_s=-5)), "resolution_s")
        await refused(stub.IngestPoints(request([DAY0_S], [1.0], resolution_s=86_401)), "resolution_s")
        await stub.IngestPoints(request([DAY0_S + i * 3600 for i in range(48)], daily_series(2)))
        for field, value in (("start", -10**15), ("end", 10**15), ("start", 4_102_444_800)):
            await refused(stub.GetPoints(forecaster_pb2.GetPointsRequest(
                series=CI_FR, **{field: Timestamp(seconds=value)})), field)
        await refused(stub.ListSeries(forecaster_pb2.ListSeriesRequest(kind=99)), "kind")
        await refused(stub.GetForecast(forecaster_pb2.GetForecastRequest(series=CI_FR, horizon_steps=169)),
                      "horizon_steps")
        for coverage in (1.0, -0.5, float("nan")):
            await refused(stub.GetForecast(forecaster_pb2.GetForecastRequest(
                series=CI_FR, interval_coverage_fraction=coverage)), "interval_coverage_fraction")
        await refused(stub.Backtest(forecaster_pb2.BacktestRequest(
            inline=forecaster_pb2.InlineSeries(points=request([DAY0_S], [1e300]).points))), "inline.points[0].value")


@pytest.mark.parametrize("coverage", [1 - 1e-16, 1 - 2**-53, 1 - 1e-13, 1e-13, 5e-324, float("inf"), -0.0 - 1e-300])
async def test_a_coverage_the_interval_maths_cannot_use_is_invalid_argument(start_inprocess, coverage) -> None:
    """Issue 36: 1 - 1e-16 is inside (0, 1) but 0.5 + coverage / 2 rounds to 1.0, whose normal quantile is
    infinite: the call answered INTERNAL. Now it is refused naming the field, and the bounds themselves work."""
    svc = await start_inprocess(ForecasterSettings, build, **SETTINGS)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await stub.IngestPoints(request([DAY0_S + i * 3600 for i in range(48)], daily_series(2)))
        message = await refused(stub.GetForecast(forecaster_pb2.GetForecastRequest(
            series=CI_FR, interval_coverage_fraction=coverage)), "interval_coverage_fraction")
        assert "1e-12" in message, message
        for edge in (service_module.MIN_COVERAGE, service_module.MAX_COVERAGE):
            reply = await stub.GetForecast(forecaster_pb2.GetForecastRequest(
                series=CI_FR, interval_coverage_fraction=edge))
            values = np.array([(p.lower, p.mean, p.upper) for p in reply.forecast.points])
            assert len(values) == 24 and np.isfinite(values).all()
            assert reply.forecast.interval_coverage_fraction == edge


async def test_sub_second_and_malformed_times_are_refused_in_every_rpc(start_inprocess) -> None:
    """Issue 36: the nanos of GetPoints' range ends and of a backtest's inline points are checked too (they were
    ignored: an inline point at t + 0.5 s was read as t)."""
    svc = await start_inprocess(ForecasterSettings, build, **SETTINGS)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await stub.IngestPoints(request([DAY0_S + i * 3600 for i in range(48)], daily_series(2)))
        for nanos in (-1, 1_000_000_000):
            await refused(stub.GetPoints(forecaster_pb2.GetPointsRequest(
                series=CI_FR, start=Timestamp(seconds=DAY0_S, nanos=nanos))), "start")
        points = request([DAY0_S + i * 3600 for i in range(96)], daily_series(4)).points
        points[3].time.nanos = 500_000_000
        await refused(stub.Backtest(forecaster_pb2.BacktestRequest(
            inline=forecaster_pb2.InlineSeries(points=points), history_hours=24, days=1)), "inline.points[3].time")


async def test_forecasts_are_finite_at_extreme_values_and_coverage(start_inprocess) -> None:
    svc = await start_inprocess(ForecasterSettings, build, **SETTINGS)
    wild = np.where(np.arange(96) % 2 == 0, 0.0, MAX_POINT_VALUE)  # 0 and the largest value, hour by hour
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await stub.IngestPoints(request([DAY0_S + i * 3600 for i in range(96)], wild))
        reply = await stub.GetForecast(forecaster_pb2.GetForecastRequest(
            series=CI_FR, horizon_steps=168, interval_coverage_fraction=0.9999999999))
        values = np.array([(p.lower, p.mean, p.upper) for p in reply.forecast.points])
        assert len(values) == 168 and np.isfinite(values).all()
        assert (values >= 0).all() and (values <= MAX_POINT_VALUE).all()
        assert (values[:, 0] <= values[:, 1]).all() and (values[:, 1] <= values[:, 2]).all()


def test_finite_prediction_clips_interval_ends_and_refuses_a_non_finite_mean() -> None:
    pred = Prediction(np.array([1.0, 2.0]), np.array([np.nan, -np.inf]), np.array([np.inf, np.nan]), "m", 0.9)
    clipped = finite_prediction(pred)
    assert clipped is not None
    assert clipped.lower.tolist() == [0.0, 0.0] and clipped.upper.tolist() == [MAX_POINT_VALUE] * 2
    assert finite_prediction(Prediction(np.array([np.inf]), np.array([0.0]), np.array([1.0]), "m", 0.9)) is None


def sample(pool: str, end_s: float, requests: int = 60, window_s: float = 60.0) -> forecaster_pb2.StreamLoadRequest:
    return forecaster_pb2.StreamLoadRequest(pool=pool, time=Timestamp(seconds=int(end_s)), window_s=window_s,
                                            requests=requests, input_tokens=requests * 10, output_tokens=requests)


async def stream(stub, items):
    async def gen():
        for item in items:
            yield item
    return await stub.StreamLoad(gen())


async def stored_points(stub, series) -> list[tuple[int, float]]:
    try:
        reply = await stub.GetPoints(forecaster_pb2.GetPointsRequest(series=series))
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.NOT_FOUND
        return []
    return [(p.time.seconds, p.value) for p in reply.points]


async def test_stream_load_refuses_samples_outside_the_window_around_now(start_inprocess) -> None:
    svc = await start_inprocess(ForecasterSettings, build, **SETTINGS, **AT_NOW)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        message = await refused(stream(stub, [sample("p", NOW_S + 86_400)]), "samples[0].time")
        assert "ahead of the service clock" in message
        await refused(stream(stub, [sample("p", NOW_S - 30 * 86_400)]), "samples[0].time")
        await refused(stream(stub, [sample("p", 10**13)]), "samples[0].time")
        # the pool is not poisoned: samples of now are taken, and hour 9 is stored once hour 10 starts
        hour9 = DAY0_S + 9 * 3600
        assert (await stream(stub, [sample("p", hour9 + 120), sample("p", NOW_S)])).accepted_samples == 2
        assert await stored_points(stub, load_ref("p")) == [(hour9, pytest.approx(1.0))]
        await refused(stream(stub, [sample("p", NOW_S, window_s=0.0)]), "samples[0].window_s")
        await refused(stream(stub, [sample("p", NOW_S, window_s=7200.0)]), "samples[0].window_s")
        too_many = sample("p", NOW_S)
        too_many.input_tokens = 10**13
        await refused(stream(stub, [too_many]), "samples[0].input_tokens")


async def test_stream_load_is_all_or_nothing_and_keeps_open_hours_across_a_restart(start_inprocess,
                                                                                    tmp_path) -> None:
    settings = {**SETTINGS, **AT_NOW, "data_dir": tmp_path / "fc"}
    hour8, hour9 = DAY0_S + 8 * 3600, DAY0_S + 9 * 3600
    # hour 8 complete: the hour-9 sample ends 10 min into hour 9, past hour 8's grace (300 s)
    good = [sample("a", hour8 + 60, requests=120), sample("a", hour9 + 600, requests=30)]
    svc = await start_inprocess(ForecasterSettings, build, **settings)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await refused(stream(stub, [*good, sample("a", hour9 + 120, window_s=-1.0)]), "samples[2].window_s")
        await refused(stream(stub, [*good, sample("a", hour8 + 120)]), "samples[2].time")  # hour 8 closed
        assert await stored_points(stub, load_ref("a")) == []  # nothing of the refused calls
        # the open hours are as they were: the same samples again give hour 8 once, at 120 per 60 s
        assert (await stream(stub, good)).accepted_samples == 2
        assert await stored_points(stub, load_ref("a")) == [(hour8, pytest.approx(2.0))]
    await svc.server.stop(0)

    again = await start_inprocess(ForecasterSettings, build, **settings)
    async with grpc.aio.insecure_channel(again.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        # hour 9 was open at the restart (30 requests in 60 s): it completes with one more sample
        assert (await stream(stub, [sample("a", hour9 + 180, requests=90), sample("a", NOW_S)])).accepted_samples == 2
        assert await stored_points(stub, load_ref("a")) == [(hour8, pytest.approx(2.0)),
                                                             (hour9, pytest.approx(1.0))]
        tokens = await stored_points(stub, load_ref("a", common_pb2.UNIT_INPUT_TOKENS_PER_S))
        assert tokens == [(hour8, pytest.approx(20.0)), (hour9, pytest.approx(10.0))]


async def test_stream_load_open_hour_keeps_its_span_across_a_restart(start_inprocess, tmp_path) -> None:
    """Issue 22: the open hour's span is stored with it. Two reporters cover 09:00-09:10 before the restart and
    09:10-09:20 after it, 1 request/s each: 2 per second over 20 min (without the stored span the restored hour
    would count as a whole hour, and the summed windows, 40 min, would read 1.0)."""
    settings = {**SETTINGS, **AT_NOW, "data_dir": tmp_path / "fc"}
    hour9 = DAY0_S + 9 * 3600

    def both(minutes):
        return [sample("r", hour9 + (m + 1) * 60) for m in minutes for _ in range(2)]

    svc = await start_inprocess(ForecasterSettings, build, **settings)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        assert (await stream(stub, both(range(10)))).accepted_samples == 20
    await svc.server.stop(0)

    again = await start_inprocess(ForecasterSettings, build, **settings)
    async with grpc.aio.insecure_channel(again.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        assert (await stream(stub, [*both(range(10, 20)), sample("r", NOW_S)])).accepted_samples == 21
        assert await stored_points(stub, load_ref("r")) == [(hour9, pytest.approx(2.0))]


async def test_get_points_refuses_a_reply_over_its_limit_and_serves_a_narrower_range(start_inprocess,
                                                                                     monkeypatch) -> None:
    monkeypatch.setattr(service_module, "MAX_POINTS_PER_REPLY", 3)
    svc = await start_inprocess(ForecasterSettings, build, **SETTINGS)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await stub.IngestPoints(request([DAY0_S + i * 3600 for i in range(5)], [1.0, 2.0, 3.0, 4.0, 5.0]))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetPoints(forecaster_pb2.GetPointsRequest(series=CI_FR))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "3 points" in err.value.details()
        reply = await stub.GetPoints(forecaster_pb2.GetPointsRequest(
            series=CI_FR, start=Timestamp(seconds=DAY0_S + 3600), end=Timestamp(seconds=DAY0_S + 4 * 3600)))
        assert [p.value for p in reply.points] == [2.0, 3.0, 4.0]
