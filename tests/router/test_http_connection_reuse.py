"""Issue 22, the HTTP front's TTFT under load: what the stage trace ruled out stays ruled out. Every
streamed request through the router reuses a pooled connection to its engine (a new one per request
would cost a handshake and an accept on the engine, all of it inside the upstream time that the
router's overhead histogram leaves out), and both of the router's sockets on the path (to the client,
to the engine) have TCP_NODELAY, so a token event is never held back by Nagle's algorithm waiting for a
delayed ACK (40 ms steps)."""

from __future__ import annotations

import json
import socket
from typing import Any

import aiohttp
import pytest
from greenserve.bench import router_engine as be
from greenserve.bench.router_engine import BenchEngine, expected_text, start
from greenserve.router.upstream.dispatcher import chunk_text


@pytest.fixture
def counted_connections(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the connections the bench engines of this test accept."""
    opened = [0]
    made = be._Conn.connection_made

    def connection_made(self: Any, transport: Any) -> None:
        opened[0] += 1
        made(self, transport)

    monkeypatch.setattr(be._Conn, "connection_made", connection_made)
    return opened


def _text(raw: bytes) -> str:
    """The generated text of an SSE body (the chunks' deltas joined)."""
    out = []
    for event in raw.decode().split("\n\n"):
        if event.startswith("data: ") and event != "data: [DONE]":
            obj = json.loads(event[6:])
            if obj.get("choices"):
                out.append(chunk_text(obj))
    return "".join(out)


async def _engine_url() -> tuple[Any, str]:
    server = await start(BenchEngine(tpot_s=0.001))
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize("include_usage", [False, True])
async def test_streamed_requests_reuse_the_upstream_connection(router, counted_connections, include_usage) -> None:
    server, url = await _engine_url()
    try:
        r = await router([url], scrape_interval_s=60.0, stale_after_s=120.0, health_interval_s=60.0)
        body: dict[str, Any] = {"model": "noop", "prompt": "a prompt " * 120, "max_tokens": 5, "stream": True}
        if include_usage:
            body["stream_options"] = {"include_usage": True}
        async with aiohttp.ClientSession() as session:
            for _ in range(3):  # warm: the router's own first connections (registration probe, scrape)
                async with session.post(r.http + "/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    await resp.read()
            before = counted_connections[0]
            for _ in range(20):
                async with session.post(r.http + "/v1/completions", json=body) as resp:
                    raw = await resp.read()
                    assert resp.status == 200 and raw.endswith(b"data: [DONE]\n\n")
                    assert _text(raw) == expected_text(5)
        assert counted_connections[0] - before == 0, f"{counted_connections[0] - before} new engine connections"
    finally:
        server.close()


async def test_router_sockets_on_the_stream_path_have_nodelay(router) -> None:
    server, url = await _engine_url()
    try:
        r = await router([url], scrape_interval_s=60.0, stale_after_s=120.0, health_interval_s=60.0)
        front = r.servicer.http
        assert front is not None
        body = {"model": "noop", "prompt": "a prompt", "max_tokens": 50, "stream": True}
        async with aiohttp.ClientSession() as session, session.post(r.http + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            await resp.content.readany()  # streaming now: both of the router's connections are open
            downstream = [p.transport.get_extra_info("socket") for p in front.guard.live if p.transport is not None]
            assert downstream
            for sock in downstream:
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            await resp.read()
        pooled = r.core.dispatcher.engines.idle_connections()
        assert pooled  # the engine connection went back to the pool
        for conn in pooled:
            sock = conn.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        server.close()
