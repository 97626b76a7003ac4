"""Generate's stream path: the message budget that widens the interval as streams grow, and the reader's
hook that gathers the engine's chunks between messages (no StreamReader bookkeeping per token) and cuts
the wait short at the end of the stream."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from unittest import mock

import aiohttp
import pytest
from greenserve.router.service import RouterServicer, RouterSettings, _EventReader
from greenserve.router.upstream import TEXT_KEY_COMPLETION, HookedReader, stream_hooks
from greenserve.v1 import router_pb2
from greenserve_client.generation import generate


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
        (0.05, 2000.0, 0.25)
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


def _reader() -> tuple[_EventReader, aiohttp.StreamReader, SimpleNamespace]:
    protocol = mock.Mock(_reading_paused=False)
    content = aiohttp.StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())
    call = SimpleNamespace(response=SimpleNamespace(content=content), tail=b"", done=False, events=1)
    return _EventReader(call, TEXT_KEY_COMPLETION), content, call  # type: ignore[arg-type]


async def test_hook_gathers_chunks_in_order_and_the_end_cuts_the_wait_short() -> None:
    reader, content, call = _reader()
    assert type(content) is HookedReader and stream_hooks[id(content)] == reader._hook
    # tokens fed by the response parser go to the hook, not to aiohttp's buffer; a split event is joined
    whole = _token("b")
    for chunk in (_token("a"), whole[:10], whole[10:], _token("c")):
        content.feed_data(chunk)
    assert content.read_nowait() == b"" and len(reader.chunks) == 4
    reader.drain()
    assert reader.take() == "abc" and reader.take_tokens() == 3 and not reader.chunks
    # a long gather ends as soon as [DONE] arrives
    task = asyncio.create_task(reader.gather(30.0))
    await asyncio.sleep(0)
    content.feed_data(_token("d") + _final())
    await asyncio.wait_for(task, 10.0)
    reader.drain()
    assert reader.ended and call.done
    assert reader.take() == "d!" and reader.take_tokens() == 2 and reader.reason == "length"
    assert reader.usage == {"completion_tokens": 4}
    reader.close()
    assert id(content) not in stream_hooks


async def test_read_waits_on_the_stream_itself_and_sees_its_end() -> None:
    reader, content, call = _reader()
    task = asyncio.create_task(reader.read())
    await asyncio.sleep(0)
    assert id(content) not in stream_hooks  # unhooked while it waits: the next chunk wakes it
    content.feed_data(_token("x"))
    await asyncio.wait_for(task, 10.0)
    assert id(content) in stream_hooks and reader.take() == "x"
    # the engine goes away without [DONE]: the stream ends, call.done stays False
    content.feed_data(_token("y")[:12])
    content.feed_eof()
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
    reader, content, call = _reader()
    content.feed_data(_token("p") + _token("q"))
    content.set_exception(aiohttp.ClientPayloadError("connection lost"))
    reader.drain()
    assert reader.ended and not call.done and reader.take() == "pq"
    reader.close()
