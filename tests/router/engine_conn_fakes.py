"""A stand-in transport and helpers that drive an ``engine_pool.EngineConnection`` by hand (tests feed it
response bytes split any way they like, with no socket and no engine), and ``start_fake_engine``: a real
HTTP engine (aiohttp) whose completions the test writes, for tests through the router's fronts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from greenserve.router.upstream.engine_pool import EngineConnection
from greenserve.router.upstream.engine_response import EngineResponse

from tests.conftest import free_port

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class FakeTransport:
    """Records writes, closing and pausing, as an asyncio transport would do them."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False
        self.paused = False
        self.buffered = 0  # what get_write_buffer_size answers

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def connection(loop: asyncio.AbstractEventLoop | None = None) -> tuple[EngineConnection, FakeTransport]:
    """A connection (no pool) on a fake transport."""
    conn = EngineConnection(None, ("http", "engine", 80), loop or asyncio.get_running_loop())
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def open_stream(head: bytes = SSE_HEAD) -> tuple[EngineResponse, EngineConnection, FakeTransport]:
    """A response whose head (by default a chunked SSE one) is in."""
    conn, transport = connection()
    response = conn.start(b"POST /v1/completions HTTP/1.1\r\n\r\n")
    conn.data_received(head)
    return response, conn, transport


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body."""
    return b"%x\r\n" % len(data) + data + b"\r\n"


async def start_fake_engine(completions: Callable[[web.Request], Awaitable[web.StreamResponse]]
                            ) -> tuple[web.AppRunner, str]:
    """An engine on a free local port answering ``/v1/completions`` with ``completions`` and the routes the router
    probes (``/health``, ``/metrics``, ``/v1/models``: one model, "m"); returns its runner and URL."""

    async def health(request: web.Request) -> web.Response:
        return web.json_response({})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"
