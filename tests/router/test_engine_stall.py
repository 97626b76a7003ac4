"""An engine that stalls in the middle of a response (no byte for ``stream_idle_timeout_s``, connection still
open) is cut: the response fails with an ``EngineHttpError`` naming the stall and the engine sees its connection
closed; the HTTP front then ends the stream with an error event and Generate with UNAVAILABLE. A timeout of 0
never cuts, a slow but steady engine is not cut, and neither is one whose reading the router paused."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable

import aiohttp
import grpc
import pytest
from aiohttp import web
from greenserve.common.config import load_settings
from greenserve.router.settings import RouterSettings
from greenserve.router.upstream.engine_pool import STREAM_IDLE_TIMEOUT_S, EnginePool
from greenserve.router.upstream.engine_wire import EngineHttpError
from greenserve.v1 import router_pb2

from tests.router.engine_conn_fakes import chunk, start_fake_engine

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
TOKEN = b'data: {"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":"one",' \
    b'"finish_reason":null}]}\n\n'
TIMEOUT_S = 0.3


class _Engine:
    """A tiny engine on a socket: answers one POST with what ``send`` writes, then waits for the router to close
    the connection and notes when it did."""

    def __init__(self, send: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> None:
        self.send = send
        self.closed = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"Content-Length: (\d+)", head)
        await reader.readexactly(int(length.group(1)) if length else 0)
        await self.send(writer)
        while await reader.read(65536):  # b"" once the router closed the connection
            pass
        self.closed.set()
        writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def _head_and_one_token(writer: asyncio.StreamWriter) -> None:
    writer.write(SSE_HEAD + chunk(TOKEN))
    await writer.drain()


async def test_a_stalled_stream_fails_within_the_timeout_and_its_connection_closes() -> None:
    engine = _Engine(_head_and_one_token)
    url = await engine.start()
    pool = EnginePool(stream_idle_timeout_s=TIMEOUT_S)
    try:
        resp = await pool.post(url, "/v1/completions", b"{}")
        assert await resp.readany() == TOKEN
        t0 = time.monotonic()
        with pytest.raises(EngineHttpError, match=r"engine sent nothing for 0\.3 s"):
            await asyncio.wait_for(resp.readany(), 5.0)
        elapsed = time.monotonic() - t0
        assert 0.25 <= elapsed < 1.0, elapsed
        await asyncio.wait_for(engine.closed.wait(), 1.0)  # closing it is how vLLM learns to abort the request
        assert not pool._busy and pool._stall_timer is None  # nothing left to watch: the timer stopped
        resp.release()  # the failed response's connection is not pooled
        assert pool.idle_connections() == []
    finally:
        await pool.close()
        await engine.stop()


async def test_a_timeout_of_zero_never_cuts() -> None:
    engine = _Engine(_head_and_one_token)
    url = await engine.start()
    pool = EnginePool(stream_idle_timeout_s=0)
    try:
        resp = await pool.post(url, "/v1/completions", b"{}")
        assert await resp.readany() == TOKEN
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(resp.readany(), 1.0)
        assert not engine.closed.is_set() and not resp.ended
        resp.close()
        await asyncio.wait_for(engine.closed.wait(), 1.0)
    finally:
        await pool.close()
        await engine.stop()


async def test_a_slow_but_steady_engine_is_not_cut() -> None:
    # a byte every 0.1 s for 1.5 s (five times the timeout): every byte restarts the silence
    body = b"x" * 15

    async def slow(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body))
        for i in range(len(body)):
            await asyncio.sleep(0.1)
            writer.write(body[i : i + 1])
            await writer.drain()

    engine = _Engine(slow)
    url = await engine.start()
    pool = EnginePool(stream_idle_timeout_s=TIMEOUT_S)
    try:
        resp = await pool.post(url, "/v1/completions", b"{}")
        assert await asyncio.wait_for(resp.read(), 5.0) == body
        assert resp.done
        resp.release()
        assert len(pool.idle_connections()) == 1 and not engine.closed.is_set()
    finally:
        await pool.close()
        await engine.stop()


async def test_a_paused_read_is_not_a_stall() -> None:
    # the router's own client is behind: the engine's silence while the router does not read is not counted
    engine = _Engine(_head_and_one_token)
    url = await engine.start()
    pool = EnginePool(stream_idle_timeout_s=TIMEOUT_S)
    try:
        resp = await pool.post(url, "/v1/completions", b"{}")
        assert await resp.readany() == TOKEN
        resp.pause_reading()
        await asyncio.sleep(1.0)
        assert not resp.ended and not engine.closed.is_set()
        resp.resume_reading()
        t0 = time.monotonic()
        with pytest.raises(EngineHttpError, match="engine sent nothing"):
            await asyncio.wait_for(resp.readany(), 5.0)
        assert 0.25 <= time.monotonic() - t0 < 1.0
        await asyncio.wait_for(engine.closed.wait(), 1.0)
    finally:
        resp.close()
        await pool.close()
        await engine.stop()


def test_settings_default_bounds_and_flag() -> None:
    assert RouterSettings().engine_stream_idle_timeout_s == STREAM_IDLE_TIMEOUT_S == 120.0
    assert RouterSettings(engine_stream_idle_timeout_s=0).engine_stream_idle_timeout_s == 0
    with pytest.raises(ValueError, match="engine_stream_idle_timeout_s"):
        RouterSettings(engine_stream_idle_timeout_s=-1)
    with pytest.raises(ValueError, match="stream_idle_timeout_s"):
        EnginePool(stream_idle_timeout_s=-1)


def test_settings_flag_and_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--engine-stream-idle-timeout-s", "0.5"]
    assert load_settings(RouterSettings, argv).engine_stream_idle_timeout_s == 0.5
    monkeypatch.setenv("GREENSERVE_ENGINE_STREAM_IDLE_TIMEOUT_S", "7.5")
    assert RouterSettings().engine_stream_idle_timeout_s == 7.5


# -- through the fronts ---------------------------------------------------------------------------------------


async def _start_stalling_engine() -> tuple[web.AppRunner, str, asyncio.Event]:
    """An engine (aiohttp) whose completions send the head and one token, then nothing; ``closed`` is set once
    the router closed the connection."""
    closed = asyncio.Event()

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(TOKEN)
        while request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(0.02)
        closed.set()
        return resp

    runner, url = await start_fake_engine(completions)
    return runner, url, closed


async def test_http_front_ends_a_stalled_stream_with_an_error_event(router) -> None:
    runner, url, closed = await _start_stalling_engine()
    try:
        r = await router([url], engine_stream_idle_timeout_s=TIMEOUT_S)
        body = {"model": "m", "prompt": "hello", "max_tokens": 8, "stream": True}
        t0 = time.monotonic()
        async with aiohttp.ClientSession() as s, s.post(r.http + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            raw = await asyncio.wait_for(resp.read(), 5.0)
        assert time.monotonic() - t0 < 2.0
        events = [json.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
        assert events[0]["choices"][0]["text"] == "one"
        assert "stopped mid-stream" in events[-1]["error"]["message"]
        await asyncio.wait_for(closed.wait(), 1.0)
    finally:
        await runner.cleanup()


async def test_generate_ends_a_stalled_stream_with_unavailable(router) -> None:
    runner, url, closed = await _start_stalling_engine()
    try:
        r = await router([url], grpc_stream_interval_s=0.0, engine_stream_idle_timeout_s=TIMEOUT_S)
        desc = router_pb2.RequestDescriptor(model="m", completion=router_pb2.CompletionInput(prompt="hello"))
        request = router_pb2.GenerateRequest(request=desc, sampling=router_pb2.SamplingParams(max_tokens=8))
        texts = []
        t0 = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for msg in r.stub.Generate(request, timeout=5.0):
                texts.append(msg.text_delta)
        assert time.monotonic() - t0 < 2.0
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "stopped mid-stream" in (err.value.details() or "")
        assert "".join(texts) == "one"
        await asyncio.wait_for(closed.wait(), 1.0)
    finally:
        await runner.cleanup()


async def test_the_setting_reaches_the_engine_pool(router) -> None:
    assert RouterSettings(engine_stream_idle_timeout_s=0.5).core_config().engine_stream_idle_timeout_s == 0.5
    r = await router([], engine_stream_idle_timeout_s=0.3)
    assert r.core.dispatcher.engines.stream_idle_timeout_s == 0.3
