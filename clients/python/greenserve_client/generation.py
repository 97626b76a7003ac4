"""Reassembling a streamed ``RouterService.Generate``: the text, the engine, the finish reason and the receipt.

A Generate message carries the text of one or more tokens (the router gathers the tokens that reach it
together, and at most one message per ``--grpc-stream-interval-s``, further apart when many streams share
the router's ``--grpc-stream-messages-per-s``); ``token_count`` says how many. The
text of the whole generation is the concatenation of every message's ``text_delta`` in order, the last
message (finish reason and receipt) included.

    async with GreenserveClient.local() as gs:
        result = await generate(gs.router, router_pb2.GenerateRequest(...), on_text=print)
        result.text, result.receipt.total_g
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from greenserve.v1 import router_pb2, router_pb2_grpc


@dataclass
class Generation:
    """One Generate call, reassembled."""

    request_id: str = ""
    text: str = ""
    engine_id: str = ""
    finish_reason: str = ""
    receipt: router_pb2.CarbonReceipt | None = None
    messages: int = 0  # messages received
    tokens: int = 0  # sum of their token_count
    deltas: list[str] = field(default_factory=list)  # each message's text_delta, in order (empty ones too)


async def generate(stub: router_pb2_grpc.RouterServiceStub, request: router_pb2.GenerateRequest, *,
                   timeout_s: float | None = None, on_text: Callable[[str], object] | None = None) -> Generation:
    """Runs ``request`` through ``stub.Generate`` and reassembles the stream; ``on_text`` is called with each
    non-empty text delta as it arrives. gRPC errors (``grpc.aio.AioRpcError``) propagate; the text received
    before an error is lost with it, so a caller that needs it passes ``on_text``."""
    out = Generation()
    async for msg in stub.Generate(request, timeout=timeout_s):
        out.messages += 1
        out.tokens += msg.token_count
        out.deltas.append(msg.text_delta)
        if msg.text_delta and on_text is not None:
            on_text(msg.text_delta)
        if msg.request_id:
            out.request_id = msg.request_id
        if msg.engine_id and not out.engine_id:
            out.engine_id = msg.engine_id
        if msg.finish_reason:
            out.finish_reason = msg.finish_reason
        if msg.HasField("receipt"):
            out.receipt = msg.receipt
    out.text = "".join(out.deltas)
    return out
