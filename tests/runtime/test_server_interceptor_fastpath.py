"""The common ServerInterceptor's cheap per-RPC path (issue 22): the wrapped handler is built once per
method, no span is built when spans go nowhere and the caller sent no trace context (but a caller's trace is
still joined), and a streaming handler that writes with ``context.write`` keeps auth, error mapping and
metrics through the coroutine wrapper."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from greenserve.common.errors import InvalidArgument
from greenserve.common.server import ServerInterceptor
from greenserve.common.telemetry import Telemetry, setup_telemetry

SERVICE = "greenserve.test.Fast"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
TOKEN = "s3cret"


def _identity(data: bytes) -> bytes:
    return data


async def _serve(telemetry: Telemetry, token: str | None) -> tuple[grpc.aio.Server, str, dict[str, Any]]:
    seen: dict[str, Any] = {}

    async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        seen["trace_id"] = trace.get_current_span().get_span_context().trace_id
        return request

    async def stream(request: bytes, context: grpc.aio.ServicerContext) -> None:
        await context.write(b"first")
        if request == b"bad":
            raise InvalidArgument("prompt", "prompt is bad")
        if request == b"crash":
            raise RuntimeError("boom")
        await context.write(b"second")

    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, request_deserializer=_identity, response_serializer=_identity),
        "Stream": grpc.unary_stream_rpc_method_handler(stream, request_deserializer=_identity, response_serializer=_identity),
    }
    server = grpc.aio.server(interceptors=[ServerInterceptor("fast", telemetry, token)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}", seen


def _unary(channel: grpc.aio.Channel) -> Any:
    return channel.unary_unary(f"/{SERVICE}/Unary", request_serializer=_identity, response_deserializer=_identity)


def _stream(channel: grpc.aio.Channel) -> Any:
    return channel.unary_stream(f"/{SERVICE}/Stream", request_serializer=_identity, response_deserializer=_identity)


async def _read_all(call: Any) -> list[bytes]:
    return [msg async for msg in call]


async def test_wrapped_handler_is_built_once_per_method() -> None:
    telemetry = setup_telemetry("fast", install_global=False)
    interceptor = ServerInterceptor("fast", telemetry, None)
    handler = grpc.unary_unary_rpc_method_handler(_identity)
    other = grpc.unary_unary_rpc_method_handler(_identity)

    def details(method: str) -> Any:
        return SimpleNamespace(method=method, invocation_metadata=())

    async def cont(h: Any) -> Any:
        return h

    first = await interceptor.intercept_service(lambda d: cont(handler), details("/a/M"))
    second = await interceptor.intercept_service(lambda d: cont(handler), details("/a/M"))
    assert first is second and first is not handler
    # another handler object for the method (re-registered): wrapped anew, never the stale one
    third = await interceptor.intercept_service(lambda d: cont(other), details("/a/M"))
    assert third is not first
    assert await interceptor.intercept_service(lambda d: cont(None), details("/a/N")) is None


async def test_no_exporter_no_span_but_a_callers_trace_is_joined() -> None:
    telemetry = setup_telemetry("fast", install_global=False)  # no exporter: spans go nowhere
    server, address, seen = await _serve(telemetry, None)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            assert await _unary(channel)(b"x") == b"x"
            assert seen["trace_id"] == 0, "no span should be built when nothing records it"
            assert await _unary(channel)(b"x", metadata=(("traceparent", TRACEPARENT),)) == b"x"
            assert seen["trace_id"] == int(TRACE_ID, 16), "the caller's trace must still be joined"
    finally:
        await server.stop(0)


async def test_spans_recorded_when_exported() -> None:
    spans = InMemorySpanExporter()
    telemetry = setup_telemetry("fast", span_exporter=spans, install_global=False)
    server, address, seen = await _serve(telemetry, None)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            assert await _unary(channel)(b"x") == b"x"
            assert await _read_all(_stream(channel)(b"ok")) == [b"first", b"second"]
        names = [s.name for s in spans.get_finished_spans()]
        assert names == [f"{SERVICE}/Unary", f"{SERVICE}/Stream"]
        assert seen["trace_id"] == spans.get_finished_spans()[0].context.trace_id
    finally:
        await server.stop(0)


@pytest.mark.parametrize("token", [None, TOKEN])
async def test_writing_stream_handler_keeps_auth_errors_and_metrics(token: str | None) -> None:
    reader = InMemoryMetricReader()
    telemetry = setup_telemetry("fast", metric_reader=reader, install_global=False)
    server, address, _ = await _serve(telemetry, token)
    auth = (("authorization", f"Bearer {TOKEN}"),)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            assert await _read_all(_stream(channel)(b"ok", metadata=auth)) == [b"first", b"second"]
            got: list[bytes] = []
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for msg in _stream(channel)(b"bad", metadata=auth):
                    got.append(msg)
            assert got == [b"first"]
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "prompt" in err.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _read_all(_stream(channel)(b"crash", metadata=auth))
            assert err.value.code() == grpc.StatusCode.INTERNAL and "RuntimeError" in err.value.details()
            if token is not None:
                for metadata in ((), (("authorization", "Bearer wrong"),)):
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await _read_all(_stream(channel)(b"ok", metadata=metadata))
                    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        data = reader.get_metrics_data()
        counts = {
            point.attributes["rpc.grpc.status_code"]: point.value
            for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            if m.name == "greenserve.rpc.server.requests" for point in m.data.data_points
        }
        assert counts == {"OK": 1, "INVALID_ARGUMENT": 1, "INTERNAL": 1}
    finally:
        await server.stop(0)
