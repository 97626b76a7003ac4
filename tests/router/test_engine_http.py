"""The router's engine client (engine_pool.py, engine_response.py, engine_wire.py): chunked decoding over any
splits, malformed answers as clear errors, keep-alive reuse only of connections whose response was read to its
end, Connection: close, read-to-close bodies, the raw fast path and the pause of the engine read behind a slow
client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from greenserve.bench.router_engine import BenchEngine, start
from greenserve.router.front import http_front
from greenserve.router.upstream.engine_pool import EngineConnection, EnginePool
from greenserve.router.upstream.engine_response import QUEUE_HIGH_BYTES
from greenserve.router.upstream.engine_wire import EngineHttpError, whole_chunks

from tests.router.engine_conn_fakes import FakeTransport, chunk, connection, open_stream

EVENTS = [b'data: {"choices":[{"text":"a","finish_reason":null}]}\n\n',
          b'data: {"choices":[{"text":"bc","finish_reason":null}]}\n\n',
          b'data: {"choices":[{"text":"","finish_reason":"stop"}]}\n\ndata: [DONE]\n\n']
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
# chunk extensions, an upper-case size with a leading zero and a trailer: all of it legal chunked coding
BODY = (chunk(EVENTS[0]) + b"%X;name=value\r\n" % len(EVENTS[1]) + EVENTS[1] + b"\r\n"
        + b"0" + chunk(EVENTS[2]) + b"0;last\r\nX-Trailer: 1\r\n\r\n")


def _drain(response: Any) -> bytes:
    out = []
    while True:
        data = response.read_nowait()
        if not data:
            return b"".join(out)
        out.append(data)


async def test_chunked_body_decodes_the_same_at_every_split_point() -> None:
    whole = HEAD + BODY
    for i in range(1, len(whole)):
        for j in (i, min(i + 7, len(whole))):  # one split, and two (every 3-piece split would be n^2 runs)
            conn, _ = connection()
            r = conn.start(b"POST / HTTP/1.1\r\n\r\n")
            for part in (whole[:i], whole[i:j], whole[j:]):
                if part:
                    conn.data_received(part)
            assert r.status == 200 and r.content_type == "text/event-stream", i
            assert _drain(r) == b"".join(EVENTS), (i, j)
            assert r.done, (i, j)
    # byte by byte too
    conn, _ = connection()
    r = conn.start(b"POST / HTTP/1.1\r\n\r\n")
    for k in range(len(whole)):
        conn.data_received(whole[k : k + 1])
    assert _drain(r) == b"".join(EVENTS) and r.done  # the trailer is read and dropped


@pytest.mark.parametrize(("answer", "reason"), [
    (b"HTTP/2 200 OK\r\n\r\n", "malformed status line"),
    (b"HTTP/1.1 2000 OK\r\n\r\n", "malformed status line"),
    (b"garbage\r\n\r\n", "malformed status line"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", "conflicting Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "malformed Content-Length"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70000, "response head larger than"),
    (HEAD + b"zz\r\nab\r\n", "malformed chunk size"),
    (HEAD + b"2\r\nabXY", "chunk data not followed by CRLF"),
    (HEAD + b"1" * 5000, "chunk-size line longer than"),
    (HEAD + b"0\r\n" + b"T: x\r\n" * 3000, "chunked trailer larger than"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "closed in the middle of the response body"),
    (HEAD + b"5\r\nab", "closed in the middle of the response body"),
    (b"HTTP/1.1 200 O", "closed in the middle of the response head"),
    (b"", "closed before the response head"),
])
async def test_malformed_or_cut_answers_are_errors_that_say_why(answer: bytes, reason: str) -> None:
    conn, transport = connection()
    r = conn.start(b"POST / HTTP/1.1\r\n\r\n")
    conn.data_received(answer)
    conn.connection_lost(None)  # the engine closes after its answer
    with pytest.raises(EngineHttpError, match=reason):
        await r._head_waiter
        await r.read()
    assert not r.done


async def test_content_length_and_read_to_close_bodies_and_the_read_cap() -> None:
    r, conn, _ = open_stream(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":")
    conn.data_received(b"1}")
    assert await r.read() == b'{"a":1}' and r.done and r._keep_alive
    # no length, no chunking: the body ends with the connection, which is never reused
    r, conn, _ = open_stream(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"b\"")
    conn.data_received(b":2}")
    conn.connection_lost(None)
    assert await r.read() == b'{"b":2}' and r.done and not r._keep_alive
    # a body over the cap of a whole-body read
    r, conn, transport = open_stream(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100)
    with pytest.raises(EngineHttpError, match="larger than 10 bytes"):
        await r.read(10)
    assert transport.closed


def test_whole_chunks_accepts_only_whole_plain_chunks() -> None:
    a, b = chunk(EVENTS[0]), chunk(EVENTS[1])
    assert whole_chunks(a) == 1 and whole_chunks(a + b) == 2
    for bad in (a[:-1], a + b[:5], b"0\r\n\r\n", a + b"0\r\n\r\n", b"5;x=1\r\nhello\r\n", b"5\r\nhelloXY"):
        assert whole_chunks(bad) == 0, bad


async def test_raw_sink_gets_whole_chunks_at_a_boundary_and_the_rest_is_decoded_in_order() -> None:
    r, conn, _ = open_stream()
    taken: list[bytes] = []
    r.raw_sink = lambda data, chunks: taken.append(data) or True
    two = chunk(EVENTS[0]) + chunk(EVENTS[1])
    conn.data_received(two)
    assert taken == [two] and r.read_nowait() == b""
    # a partial chunk goes the general way, and so does what follows until the decoder is at a boundary
    conn.data_received(two[:10])
    conn.data_received(two[10:])
    assert taken == [two] and _drain(r) == EVENTS[0] + EVENTS[1]
    # a sink that declines leaves the bytes to the general path
    r.raw_sink = lambda data, chunks: False
    conn.data_received(chunk(EVENTS[2]) + b"0\r\n\r\n")
    assert _drain(r) == EVENTS[2] and r.done


async def test_a_full_queue_pauses_the_engine_read_until_it_is_taken() -> None:
    r, conn, transport = open_stream()
    piece = chunk(b"x" * 65536)
    while not transport.paused:
        conn.data_received(piece)
        assert r._queued <= QUEUE_HIGH_BYTES + 65536
    assert await r.readany() and not transport.paused


async def test_a_slow_client_pauses_the_engine_read_until_it_drains() -> None:
    r, conn, engine_transport = open_stream()
    client = FakeTransport()
    call: Any = type("C", (), {"events": 0})()
    forward = http_front._Forwarder(call, r, client)
    r.raw_sink = forward
    conn.data_received(chunk(EVENTS[0]))
    assert client.written == [chunk(EVENTS[0])] and call.events == 1 and not engine_transport.paused
    client.buffered = http_front._DIRECT_WRITE_MAX_BUFFERED  # the client stops reading
    conn.data_received(chunk(EVENTS[1]))
    assert engine_transport.paused and call.events == 2
    await asyncio.sleep(4 * http_front._WRITABLE_POLL_S)
    assert engine_transport.paused  # still behind: still paused
    client.buffered = 0
    for _ in range(100):
        await asyncio.sleep(http_front._WRITABLE_POLL_S)
        if not engine_transport.paused:
            break
    assert not engine_transport.paused
    # final events are never forwarded raw: they reach the handler decoded
    conn.data_received(chunk(EVENTS[2]))
    assert len(client.written) == 2 and _drain(r) == EVENTS[2]


# -- over real sockets -------------------------------------------------------------------------------------


async def _scripted_engine(answer: Callable[[int, bytes], bytes | None]) -> tuple[asyncio.Server, str, list[int]]:
    """An engine answering request ``n`` of each connection with ``answer(n, request)`` (None: close without an
    answer); returns the server, its URL and a one-item list counting accepted connections."""
    accepted = [0]

    class Engine(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            accepted[0] += 1
            self.transport = transport
            self.buf = b""
            self.n = 0

        def data_received(self, data: bytes) -> None:
            self.buf += data
            head, sep, rest = self.buf.partition(b"\r\n\r\n")
            if not sep:
                return
            length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length")), b"0"))
            if len(rest) < length:
                return
            self.buf = rest[length:]
            out = answer(self.n, head + b"\r\n\r\n" + rest[:length])
            self.n += 1
            if out is None:
                self.transport.close()
            else:
                self.transport.write(out)
                if b"Connection: close" in out:
                    self.transport.close()

    server = await asyncio.get_running_loop().create_server(Engine, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", accepted


def _json(body: bytes, close: bool = False) -> bytes:
    extra = b"Connection: close\r\n" if close else b""
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n" % (extra, len(body)) \
        + body


async def test_keep_alive_reuse_and_never_after_an_abort_or_a_close() -> None:
    seen: list[bytes] = []

    def answer(n: int, request: bytes) -> bytes:
        seen.append(request)
        return HEAD + BODY

    server, url, accepted = await _scripted_engine(answer)
    pool = EnginePool()
    try:
        for _ in range(3):  # read to the end: one connection for all three
            r = await pool.post(url + "/prefix", "/v1/completions", b'{"x":1}')
            assert await r.read() == b"".join(EVENTS)
            r.release()
        assert accepted[0] == 1 and pool.connections_opened == 1
        assert seen[0].startswith(b"POST /prefix/v1/completions HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"Content-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"x\":1}" in seen[0]
        # half-read, then closed (an abort): the connection is not reused
        r = await pool.post(url, "/v1/completions", b"{}")
        r.close()
        assert pool.idle_connections() == []
        r = await pool.post(url, "/v1/completions", b"{}")
        assert await r.read() and accepted[0] == 2
        r.release()
        # released while the body's end is still on its way: pooled once it is in
        r = await pool.post(url, "/v1/completions", b"{}")
        assert await r.readany()
        r.release()
        await asyncio.sleep(0.05)
        assert len(pool.idle_connections()) == 1
    finally:
        await pool.close()
        server.close()
    # Connection: close from the engine, and a body without length: never reused
    for body in (_json(b"{}", close=True), b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{}"):
        server, url, accepted = await _scripted_engine(lambda n, req, body=body: body)
        pool = EnginePool()
        try:
            for _ in range(2):
                r = await pool.post(url, "/v1/completions", b"{}")
                assert await r.read() == b"{}"
                r.release()
            assert accepted[0] == 2 and pool.idle_connections() == []
        finally:
            await pool.close()
            server.close()


async def test_an_idle_connection_the_engine_closed_is_replaced_once_and_connect_errors_say_why() -> None:
    # the engine closes each connection after its first answer (as an idle timeout would)
    server, url, accepted = await _scripted_engine(lambda n, req: _json(b"{}") if n == 0 else None)
    pool = EnginePool()
    try:
        for _ in range(3):
            r = await pool.post(url, "/v1/completions", b"{}")
            assert await r.read() == b"{}"
            r.release()
            await asyncio.sleep(0.02)
        assert accepted[0] == 3
    finally:
        await pool.close()
        server.close()
    await server.wait_closed()
    pool = EnginePool()
    with pytest.raises(EngineHttpError, match="cannot connect to 127.0.0.1"):
        await pool.post(url, "/v1/completions", b"{}")
    with pytest.raises(EngineHttpError, match="not an http:// or https:// URL"):
        await pool.post("ftp://x", "/v1/completions", b"{}")
    await pool.close()


async def test_a_malformed_engine_is_a_failed_attempt_and_the_request_goes_elsewhere(router) -> None:
    def answer(n: int, request: bytes) -> bytes:
        if request.startswith(b"GET /v1/models"):  # the model lookup is answered well; generation is not
            return _json(b'{"data":[{"id":"noop"}]}')
        if request.startswith(b"GET"):
            return _json(b"{}")
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"

    bad, bad_url, _ = await _scripted_engine(answer)
    good = await start(BenchEngine(tpot_s=0.001))
    good_url = f"http://127.0.0.1:{good.sockets[0].getsockname()[1]}"
    try:
        r = await router([bad_url, good_url], scrape_interval_s=60.0, stale_after_s=120.0, health_interval_s=60.0)
        body = {"model": "noop", "prompt": "p", "max_tokens": 4, "stream": True}
        async with aiohttp.ClientSession() as s:
            for _ in range(4):
                async with s.post(r.http + "/v1/completions", json=body) as resp:
                    raw = await resp.read()
                    assert resp.status == 200 and raw.endswith(b"data: [DONE]\n\n"), raw[:300]
        assert r.core.dispatcher.upstream_failures >= 1
    finally:
        bad.close()
        good.close()


async def test_the_http_front_streams_exactly_the_engines_events(router) -> None:
    server = await start(BenchEngine(tpot_s=0.0005))
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        r = await router([url], scrape_interval_s=60.0, stale_after_s=120.0, health_interval_s=60.0)
        body = {"model": "noop", "prompt": "a prompt", "max_tokens": 200, "stream": True,
                "stream_options": {"include_usage": True}}
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/completions", json=body) as resp:
                direct = (await resp.read()).split(b"\n\n")
            async with s.post(r.http + "/v1/completions", json=body) as resp:
                routed = (await resp.read()).split(b"\n\n")
        assert len(routed) == len(direct) == 200 + 3  # tokens, usage, [DONE], the empty rest
        assert routed[:199] == direct[:199]  # every running event byte for byte
        last, usage = json.loads(routed[200][6:]), json.loads(direct[200][6:])
        assert "greenserve" in last and {k: v for k, v in last.items() if k != "greenserve"} == usage
    finally:
        server.close()


async def test_a_stream_released_before_its_last_chunk_is_pooled_once_it_ends() -> None:
    pool = EnginePool()
    for tail, pooled in ((b"0\r\n\r\n", True), (chunk(b"x" * 70000), False)):
        conn = EngineConnection(pool, ("http", "engine", 80), asyncio.get_running_loop())
        transport = FakeTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        r = conn.start(b"POST / HTTP/1.1\r\n\r\n")
        conn.data_received(HEAD + chunk(EVENTS[2]))  # [DONE] is in; the terminating 0-chunk is not
        assert await r.readany() == EVENTS[2] and not r.done
        r.release()  # the caller is done with it
        assert pool.idle_connections() == [] and not transport.closed
        conn.data_received(tail)  # the end comes: pooled; more body instead: closed, never pooled
        assert (pool.idle_connections() == [conn]) is pooled and transport.closed is not pooled
        await pool.close()
        pool = EnginePool()
