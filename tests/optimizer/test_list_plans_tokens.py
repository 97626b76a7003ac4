"""ListPlans refuses a page token that is no plan version as INVALID_ARGUMENT naming page_token.

The token was checked with str.isdigit() and a length of 20: '²' passes isdigit() but not int() (ValueError), and
a 20-digit number, or 2^63, went into the query and overflowed SQLite's integers; both came back as INTERNAL.
Found by an adversarial audit of ListPlans (failed before the fix)."""

from __future__ import annotations

import grpc
import pytest
from greenserve.v1 import optimizer_pb2, optimizer_pb2_grpc


@pytest.mark.parametrize("token", ["99999999999999999999", str(2**63), "²", "-1", "1e3"])
async def test_a_token_that_is_no_plan_version_is_invalid_argument(optimizer, token: str) -> None:
    running = await optimizer(schedule_plans=False)
    async with grpc.aio.insecure_channel(running.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await optimizer_pb2_grpc.OptimizerServiceStub(channel).ListPlans(
                optimizer_pb2.ListPlansRequest(page_token=token))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "page_token" in err.value.details()
