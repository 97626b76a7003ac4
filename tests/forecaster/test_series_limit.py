"""The forecaster holds at most --max-series series (audit: memory stays bounded however much input arrives).

Memory is bounded per series (docs/forecaster.md: about 2.7 MB with its fitted model), but every IngestPoints of a
new series key, and every StreamLoad sample of a new pool (three series), created one more, kept in memory with
its model for the life of the service: a client inventing keys grew the process without bound. A write that
would create a series past the limit is refused with RESOURCE_EXHAUSTED naming the field, and stores nothing."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.common.errors import error_detail_from_rpc_error
from greenserve.forecaster.service import build
from greenserve.forecaster.settings import ForecasterSettings
from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc

from .test_stream_load_late import AT_1030, HOUR10_S, SETTINGS, minutes, stream


def _ci(region: str) -> common_pb2.SeriesRef:
    return common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key=region,
                                carbon_signal=common_pb2.CARBON_SIGNAL_DIRECT)


async def _ingest(stub, region: str) -> None:
    await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(series=_ci(region), points=[
        common_pb2.TimeSeriesPoint(time=Timestamp(seconds=HOUR10_S - 3600), value=100.0)]))


async def _series(stub) -> list[str]:
    return sorted(f"{s.series.key}/{s.series.unit}" for s in (await stub.ListSeries(
        forecaster_pb2.ListSeriesRequest())).series)


async def test_new_series_past_the_limit_are_refused(start_inprocess) -> None:
    svc = await start_inprocess(ForecasterSettings, build, **SETTINGS, **AT_1030, max_series=4)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await _ingest(stub, "A")
        assert await stream(stub, minutes("p", HOUR10_S, [0])) == 1  # pool p: three series to come
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await _ingest(stub, "B")  # 1 + 3 reserved for p: full
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_detail_from_rpc_error(exc.value).field == "series"
        with pytest.raises(grpc.aio.AioRpcError) as exc:  # a new pool: refused, p's sample with it
            await stream(stub, [*minutes("p", HOUR10_S, [1]), *minutes("q", HOUR10_S, [1])])
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_detail_from_rpc_error(exc.value).field == "samples[1].pool"
        # known series and pools still take points
        await _ingest(stub, "A")
        assert await stream(stub, minutes("p", HOUR10_S, [2])) == 1
        assert await _series(stub) == ["A/1"]
