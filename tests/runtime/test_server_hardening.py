"""The shared runtime against hostile input (issue 21): undecodable request bytes, echoed values in error
messages, and token rotation (several accepted bearer tokens at once)."""

from __future__ import annotations

import logging

import grpc
import pytest

from greenserve.common.client import ChannelConfig, create_channel
from greenserve.common.config import split_tokens
from greenserve.common.errors import MAX_ERROR_MESSAGE_CHARS, InvalidArgument, NotFound, shown, truncate_middle
from greenserve.optimizer.service import OptimizerSettings, build
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc

ESTIMATE = "/greenserve.v1.OptimizerService/EstimateCarbon"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
GARBAGE = b"\xff\xff\xff\x0a\x05ab"  # a varint that never ends: not an EstimateCarbonRequest


def _raw_unary(channel: grpc.aio.Channel, method: str):
    return channel.unary_unary(method, request_serializer=None, response_deserializer=None)


def _server_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith(("greenserve.server", "grpc"))]


async def test_undecodable_bytes_get_invalid_argument_and_one_short_log_line(start_inprocess, caplog) -> None:
    svc = await start_inprocess(OptimizerSettings, build)
    caplog.set_level(logging.INFO)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        for _ in range(20):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _raw_unary(channel, ESTIMATE)(GARBAGE, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "greenserve.v1.EstimateCarbonRequest" in err.value.details()
        # Truncated bytes of a real request are refused the same way.
        good = optimizer_pb2.EstimateCarbonRequest(energy_kwh=1, ci_g_per_kwh=1, duration_s=1).SerializeToString()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _raw_unary(channel, ESTIMATE)(good[:-5], timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # The service still answers well-formed calls.
        reply = await _raw_unary(channel, ESTIMATE)(good, timeout=5)
        assert optimizer_pb2.EstimateCarbonResponse.FromString(reply).carbon.total_g > 0
    records = _server_records(caplog)
    assert not [r for r in records if r.exc_info or r.levelno >= logging.ERROR], "no traceback, no ERROR line"
    warnings = [r for r in records if r.levelno == logging.WARNING and r.getMessage() == "undecodable request"]
    assert len(warnings) == 1, "rate-limited: one WARNING line for 21 undecodable requests in a burst"
    assert warnings[0].rpc_method == ESTIMATE and warnings[0].error == "DecodeError"


async def test_undecodable_bytes_in_a_request_stream_get_invalid_argument(start_inprocess) -> None:
    svc = await start_inprocess(OptimizerSettings, build)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        call = channel.stream_stream(REFLECTION, request_serializer=None, response_deserializer=None)(
            iter([GARBAGE]), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_unauthenticated_undecodable_bytes_are_refused_unparsed_and_unlogged(start_inprocess, caplog) -> None:
    svc = await start_inprocess(OptimizerSettings, build, auth_token="s3cret")
    caplog.set_level(logging.INFO)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        for _ in range(5):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _raw_unary(channel, ESTIMATE)(GARBAGE, timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # With the token the same bytes are a client error, not UNKNOWN.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _raw_unary(channel, ESTIMATE)(GARBAGE, timeout=5, metadata=(("authorization", "Bearer s3cret"),))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not [r for r in _server_records(caplog) if r.levelno >= logging.WARNING and r.getMessage() != "undecodable request"]
    assert len([r for r in _server_records(caplog) if r.getMessage() == "undecodable request"]) == 1


def test_error_messages_are_cut_keeping_the_field_and_the_reason() -> None:
    huge = "x" * 100_000
    err = InvalidArgument("pool", f"unknown pool {huge!r}; known: a, b")
    assert len(err.message) <= MAX_ERROR_MESSAGE_CHARS
    assert err.message.startswith("unknown pool 'xxx") and err.message.endswith("known: a, b")
    assert "chars cut]" in err.message
    status = err.to_status("optimizer")
    assert len(status.SerializeToString()) < 4 * MAX_ERROR_MESSAGE_CHARS
    assert len(str(NotFound(huge))) <= MAX_ERROR_MESSAGE_CHARS
    assert len(InvalidArgument("p" * 10_000, "bad").field) <= 256
    assert truncate_middle("short", 10) == "short"
    assert len(shown("y" * 1000)) <= 128 and shown("a\nb\x00") == repr("a\nb\x00")


async def test_a_100_kb_bad_value_comes_back_as_invalid_argument_not_resource_exhausted(start_inprocess) -> None:
    svc = await start_inprocess(OptimizerSettings, build, max_message_bytes=64 * 1024)
    request = optimizer_pb2.EstimateCarbonRequest(
        energy_kwh=1, ci_g_per_kwh=1, duration_s=1,
        carbon_params=common_pb2.CarbonParams(components=[common_pb2.EmbodiedComponent(
            kind=common_pb2.COMPONENT_KIND_GPU, name="." + "z" * 50_000, count=1, embodied_g=1.0)]),
    )
    async with grpc.aio.insecure_channel(svc.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await optimizer_pb2_grpc.OptimizerServiceStub(channel).EstimateCarbon(request, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()[:300]
    assert len(err.value.details()) <= MAX_ERROR_MESSAGE_CHARS + 300


def test_token_lists_split_on_commas_and_newlines() -> None:
    assert split_tokens(" old , new\nnewer\n\n,old") == ["old", "new", "newer"]
    assert split_tokens("") == []
    settings = OptimizerSettings.model_validate({"auth_token": "old,new"})
    assert settings.tokens() == ["old", "new"] and settings.token() == "old"


async def test_two_tokens_are_accepted_during_a_rotation(start_inprocess, tmp_path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text("new-token\nold-token\n")
    svc = await start_inprocess(OptimizerSettings, build, auth_token_file=token_file)
    assert svc.server.settings.token() == "new-token"

    async def status(token: str | None) -> grpc.StatusCode:
        channel = create_channel(ChannelConfig(address=svc.address, token=token))
        try:
            await optimizer_pb2_grpc.OptimizerServiceStub(channel).EstimateCarbon(
                optimizer_pb2.EstimateCarbonRequest(energy_kwh=1, ci_g_per_kwh=1, duration_s=1), timeout=5)
            return grpc.StatusCode.OK
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        finally:
            await channel.close()

    assert await status("old-token") == grpc.StatusCode.OK
    assert await status("new-token") == grpc.StatusCode.OK
    assert await status("new-token,old-token") == grpc.StatusCode.UNAUTHENTICATED
    assert await status("other") == grpc.StatusCode.UNAUTHENTICATED
    assert await status(None) == grpc.StatusCode.UNAUTHENTICATED


async def test_bearer_scheme_in_any_case_and_nothing_else_is_accepted(start_inprocess) -> None:
    svc = await start_inprocess(OptimizerSettings, build, auth_token="s3cret")
    request = optimizer_pb2.EstimateCarbonRequest(energy_kwh=1, ci_g_per_kwh=1, duration_s=1)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = optimizer_pb2_grpc.OptimizerServiceStub(channel)
        for header in ("Bearer s3cret", "bearer s3cret", "BEARER  s3cret "):
            await stub.EstimateCarbon(request, timeout=5, metadata=(("authorization", header),))
        for header in ("s3cret", "Basic s3cret", "Bearer s3cret2", "Bearer", "Bearer s3cre", "Bearers3cret"):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.EstimateCarbon(request, timeout=5, metadata=(("authorization", header),))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, header


async def test_a_request_stream_cut_for_size_is_never_applied(start_inprocess) -> None:
    """A message over --max-message-bytes in a client stream: the caller gets RESOURCE_EXHAUSTED, and the handler
    (which reads the whole stream, then applies it) must not apply the messages before it."""
    from greenserve.common.server import registration
    from greenserve.v1 import forecaster_pb2, forecaster_pb2_grpc

    applied: list[int] = []

    class Recorder(forecaster_pb2_grpc.ForecasterServiceServicer):
        async def StreamLoad(self, request_iterator, context):  # gRPC method name
            samples = [s async for s in request_iterator]
            applied.append(len(samples))
            return forecaster_pb2.StreamLoadResponse(accepted_samples=len(samples))

    svc = await start_inprocess(
        OptimizerSettings, lambda ctx: [registration(forecaster_pb2, forecaster_pb2_grpc, "ForecasterService",
                                                     Recorder())], max_message_bytes=64 * 1024)
    oversized = b"\x0a\x80\x80\x08" + b"x" * 131_072  # field 1 (pool), 128 KiB
    async with grpc.aio.insecure_channel(svc.address) as channel:
        call = channel.stream_unary("/greenserve.v1.ForecasterService/StreamLoad", None, None)
        for i in range(40):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(iter([b""] * (1 + i % 3) + [oversized]), timeout=10)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        reply = await call(iter([b"", b""]), timeout=10)
    assert forecaster_pb2.StreamLoadResponse.FromString(reply).accepted_samples == 2
    assert applied == [2], "only the stream that arrived whole was applied"
