"""StreamLoad holds a bounded amount of memory per call, whatever the size of its messages (audit)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.common.errors import error_detail_from_rpc_error
from greenserve.forecaster.service import build
from greenserve.forecaster.settings import ForecasterSettings
from greenserve.forecaster.stream_load import MAX_SAMPLE_BYTES
from greenserve.v1 import forecaster_pb2, forecaster_pb2_grpc

from .test_stream_load_late import AT_1030, HOUR10_S, SETTINGS



async def test_an_oversized_sample_is_refused_before_the_rest_is_read(start_inprocess) -> None:
    """StreamLoad kept every message of the call (up to 100,000) before checking any, and a message may be as
    large as --max-message-bytes (16 MiB): a pool name padded with blanks (stripped, so even accepted) or unknown
    fields. One call could make the service hold 100,000 x 16 MiB. A message larger than any valid sample
    (MAX_SAMPLE_BYTES) is now refused as it arrives, naming it, and the call is read no further."""
    svc = await start_inprocess(ForecasterSettings, build, **SETTINGS, **AT_1030)

    async def padded():
        yield forecaster_pb2.StreamLoadRequest(pool=" " * (256 << 10) + "p", time=Timestamp(seconds=HOUR10_S + 60),
                                               window_s=60.0, requests=60)
        # then neither another message nor the end of the stream: only a refusal as the message arrives ends the
        # call (a client that kept writing could see grpc.aio's own INTERNAL for a send after the refusal instead
        # of the refusal: a loaded CI host did)
        await asyncio.Event().wait()

    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await asyncio.wait_for(stub.StreamLoad(padded()), 30)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_detail_from_rpc_error(exc.value).field == "samples[0]"
        # the largest valid sample still goes through
        wide = forecaster_pb2.StreamLoadRequest(pool="\U0001F600" * 255, time=Timestamp(seconds=HOUR10_S + 60,
                                                nanos=999_999_999), window_s=60.0, requests=2**32 - 1,
                                                input_tokens=10**12, output_tokens=10**12)
        assert wide.ByteSize() <= MAX_SAMPLE_BYTES
