"""One response read from an engine connection (``EngineResponse``): the head parsed, the body framed and decoded,
handed to the fronts by queue or sink; the connections and their pool are in engine_pool.py.

* The head is parsed by hand (status, Content-Type, Content-Length, Transfer-Encoding, Connection; at most
  ``MAX_HEAD_BYTES``); the body is framed by Content-Length, chunked coding (any splits, chunk extensions,
  trailers) or the end of the connection. Anything malformed, a cut connection or a body over the cap of
  ``read`` raises ``EngineHttpError``: the dispatcher's failed attempt, never a hang.

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
from collections.abc import Callable
from typing import TYPE_CHECKING

from greenserve.router.upstream.engine_wire import (
    _CRLF,
    MAX_BODY_BYTES,
    MAX_CHUNK_LINE_BYTES,
    MAX_HEAD_BYTES,
    MAX_TRAILER_BYTES,
    EngineHttpError,
)

if TYPE_CHECKING:
    from greenserve.router.upstream.engine_pool import EngineConnection

RELEASE_TAIL_BYTES = 64 * 1024
"""Bytes of a released response still read (and dropped) while its body ends, before the connection closes."""

QUEUE_HIGH_BYTES = 256 * 1024
"""Decoded bytes queued and not yet taken above which reading from the engine pauses."""

# body framing
_BY_LENGTH, _CHUNKED, _TO_CLOSE = 0, 1, 2
# states of a response
_HEAD, _SIZE, _DATA, _DATA_END, _TRAILER, _BODY, _DONE, _FAILED = range(8)


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
        parts: list[bytes] = []
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
            length = next(iter(lengths))
            if not length.isdigit() or len(length) > 18:
                raise EngineHttpError(f"malformed Content-Length {length[:40]!r}")
            self._framing = _BY_LENGTH
            self._remaining = int(length)
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

