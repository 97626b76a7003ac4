"""ListSweeps refuses a page token beyond any offset it returns as INVALID_ARGUMENT naming page_token.

The token is the row offset, parsed with int(): a token of 20 or more digits went into the query's OFFSET and the
SQLite driver's OverflowError came back as INTERNAL. Found by an adversarial audit of ListSweeps (failed before
the fix)."""

from __future__ import annotations

import grpc
import pytest

from greenserve.v1 import profiler_pb2


@pytest.mark.parametrize("token", [str(2**63), "1" + "0" * 30])
async def test_a_page_token_past_any_offset_is_invalid_argument(profiler, token: str) -> None:
    stub = await profiler(import_published=False)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListSweeps(profiler_pb2.ListSweepsRequest(page_token=token))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "page_token" in err.value.details()
