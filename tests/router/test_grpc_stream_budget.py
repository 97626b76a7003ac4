"""Generate's stream path: the message budget that widens the interval as streams grow, and the reader's
hook (the engine response's data_sink) that gathers the engine's chunks between messages (no queue or
wake-up per token) and cuts the wait short at the end of the stream."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from greenserve.router.front.service import RouterServicer, RouterSettings, _EventReader
from greenserve.router.upstream.dispatcher import TEXT_KEY_COMPLETION
from greenserve.router.upstream.engine_pool import EngineConnection
from greenserve.router.upstream.engine_response import EngineResponse
from greenserve.v1 import router_pb2
from greenserve_client.generation import generate

from tests.router.engine_conn_fakes import chunk, open_stream


def _servicer(**settings: float) -> RouterServicer:
    values = {"grpc_stream_interval_s": 0.05, "grpc_stream_messages_per_s": 2000.0,
              "grpc_stream_max_interval_s": 0.25, **settings}
    return RouterServicer(SimpleNamespace(settings=SimpleNamespace(**values)), core=None)  # type: ignore[arg-type]


def test_interval_widens_with_the_streams_in_flight() -> None:
    s = _servicer()
    for streams, want in ((0, 0.05), (64, 0.05), (100, 0.05), (256, 0.128), (400, 0.2), (1000, 0.25), (10**6, 0.25)):
        s.streams = streams
        assert s.interval_s() == pytest.approx(want), streams
    # no budget: the fixed interval; interval 0 (one message per read) stays 0 whatever the load
    s = _servicer(grpc_stream_messages_per_s=0.0)
    s.streams = 1000
    assert s.interval_s() == 0.05
    s = _servicer(grpc_stream_interval_s=0.0)
    s.streams = 1000
    assert s.interval_s() == 0.0
    # a cap below the base interval never narrows it
    s = _servicer(grpc_stream_max_interval_s=0.01)
    s.streams = 1000
    assert s.interval_s() == 0.05


def test_settings_defaults_and_bounds() -> None:
    st = RouterSettings()
    assert (st.grpc_stream_interval_s, st.grpc_stream_messages_per_s, st.grpc_stream_max_interval_s) == \
        (0.05, 500.0, 1.0)
    with pytest.raises(ValueError, match="grpc_stream_messages_per_s"):
        RouterSettings(grpc_stream_messages_per_s=-1)
    with pytest.raises(ValueError, match="grpc_stream_max_interval_s"):
        RouterSettings(grpc_stream_max_interval_s=10)


def _token(text: str) -> bytes:
    obj = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": None}],
           "usage": None}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _final() -> bytes:
    obj = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "!", "finish_reason": "length"}],
           "usage": None}
    usage = {"id": "c", "object": "text_completion", "choices": [], "usage": {"completion_tokens": 4}}
    return b"".join(b"data: " + json.dumps(o, separators=(",", ":")).encode() + b"\n\n" for o in (obj, usage)) + \
        b"data: [DONE]\n\n"


def _reader() -> tuple[_EventReader, EngineResponse, EngineConnection, SimpleNamespace]:
    response, conn, _ = open_stream()
    call = SimpleNamespace(response=response, tail=b"", done=False, events=1)
    return _EventReader(call, TEXT_KEY_COMPLETION), response, conn, call  # type: ignore[arg-type]


async def test_hook_gathers_chunks_in_order_and_the_end_cuts_the_wait_short() -> None:
    reader, content, conn, call = _reader()
    assert content.data_sink == reader._hook
    # tokens decoded by the engine connection go to the hook, not to the response's queue; a split event
    # (and a split chunk) is joined
    whole = _token("b")
    for data in (chunk(_token("a")), chunk(whole[:10]), chunk(whole[10:])[:5], chunk(whole[10:])[5:],
                 chunk(_token("c"))):
        conn.data_received(data)
    assert content.read_nowait() == b"" and b"".join(reader.chunks) == _token("a") + whole + _token("c")
    reader.drain()
    assert reader.take() == "abc" and reader.take_tokens() == 3 and not reader.chunks
    # a long gather ends as soon as [DONE] arrives
    task = asyncio.create_task(reader.gather(30.0))
    await asyncio.sleep(0)
    conn.data_received(chunk(_token("d") + _final()) + b"0\r\n\r\n")
    await asyncio.wait_for(task, 10.0)
    reader.drain()
    assert reader.ended and call.done
    assert reader.take() == "d!" and reader.take_tokens() == 2 and reader.reason == "length"
    assert reader.usage == {"completion_tokens": 4}
    reader.close()
    assert content.data_sink is None


async def test_read_waits_on_the_stream_itself_and_sees_its_end() -> None:
    reader, content, conn, call = _reader()
    task = asyncio.create_task(reader.read())
    await asyncio.sleep(0)
    assert content.data_sink is None  # unhooked while it waits: the next chunk wakes it
    conn.data_received(chunk(_token("x")))
    await asyncio.wait_for(task, 10.0)
    assert content.data_sink == reader._hook and reader.take() == "x"
    # the engine ends its body without [DONE]: the stream ends, call.done stays False
    conn.data_received(chunk(_token("y")[:12]) + b"0\r\n\r\n")
    for _ in range(2):  # the cut last event is taken first, then the end is seen
        await asyncio.wait_for(reader.read(), 10.0)
    assert reader.ended and not call.done and reader.take() == ""
    reader.close()


async def test_generate_under_the_budget_reassembles_the_text(emulators, router) -> None:
    # a budget of 1 message per second with 1 stream: the interval widens to its cap (0.2 s); the text and
    # token count are whole, and a request shorter than the interval still ends (the end cuts the wait)
    (emu,) = await emulators(1)
    r = await router([emu.url], grpc_stream_interval_s=0.01, grpc_stream_messages_per_s=1.0,
                     grpc_stream_max_interval_s=0.2)
    desc = router_pb2.RequestDescriptor(model=emu.model, completion=router_pb2.CompletionInput(prompt="hello"))
    got = await generate(r.stub, router_pb2.GenerateRequest(request=desc, sampling=router_pb2.SamplingParams(
        max_tokens=64)), timeout_s=60)
    assert got.tokens == 64 and got.receipt is not None and got.receipt.completion_tokens == 64
    assert got.messages < got.tokens
    assert r.servicer.streams == 0  # the stream count is given back


async def test_an_engine_error_keeps_what_the_hook_took() -> None:
    # tokens taken by the hook, then the connection fails: they still go out before the error
    reader, content, conn, call = _reader()
    conn.data_received(chunk(_token("p") + _token("q")))
    conn.connection_lost(ConnectionResetError("connection lost"))
    reader.drain()
    assert reader.ended and not call.done and reader.take() == "pq"
    reader.close()
