"""The router's HTTP/1.1 client for requests to engines: a keep-alive pool of ``asyncio.Protocol`` connections.

Why not aiohttp's client: on the request path every token of every stream passes through the client. aiohttp's
costs a Python ``data_received``, its parser, a ``StreamReader`` and its flow control per token, and a request
pipeline (``ClientRequest``, yarl, tracing, timers) per request; the router's user CPU per request was about
twice that of vllm-router (issue 22). This client does only what the router needs of an engine:

* ``EnginePool.post`` sends a POST as one prebuilt write (request line, Host, Content-Type: application/json,
  Content-Length, body) on an idle pooled connection to the engine's (scheme, host, port), or a new one
  (``connect_timeout_s``; TLS for https URLs), and returns once the response head is in (``EngineResponse``).
* The head is parsed by hand (status, Content-Type, Content-Length, Transfer-Encoding, Connection; at most
  ``MAX_HEAD_BYTES``); the body is framed by Content-Length, chunked coding (any splits, chunk extensions,
  trailers) or the end of the connection. Anything malformed, a cut connection or a body over the cap of
  ``read`` raises ``EngineHttpError``: the dispatcher's failed attempt, never a hang.
* A connection goes back to the pool only when its response was read to its end and neither side asked to
  close; one that was cut, closed or left half-read is closed, which is how an engine (vLLM) learns to abort a
  request. The pool keeps at most ``max_idle_per_origin`` idle connections per origin, each at most
  ``idle_timeout_s``; a request whose reused connection turns out to be closed by the engine before any byte of
  its answer (the keep-alive race) is sent again once on a new connection.

Streaming: decoded body bytes are queued for ``readany`` / ``read_nowait``, or handed to ``data_sink`` when one
is set (the gRPC front gathers them). The fast path is ``raw_sink``: when the chunk decoder is at a chunk
boundary, nothing is queued and one ``data_received`` holds exactly one or more whole chunks (plain hex sizes,
no terminating 0-chunk), the raw bytes are offered to ``raw_sink(data, chunks)`` as they are; when it returns
True they were taken (the HTTP front writes them to its own chunked response unchanged). Per token that path is
one Python call into the protocol, one regex match per chunk and the sink: no task, future or dict lookup.
Queued bytes above ``QUEUE_HIGH_BYTES`` pause reading from the engine until they are taken; the fronts pause it
too (``pause_reading``) while their own client is behind.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024
"""Bytes a response head (status line and headers) may take."""

MAX_CHUNK_LINE_BYTES = 4096
"""Bytes a chunk-size line (size and extensions) may take."""

MAX_TRAILER_BYTES = 16 * 1024
"""Bytes the trailer section of a chunked body may take."""

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Default cap of a whole-body ``read`` (a non-streamed completion is far smaller)."""

RELEASE_TAIL_BYTES = 64 * 1024
"""Bytes of a released response still read (and dropped) while its body ends, before the connection closes."""

QUEUE_HIGH_BYTES = 256 * 1024
"""Decoded bytes queued and not yet taken above which reading from the engine pauses."""

_SIZE_LINE = re.compile(rb"([0-9a-fA-F]{1,15})\r\n")
_CRLF = b"\r\n"

# body framing
_BY_LENGTH, _CHUNKED, _TO_CLOSE = 0, 1, 2
# states of a response
_HEAD, _SIZE, _DATA, _DATA_END, _TRAILER, _BODY, _DONE, _FAILED = range(8)


class EngineHttpError(Exception):
    """An exchange with an engine failed: connect error or timeout, a malformed or cut response, a body over its
    cap. Before the first token the dispatcher retries on another engine."""


def whole_chunks(data: bytes) -> int:
    """The number of chunks when ``data`` is exactly one or more whole chunks of a chunked body (plain hex
    sizes, no extensions, none of size 0), else 0."""
    n = 0
    i = 0
    end = len(data)
    match = _SIZE_LINE.match
    while i < end:
        m = match(data, i)
        if m is None:
            return 0
        size = int(m.group(1), 16)
        if not size:
            return 0
        i = m.end() + size + 2
        if i > end or data[i - 2 : i] != _CRLF:
            return 0
        n += 1
    return n


class EngineResponse:
    """One response read from an engine connection; see the module docstring.

    ``status``, ``content_type`` (lower case, without parameters), ``headers`` (lower-case names, last value
    wins) are set once the head is in. ``raw_sink`` and ``data_sink`` are set by the fronts."""

    __slots__ = ("conn", "status", "content_type", "headers", "raw_sink", "data_sink", "_state", "_framing",
                 "_remaining", "_pending", "_queue", "_queued", "_waiter", "_error", "_keep_alive", "_got_bytes",
                 "_queue_full", "_paused", "_head_waiter", "_remaining_tail")

    def __init__(self, conn: EngineConnection) -> None:
        self.conn: EngineConnection | None = conn
        self.status = 0
        self.content_type = ""
        self.headers: dict[str, str] = {}
        self.raw_sink: Callable[[bytes, int], bool] | None = None
        self.data_sink: Callable[[bytes], object] | None = None
        self._state = _HEAD
        self._framing = _TO_CLOSE
        self._remaining = 0
        self._pending = b""  # a partial head, size line, chunk end or trailer
        self._queue: list[bytes] = []
        self._queued = 0
        self._waiter: asyncio.Future[None] | None = None
        self._head_waiter: asyncio.Future[None] = conn.loop.create_future()
        self._error: EngineHttpError | None = None
        self._keep_alive = True
        self._got_bytes = False
        self._queue_full = False
        self._paused = False  # by the front (its client is behind)
        self._remaining_tail = 0

    # -- state ------------------------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """True once the body was read to its end."""
        return self._state == _DONE

    @property
    def ended(self) -> bool:
        """True once nothing more will come (the end of the body, or an error)."""
        return self._state >= _DONE

    def __repr__(self) -> str:
        return f"<EngineResponse {self.status} state={self._state} queued={self._queued}>"

    # -- reading ------------------------------------------------------------------------------------------------

    async def readany(self) -> bytes:
        """The decoded body bytes that came since the last read (waits for some); b"" at the end of the body;
        ``EngineHttpError`` when the response broke off (what came before it is returned first)."""
        while not self._queue:
            if self._state >= _DONE:
                if self._error is not None:
                    raise self._error
                return b""
            waiter = self._waiter = self.conn.loop.create_future()  # type: ignore[union-attr]
            try:
                await waiter
            finally:
                self._waiter = None
        return self.read_nowait()

    def read_nowait(self) -> bytes:
        """The decoded body bytes queued now (b"" when none); ``EngineHttpError`` when none are and the
        response broke off."""
        queue = self._queue
        if not queue:
            if self._error is not None:
                raise self._error
            return b""
        data = queue[0] if len(queue) == 1 else b"".join(queue)
        queue.clear()
        self._queued = 0
        if self._queue_full:
            self._queue_full = False
            self._update_reading()
        return data

    async def read(self, max_bytes: int = MAX_BODY_BYTES) -> bytes:
        """The whole (rest of the) body; ``EngineHttpError`` past ``max_bytes`` or when it broke off."""
        parts = []
        total = 0
        while True:
            data = await self.readany()
            if not data:
                return b"".join(parts)
            total += len(data)
            if total > max_bytes:
                self.close()
                raise EngineHttpError(f"response body larger than {max_bytes} bytes")
            parts.append(data)

    # -- flow control --------------------------------------------------------------------------------------------

    def pause_reading(self) -> None:
        """Stops reading from the engine (the caller's own client is behind) until ``resume_reading``."""
        self._paused = True
        self._update_reading()

    def resume_reading(self) -> None:
        self._paused = False
        self._update_reading()

    def _update_reading(self) -> None:
        conn = self.conn
        if conn is not None:
            conn.set_reading(not (self._paused or self._queue_full))

    # -- end -------------------------------------------------------------------------------------------------------

    def release(self) -> None:
        """Gives the connection back to the pool when the body was read to its end and it may be kept
        alive; closes it otherwise. A streamed body whose last bytes (the terminating 0-chunk after an SSE
        stream's [DONE]) are still on their way is let finish first: at most ``RELEASE_TAIL_BYTES`` more are
        read and dropped, then the connection goes back to the pool (or closes when it breaks off)."""
        conn = self.conn
        if conn is None:
            return
        self.raw_sink = None
        if self._state == _DONE and self._keep_alive:
            self.conn = None
            self.data_sink = None
            conn.response_finished()
        elif self._state < _DONE and self._keep_alive and self._framing != _TO_CLOSE:
            self._queue.clear()
            self._queued = 0
            self._paused = self._queue_full = False
            self._update_reading()
            self._remaining_tail = RELEASE_TAIL_BYTES
            self.data_sink = self._drop_tail
        else:
            self.conn = None
            self.data_sink = None
            conn.close()

    def _drop_tail(self, data: bytes) -> None:
        self._remaining_tail -= len(data)
        if self._remaining_tail < 0:
            self.close()

    def close(self) -> None:
        """Closes the connection (how an engine learns to abort the request); idempotent."""
        conn = self.conn
        if conn is None:
            return
        self.conn = None
        self.raw_sink = self.data_sink = None
        conn.close()
        if self._state < _DONE:
            self._fail(EngineHttpError("response closed by the router"))

    # -- feeding (from the protocol) ---------------------------------------------------------------------------

    def _fail(self, error: EngineHttpError) -> None:
        if self._state >= _DONE:
            return
        self._state = _FAILED
        self._error = error
        self._keep_alive = False
        if not self._head_waiter.done():
            self._head_waiter.set_exception(error)
            self._head_waiter.exception()  # retrieved: no "never retrieved" warning when nobody waits
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _emit(self, data: bytes) -> None:
        sink = self.data_sink
        if sink is not None:
            sink(data)
            return
        self._queue.append(data)
        self._queued += len(data)
        if self._queued > QUEUE_HIGH_BYTES and not self._queue_full:
            self._queue_full = True
            self._update_reading()
        self._wake()

    def _finish_body(self) -> None:
        self._state = _DONE
        if self.data_sink is not None and self.data_sink == self._drop_tail:  # released before its end
            conn = self.conn
            self.conn = None
            self.data_sink = None
            if conn is not None:
                if self._keep_alive:
                    conn.response_finished()
                else:
                    conn.close()
            return
        self._wake()

    def feed(self, data: bytes) -> None:
        """Takes bytes read from the connection (the general path: head, then the body decoded)."""
        self._got_bytes = True
        state = self._state
        if state == _HEAD:
            self._feed_head(data)
            return
        if state == _BODY:
            if self._framing == _TO_CLOSE:
                self._emit(data)
                return
            remaining = self._remaining
            if len(data) < remaining:
                self._remaining = remaining - len(data)
                self._emit(data)
                return
            if remaining:
                self._emit(data[:remaining] if len(data) > remaining else data)
            self._remaining = 0
            if len(data) > remaining:
                self._keep_alive = False  # bytes past the end of the body: the connection is not trusted again
            self._finish_body()
            return
        if state >= _DONE:
            if data:
                self._keep_alive = False
            return
        self._feed_chunked(data)

    def _feed_head(self, data: bytes) -> None:
        buf = self._pending + data if self._pending else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    self._fail(EngineHttpError(f"response head larger than {MAX_HEAD_BYTES} bytes"))
                    return
                self._pending = buf
                return
            if end > MAX_HEAD_BYTES:
                self._fail(EngineHttpError(f"response head larger than {MAX_HEAD_BYTES} bytes"))
                return
            try:
                informational = self._parse_head(buf[:end])
            except EngineHttpError as exc:
                self._fail(exc)
                return
            buf = buf[end + 4 :]
            if not informational:
                break
        self._pending = b""
        if not self._head_waiter.done():
            self._head_waiter.set_result(None)
        if self._state == _DONE:
            if buf:
                self._keep_alive = False
            return
        if buf:
            self.feed(buf)

    def _parse_head(self, head: bytes) -> bool:
        """Parses a head; True when it was an informational (1xx) one, to be skipped."""
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") or len(parts[1]) != 3 \
                or not parts[1].isdigit():
            raise EngineHttpError(f"malformed status line {lines[0][:80]!r}")
        status = int(parts[1])
        if status < 100:
            raise EngineHttpError(f"malformed status line {lines[0][:80]!r}")
        if 100 <= status < 200:
            if status == 101:
                raise EngineHttpError("engine switched protocols (HTTP 101)")
            return True
        headers: dict[str, str] = {}
        lengths: set[str] = set()
        chunked = False
        codings = False
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
                raise EngineHttpError(f"malformed header line {line[:80]!r}")
            try:
                key = name.decode("ascii").lower()
                text = value.strip(b" \t").decode("latin-1")
            except UnicodeDecodeError:
                raise EngineHttpError(f"malformed header name {name[:80]!r}") from None
            if key == "content-length":
                lengths.update(v.strip() for v in text.split(","))
            elif key == "transfer-encoding":
                codings = True
                chunked = text.lower().replace(" ", "").split(",")[-1] == "chunked"
            headers[key] = text
        self.status = status
        self.headers = headers
        self.content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        connection = headers.get("connection", "").lower()
        self._keep_alive = parts[0] == b"HTTP/1.1" and "close" not in connection \
            or parts[0] == b"HTTP/1.0" and "keep-alive" in connection
        if status in (204, 304):
            self._state = _DONE
            return False
        if codings:
            if lengths:
                self._keep_alive = False  # both framings given (RFC 9112 6.3): chunked wins, never reused
            if chunked:
                self._framing = _CHUNKED
                self._state = _SIZE
            else:
                self._framing = _TO_CLOSE
                self._keep_alive = False
                self._state = _BODY
            return False
        if lengths:
            if len(lengths) != 1:
                raise EngineHttpError(f"conflicting Content-Length values {sorted(lengths)}")
            value = next(iter(lengths))
            if not value.isdigit() or len(value) > 18:
                raise EngineHttpError(f"malformed Content-Length {value[:40]!r}")
            self._framing = _BY_LENGTH
            self._remaining = int(value)
            self._state = _BODY if self._remaining else _DONE
            return False
        self._framing = _TO_CLOSE
        self._keep_alive = False
        self._state = _BODY
        return False

    def _feed_chunked(self, data: bytes) -> None:
        if self._pending:
            data = self._pending + data
            self._pending = b""
        i = 0
        end = len(data)
        while i < end:
            state = self._state
            if state == _DATA:
                take = min(self._remaining, end - i)
                self._emit(data[i : i + take] if take < end or i else data)
                i += take
                self._remaining -= take
                if not self._remaining:
                    self._state = _DATA_END
                if self._state >= _DONE:
                    return
            elif state == _SIZE:
                j = data.find(b"\r\n", i)
                if j < 0:
                    if end - i > MAX_CHUNK_LINE_BYTES:
                        self._fail(EngineHttpError(f"chunk-size line longer than {MAX_CHUNK_LINE_BYTES} bytes"))
                    else:
                        self._pending = data[i:]
                    return
                if j - i > MAX_CHUNK_LINE_BYTES:
                    self._fail(EngineHttpError(f"chunk-size line longer than {MAX_CHUNK_LINE_BYTES} bytes"))
                    return
                line = data[i:j].split(b";", 1)[0].strip(b" \t")
                if not line or len(line) > 15 or line.strip(b"0123456789abcdefABCDEF"):
                    self._fail(EngineHttpError(f"malformed chunk size {data[i:j][:40]!r}"))
                    return
                size = int(line, 16)
                i = j + 2
                if size:
                    self._remaining = size
                    self._state = _DATA
                else:
                    self._state = _TRAILER
                    self._remaining = 0  # trailer bytes seen
            elif state == _DATA_END:
                need = data[i : i + 2]
                if len(need) < 2:
                    if need != b"\r":
                        self._fail(EngineHttpError("chunk data not followed by CRLF"))
                    else:
                        self._pending = need
                    return
                if need != _CRLF:
                    self._fail(EngineHttpError("chunk data not followed by CRLF"))
                    return
                i += 2
                self._state = _SIZE
            elif state == _TRAILER:
                j = data.find(b"\r\n", i)
                if j < 0:
                    if self._remaining + end - i > MAX_TRAILER_BYTES:
                        self._fail(EngineHttpError(f"chunked trailer larger than {MAX_TRAILER_BYTES} bytes"))
                    else:
                        self._pending = data[i:]
                    return
                self._remaining += j + 2 - i
                if self._remaining > MAX_TRAILER_BYTES:
                    self._fail(EngineHttpError(f"chunked trailer larger than {MAX_TRAILER_BYTES} bytes"))
                    return
                empty = j == i
                i = j + 2
                if empty:
                    if i < end:
                        self._keep_alive = False
                    self._finish_body()
                    return
            else:  # done or failed: nothing more is read into this response
                self._keep_alive = False
                return

    def _connection_ended(self, exc: BaseException | None) -> None:
        """The connection closed (by the engine, a reset or the router)."""
        self._keep_alive = False
        if self._state >= _DONE:
            return
        if self._state == _HEAD and self._pending:
            self._fail(EngineHttpError("connection closed in the middle of the response head"))
        elif self._state == _HEAD:
            why = f": {exc}" if exc else ""
            self._fail(EngineHttpError(f"connection closed before the response head{why}"))
        elif self._state == _BODY and self._framing == _TO_CLOSE:
            self._finish_body()
        else:
            why = f": {exc}" if exc else ""
            self._fail(EngineHttpError(f"connection closed in the middle of the response body{why}"))


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

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
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
        return r

    def response_finished(self) -> None:
        self.response = None
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


class EnginePool:
    """Keep-alive connections per engine origin; see the module docstring."""

    def __init__(self, *, connect_timeout_s: float = 2.0, max_idle_per_origin: int = 512,
                 idle_timeout_s: float = IDLE_TIMEOUT_S, ssl_context: ssl.SSLContext | None = None) -> None:
        if connect_timeout_s <= 0 or idle_timeout_s <= 0 or max_idle_per_origin < 0:
            raise ValueError("connect_timeout_s and idle_timeout_s must be > 0, max_idle_per_origin >= 0")
        self.connect_timeout_s = connect_timeout_s
        self.max_idle_per_origin = max_idle_per_origin
        self.idle_timeout_s = idle_timeout_s
        self.ssl_context = ssl_context
        self._origins: dict[str, _Origin] = {}
        self._idle: dict[tuple[str, str, int], list[EngineConnection]] = {}
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

    async def close(self) -> None:
        """Closes every idle connection; connections in use close when their response ends."""
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
