"""StreamLoad keeps working for every pool when a completed hour of one pool cannot be stored as streamed (audit).

A load series can also be written with IngestPoints (a backfill, or anyone holding the token). When the hour
StreamLoad completes already holds another value there, or the series is stored at another resolution, the stored
history is kept (never silently rewritten) and the hour's streamed rate is dropped with a warning. Before, the
hour's emission failed the call with INVALID_ARGUMENT, the hour stayed open, and every later call that reached
the pool tried to emit it again: the pool's load stream, and every other pool sent in the same calls, was refused
for good (the open hours survive restarts)."""

from __future__ import annotations

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.forecaster.service import build
from greenserve.forecaster.settings import ForecasterSettings
from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc

from .test_stream_load_late import AT_1030, HOUR9_S, HOUR10_S, SETTINGS, minutes, rates, stream


def _load_ref(pool: str) -> common_pb2.SeriesRef:
    return common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_LOAD, key=pool, unit=common_pb2.UNIT_REQUESTS_PER_S)


async def test_a_stored_point_of_the_hour_does_not_wedge_the_stream(start_inprocess) -> None:
    svc = await start_inprocess(ForecasterSettings, build, **SETTINGS, **{**AT_1030, "stream_load_late_s": 0})
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(series=_load_ref("p"), points=[
            common_pb2.TimeSeriesPoint(time=Timestamp(seconds=HOUR9_S), value=123.0)]))
        assert await stream(stub, minutes("p", HOUR9_S, range(60))) == 60
        # hour 10 of p closes hour 9 (1 request/s streamed, 123 stored): q's samples come in the same calls
        for minute in range(3):
            assert await stream(stub, [*minutes("q", HOUR10_S, [minute]), *minutes("p", HOUR10_S, [minute])]) == 2
        assert await rates(stub, "p") == [(HOUR9_S, 123.0)]  # the stored history is kept


async def test_a_series_stored_at_another_resolution_does_not_wedge_the_stream(start_inprocess) -> None:
    svc = await start_inprocess(ForecasterSettings, build, **SETTINGS, **{**AT_1030, "stream_load_late_s": 0})
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(series=_load_ref("p"), resolution_s=900, points=[
            common_pb2.TimeSeriesPoint(time=Timestamp(seconds=HOUR9_S - 900), value=5.0)]))
        assert await stream(stub, minutes("p", HOUR9_S, range(60))) == 60
        for minute in range(3):
            assert await stream(stub, [*minutes("q", HOUR10_S, [minute]), *minutes("p", HOUR10_S, [minute])]) == 2
        assert await rates(stub, "p") == [(HOUR9_S - 900, 5.0)]
