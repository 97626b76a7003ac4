"""The router's HTTP/1.1 client for requests to engines: a keep-alive pool (``EnginePool``) of
``asyncio.Protocol`` connections (``EngineConnection``); each response is an ``EngineResponse``
(engine_response.py).

Why not aiohttp's client: on the request path every token of every stream passes through the client. aiohttp's
costs a Python ``data_received``, its parser, a ``StreamReader`` and its flow control per token, and a request
pipeline (``ClientRequest``, yarl, tracing, timers) per request; the router's user CPU per request was about
twice that of vllm-router. This client does only what the router needs of an engine:

* ``EnginePool.post`` sends a POST as one prebuilt write (request line, Host, Content-Type: application/json,
  Content-Length, body) on an idle pooled connection to the engine's (scheme, host, port), or a new one
  (``connect_timeout_s``; TLS for https URLs), and returns once the response head is in (``EngineResponse``).
* A connection goes back to the pool only when its response was read to its end and neither side asked to
  close (``EngineResponse.release``); one that was cut, closed or left half-read is closed, which is how an
  engine (vLLM) learns to abort a request. The pool keeps at most ``max_idle_per_origin`` idle connections per
  origin, each at most ``idle_timeout_s``; a request whose reused connection turns out to be closed by the
  engine before any byte of its answer (the keep-alive race) is sent again once on a new connection.
* ``data_received`` offers a read that holds whole chunks to the response's ``raw_sink`` as it is (the fast
  path, engine_response.py) and feeds anything else to the response's decoder.
* An engine that stops sending in the middle of a response (its head in, the connection still open, the router
  reading) is cut after ``stream_idle_timeout_s``: the response fails with ``EngineHttpError`` and the
  connection closes (how vLLM aborts the request), so neither the client nor the router waits for ever. Per
  token this costs one attribute store in ``data_received`` (``heard``); one timer per pool, running while
  responses are in progress, looks at each busy connection every ``stall_check_interval_s`` (no timer per
  token or per request).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from urllib.parse import urlsplit

from greenserve.router.upstream.engine_response import _DONE, _HEAD, _SIZE, EngineResponse
from greenserve.router.upstream.engine_wire import EngineHttpError, whole_chunks


class EngineConnection(asyncio.Protocol):
    """One connection to an engine, carrying one request at a time (no pipelining)."""

    def __init__(self, pool: EnginePool | None, origin: tuple[str, str, int], loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.origin = origin
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.response: EngineResponse | None = None
        self.closed = False
        self.reading = True
        self.idle_since = 0.0
        self.reused = False
        self.heard = False  # bytes came since the pool's last stall check
        self.silent_since = 0.0  # loop time of the stall check that last found it heard (or not in a body)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        self.heard = True
        r = self.response
        if r is None:  # bytes on an idle connection: it is not trusted again
            self.close()
            return
        sink = r.raw_sink
        if sink is not None and r._state == _SIZE and not r._pending and not r._queue:
            chunks = whole_chunks(data)
            try:
                if chunks and sink(data, chunks):
                    return
            except Exception as exc:  # noqa: BLE001 - a front's bug must end this stream, not reach the loop
                r._fail(EngineHttpError(f"stream sink failed: {type(exc).__name__}: {exc}"))
                self.close()
                return
        r.feed(data)

    def eof_received(self) -> bool:
        return False  # the transport closes; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.pool is not None:
            self.pool._busy.discard(self)
        r = self.response
        if r is not None:
            r._connection_ended(exc)

    def set_reading(self, on: bool) -> None:
        transport = self.transport
        if on == self.reading or transport is None or self.closed:
            return
        self.reading = on
        if on:
            transport.resume_reading()
        else:
            transport.pause_reading()

    def start(self, request: bytes) -> EngineResponse:
        """Sends one request and returns its response (head not yet in; it fails at once when the
        connection is already closed)."""
        r = self.response = EngineResponse(self)
        if self.closed or self.transport is None or self.transport.is_closing():
            r._connection_ended(None)
        else:
            self.transport.write(request)
            if self.pool is not None:
                self.pool._started(self)
        return r

    def response_finished(self) -> None:
        self.response = None
        if self.pool is not None:
            self.pool._busy.discard(self)
        if not self.reading:
            self.set_reading(True)
        if self.pool is None or self.closed:
            self.close()
            return
        self.pool._put_idle(self)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        if self.pool is not None:
            self.pool._busy.discard(self)
        r = self.response
        if r is not None:
            r._connection_ended(None)


class _Origin:
    __slots__ = ("key", "host", "port", "ssl", "server_hostname", "prefix", "host_header")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EngineHttpError(f"engine URL {url!r} is not an http:// or https:// URL with a host")
        if parts.query or parts.fragment:
            raise EngineHttpError(f"engine URL {url!r} has a query or fragment")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise EngineHttpError(f"engine URL {url!r} has an invalid port") from None
        self.host = parts.hostname
        self.port = port
        self.key = (parts.scheme, self.host, port)
        self.ssl = parts.scheme == "https"
        self.server_hostname = self.host if self.ssl else None
        self.prefix = parts.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.ssl else 80
        if not host.isascii():
            host = self.host.encode("idna").decode("ascii")
        self.host_header = (host if port == default else f"{host}:{port}").encode("ascii")


IDLE_TIMEOUT_S = 4.0
"""Seconds a pooled engine connection is kept idle: under vLLM's own keep-alive timeout (uvicorn's
``timeout_keep_alive``, ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, 5 s by default), so that the router drops an idle
connection before the engine does and the keep-alive race (a request written onto a connection the engine is
closing; sent again once, above) stays rare."""

STREAM_IDLE_TIMEOUT_S = 120.0
"""Seconds an engine may send nothing in the middle of a response before the response fails and its connection
closes: well above vLLM's longest gaps between tokens (tens of seconds when its scheduler preempts a request
under memory pressure), so that only an engine that stalled is cut. Before the response head the dispatcher's
first-token timeout applies instead."""

STALL_CHECK_MAX_INTERVAL_S = 1.0
"""The longest interval between two stall checks; a stall is found between ``stream_idle_timeout_s`` and that
plus the interval (at most a quarter of the timeout) after the engine's last byte."""


class EnginePool:
    """Keep-alive connections per engine origin; see the module docstring."""

    def __init__(self, *, connect_timeout_s: float = 2.0, max_idle_per_origin: int = 512,
                 idle_timeout_s: float = IDLE_TIMEOUT_S, stream_idle_timeout_s: float = STREAM_IDLE_TIMEOUT_S,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        if connect_timeout_s <= 0 or idle_timeout_s <= 0 or max_idle_per_origin < 0 or stream_idle_timeout_s < 0:
            raise ValueError("connect_timeout_s and idle_timeout_s must be > 0, max_idle_per_origin and "
                             "stream_idle_timeout_s >= 0")
        self.connect_timeout_s = connect_timeout_s
        self.max_idle_per_origin = max_idle_per_origin
        self.idle_timeout_s = idle_timeout_s
        self.stream_idle_timeout_s = stream_idle_timeout_s  # 0: never cut (read at each stall check)
        self.ssl_context = ssl_context
        self._origins: dict[str, _Origin] = {}
        self._idle: dict[tuple[str, str, int], list[EngineConnection]] = {}
        self._busy: set[EngineConnection] = set()  # connections with a response in progress
        self._stall_timer: asyncio.TimerHandle | None = None
        self._last_sweep = time.monotonic()
        self.connections_opened = 0
        self._closed = False

    def idle_connections(self) -> list[EngineConnection]:
        """The idle connections now (for tests and diagnostics)."""
        return [c for conns in self._idle.values() for c in conns if not c.closed]

    def _origin(self, url: str) -> _Origin:
        origin = self._origins.get(url)
        if origin is None:
            if len(self._origins) > 4096:
                self._origins.clear()
            origin = self._origins[url] = _Origin(url)
        return origin

    async def post(self, url: str, path: str, body: bytes) -> EngineResponse:
        """POSTs ``body`` (JSON) to ``url`` + ``path``; returns once the response head is in."""
        if self._closed:
            raise EngineHttpError("engine pool closed")
        origin = self._origin(url)
        request = b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" \
            % ((origin.prefix + path).encode(), origin.host_header, len(body)) + body
        conn = self._take_idle(origin.key)
        if conn is not None:
            r = conn.start(request)
            try:
                await r._head_waiter
                return r
            except EngineHttpError:
                if r._got_bytes:
                    raise
                # the engine closed the idle connection before it read the request (the keep-alive race):
                # nothing was answered, so the request goes once more, on a new connection
            except BaseException:
                r.close()
                raise
        conn = await self._connect(origin)
        r = conn.start(request)
        try:
            await r._head_waiter
        except BaseException:
            r.close()
            raise
        return r

    async def _connect(self, origin: _Origin) -> EngineConnection:
        loop = asyncio.get_running_loop()
        ctx = None
        if origin.ssl:
            if self.ssl_context is None:  # built once: it loads the system's CA certificates
                self.ssl_context = ssl.create_default_context()
            ctx = self.ssl_context
        conn = EngineConnection(self, origin.key, loop)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await loop.create_connection(lambda: conn, origin.host, origin.port, ssl=ctx,
                                             server_hostname=origin.server_hostname)
        except TimeoutError:
            conn.close()
            raise EngineHttpError(f"connect to {origin.host}:{origin.port} timed out after "
                                  f"{self.connect_timeout_s:g}s") from None
        except OSError as exc:
            raise EngineHttpError(f"cannot connect to {origin.host}:{origin.port}: {exc}") from None
        except BaseException:
            conn.close()
            raise
        self.connections_opened += 1
        return conn

    def _take_idle(self, key: tuple[str, str, int]) -> EngineConnection | None:
        conns = self._idle.get(key)
        if not conns:
            return None
        oldest = time.monotonic() - self.idle_timeout_s
        while conns:
            conn = conns.pop()
            if not conn.closed and conn.idle_since >= oldest:
                conn.reused = True
                return conn
            conn.close()
        return None

    def _put_idle(self, conn: EngineConnection) -> None:
        if self._closed:
            conn.close()
            return
        now = time.monotonic()
        conns = self._idle.setdefault(conn.origin, [])
        if len(conns) >= self.max_idle_per_origin:
            conn.close()
        else:
            conn.idle_since = now
            conns.append(conn)
        if now - self._last_sweep > self.idle_timeout_s / 2:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Closes connections idle longer than ``idle_timeout_s`` (they are at the bottom of each stack)."""
        self._last_sweep = now
        oldest = now - self.idle_timeout_s
        for conns in self._idle.values():
            stale = 0
            while stale < len(conns) and (conns[stale].closed or conns[stale].idle_since < oldest):
                conns[stale].close()
                stale += 1
            if stale:
                del conns[:stale]

    @property
    def stall_check_interval_s(self) -> float:
        return min(self.stream_idle_timeout_s / 4, STALL_CHECK_MAX_INTERVAL_S)

    def _started(self, conn: EngineConnection) -> None:
        """A request went out on ``conn``: its connection is watched for stalls until its response ends."""
        self._busy.add(conn)
        if self._stall_timer is None and self.stream_idle_timeout_s > 0:
            self._stall_timer = conn.loop.call_later(self.stall_check_interval_s, self._check_stalls, conn.loop)

    def _check_stalls(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cuts the responses whose engine sent nothing for ``stream_idle_timeout_s``; runs again while any
        response is in progress. A connection's silence counts from the last check that found bytes since the
        one before (so it is never counted longer than it was), and not while its response awaits its head (the
        first-token timeout's time), has ended, or its reading is paused (the router's client is behind)."""
        self._stall_timer = None
        timeout = self.stream_idle_timeout_s
        if timeout <= 0 or not self._busy:
            return
        now = loop.time()
        stalled = []
        for conn in self._busy:
            r = conn.response
            if conn.heard or not conn.reading or r is None or r._state == _HEAD or r._state >= _DONE:
                conn.heard = False
                conn.silent_since = now
            elif now - conn.silent_since >= timeout:
                stalled.append(conn)
        for conn in stalled:  # closing takes each out of _busy
            r = conn.response
            if r is not None:
                r._fail(EngineHttpError(f"engine sent nothing for {timeout:g} s"))
            conn.close()
        if self._busy:
            self._stall_timer = loop.call_later(self.stall_check_interval_s, self._check_stalls, loop)

    async def close(self) -> None:
        """Closes every idle connection; connections in use close when their response ends."""
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
