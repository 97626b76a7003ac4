"""bench_grpc_message: the wire bytes its pre-serialised variant sends are exactly protobuf's, and a bad
--variants is refused (exit 2) before anything starts."""

from __future__ import annotations

import pytest
from greenserve.bench.router_grpc_message import generate_response_bytes, main
from greenserve.v1 import router_pb2


@pytest.mark.parametrize("fields", [
    {},
    {"request_id": "r-1", "text_delta": " token", "token_count": 1},
    {"text_delta": "h\u00e9llo \U0001f600" * 50, "token_count": 300, "engine_id": "e" * 200},
    {"finish_reason": "length", "engine_id": "engine-a"},
])
def test_wire_bytes_equal_protobuf(fields: dict) -> None:
    assert generate_response_bytes(**fields) == router_pb2.GenerateResponse(**fields).SerializeToString()


def test_wire_bytes_with_a_receipt() -> None:
    receipt = router_pb2.CarbonReceipt(engine_id="e", pool="p", completion_tokens=7)
    want = router_pb2.GenerateResponse(request_id="r", finish_reason="stop", receipt=receipt).SerializeToString()
    assert generate_response_bytes(request_id="r", finish_reason="stop", receipt=receipt.SerializeToString()) == want


def test_unknown_variant_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--variants", "aio_write,nope"]) == 2
    assert "--variants: unknown nope" in capsys.readouterr().err
