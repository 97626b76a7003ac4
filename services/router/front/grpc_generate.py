"""The Generate streaming path of the router's gRPC servicer: the message budget (``interval_s``), the
reader hooked into the engine's SSE stream (``_EventReader``) and the building of GenerateResponse chunks.

`GenerateStream` is mixed into `RouterServicer` (service.py), which sets ``core`` and calls
``_init_stream_budget``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import grpc
from greenserve.common.errors import (
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from greenserve.router.core import RouterCore
from greenserve.router.front.grpc_requests import _body, describe
from greenserve.router.routing.policy import UnknownTargetError
from greenserve.router.routing.prefix_index import chain_hashes
from greenserve.router.upstream.dispatcher import (
    TEXT_KEY_CHAT,
    TEXT_KEY_COMPLETION,
    Call,
    RouteRequest,
    UpstreamUnavailable,
    chunk_text,
    complete_events,
    event_data,
    running_text,
)
from greenserve.router.upstream.engine_wire import EngineHttpError, UpstreamClientError
from greenserve.v1 import router_pb2


class GenerateStream:
    """Generate of greenserve.v1.RouterService, with the router-wide gRPC message budget."""

    core: RouterCore

    def _init_stream_budget(self, settings: Any) -> None:
        """The message budget's settings (``--grpc-stream-*``; absent ones read as 0)."""
        self.stream_interval_s = float(getattr(settings, "grpc_stream_interval_s", 0.0))
        self.stream_messages_per_s = float(getattr(settings, "grpc_stream_messages_per_s", 0.0))
        self.stream_max_interval_s = max(self.stream_interval_s,
                                         float(getattr(settings, "grpc_stream_max_interval_s", 0.0)))
        self.streams = 0  # Generate streams past their first token, now

    def interval_s(self) -> float:
        """The least time between two messages of a stream now: ``--grpc-stream-interval-s``, widened when
        the streams in flight would together send more than ``--grpc-stream-messages-per-s`` (each then
        gets its share of that budget), at most ``--grpc-stream-max-interval-s``."""
        base = self.stream_interval_s
        if not base or not self.stream_messages_per_s:
            return base
        share = self.streams / self.stream_messages_per_s
        return base if share <= base else min(share, self.stream_max_interval_s)

    async def Generate(self, request: router_pb2.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        """Streams the output with ``context.write`` from this one coroutine (no async-generator layer
        resumed per message). The first token goes out at once; after it, a message carries every token
        that arrived since the previous one and goes at most once per the stream's interval
        (``interval_s``: ``--grpc-stream-interval-s``, widened under the router-wide message budget
        ``--grpc-stream-messages-per-s``; ``token_count`` says how many tokens it carries); the end of the
        engine's stream cuts the wait short; the last message carries what is still
        pending with the finish reason and the receipt. A gRPC message costs the router several times
        what a forwarded token costs over HTTP (grpc.aio's completion round trip through its poller
        thread), so fewer, larger messages are what makes this path cheap. See docs/router.md."""
        core = self.core
        # admission first: a refused request costs no work (the message itself is bounded by
        # --max-message-bytes in the gRPC core, which answers RESOURCE_EXHAUSTED naming the limit)
        if not core.admit():
            core.count_failure("grpc", "rejected")
            raise ResourceExhausted(f"router at its in-flight limit ({core.config.max_in_flight}); retry later")
        dispatcher = core.dispatcher
        assert dispatcher is not None
        call = None
        reader: _EventReader | None = None
        counted = False
        finished = False
        try:
            path, prompt, messages = describe(request.request)
            body = _body(request, messages, prompt)
            request_id = request.request_id or uuid.uuid4().hex
            hashes = chain_hashes(prompt, core.config.prefix_block_chars)
            remaining = context.time_remaining()
            deadline = None if remaining is None else time.monotonic() + remaining
            try:
                call = await dispatcher.open(RouteRequest(path, body, request.request.pool, request.request.model,
                                                          request.request.session_key, hashes, True, deadline))
            except UnknownTargetError as exc:
                core.count_failure("grpc", exc.outcome)  # the caller's error: no retry makes the pool or model exist
                raise NotFound(str(exc), field=exc.grpc_field) from None
            except UpstreamUnavailable as exc:
                core.count_failure("grpc", "unavailable")
                raise Unavailable(str(exc)) from None
            except UpstreamClientError as exc:
                core.count_failure("grpc", "client_error")
                raise InvalidArgument("request", _engine_message(exc.body)) from None
            engine_id = call.engine.id
            write = context.write
            Response = router_pb2.GenerateResponse
            usage: dict[str, Any] | None = None
            reason = call.finish_reason or ""
            # the events read up to the first token (and any that came with it): one message
            texts: list[str] = []
            tokens = 0
            key = TEXT_KEY_CHAT if messages is not None else TEXT_KEY_COMPLETION
            for ev in call.head_events:
                text = running_text(ev, key)  # the usual case: a running token, no JSON decoded
                if text is None:
                    text, r, u = _parse_event(ev)
                    usage = u or usage
                    reason = r or reason
                    if r and not text:
                        tokens += 1
                if text:
                    tokens += 1
                    texts.append(text)
            first = not texts
            if texts:
                await write(Response(request_id=request_id, text_delta="".join(texts), engine_id=engine_id,
                                     token_count=tokens))
            # after the first token: text read but not yet sent waits until the stream's interval has
            # passed since the previous message, gathering the tokens that arrive meanwhile (one timer per
            # message; a token that arrives meanwhile is only appended to a list by the reader's hook)
            reader = _EventReader(call, key)
            self.streams += 1
            counted = True
            last_sent = time.monotonic()
            while not reader.ended:
                interval = self.interval_s()
                if interval:
                    wait = last_sent + interval - time.monotonic()
                    if wait > 0:
                        await reader.gather(wait)  # cut short by the end of the stream
                    reader.drain()
                if not reader.texts and not reader.ended:
                    await reader.read()  # nothing came within the interval: wait for the next token
                if reader.ended:
                    break  # what is pending goes with the last message
                if not reader.texts:
                    continue
                await write(Response(request_id=request_id, text_delta=reader.take(),
                                     engine_id=engine_id if first else "", token_count=reader.take_tokens()))
                first = False
                last_sent = time.monotonic()
            usage = reader.usage or usage
            reason = reader.reason or reason
            pending_tokens = reader.take_tokens()
            pending = reader.take()
            if not call.done:
                if pending:  # the partial output reaches the caller before the error
                    await write(Response(request_id=request_id, text_delta=pending,
                                         engine_id=engine_id if first else "", token_count=pending_tokens))
                core.registry.record_failure(call.engine, time.monotonic(), "stream cut after first token")
                core.count_failure("grpc", "upstream_cut")
                raise Unavailable(f"engine {engine_id} stopped mid-stream; the partial output was sent")
            call.usage = usage or call.usage
            acc = dispatcher.finish(call, aborted=False)
            finished = True
            receipt = core.finish(call, "grpc", acc, len(prompt))
            # the last message: the text still pending, the finish reason and the receipt
            await write(Response(request_id=request_id, text_delta=pending, token_count=pending_tokens,
                                 finish_reason=reason or "stop", receipt=receipt.to_proto(),
                                 engine_id=engine_id if first else ""))
        finally:
            if reader is not None:
                reader.close()
            if counted:
                self.streams -= 1
            if call is not None and not finished:
                dispatcher.finish(call, aborted=True)
            core.release()


class _EventReader:
    """Reads a committed call's SSE stream for Generate: ``read`` waits for the next upstream bytes,
    ``gather`` lets them pile up for a while, ``drain`` takes what piled up; the text of token events goes
    to ``texts`` (running tokens found by a byte scan, no JSON decoded), usage and finish reason are
    noted; ``ended`` once [DONE] came or the stream stopped (``call.done`` tells which).

    Between two reads the reader's hooks are the engine response's ``raw_sink`` (a read of one whole chunk,
    unframed by ``_raw_hook``) and ``data_sink`` (anything else, decoded by the client): each piece of the
    body is only appended to ``chunks``: no queue or wake-up per token, except
    for a piece holding [DONE], which ends ``gather`` at once so that the last message does not wait out
    the interval."""

    __slots__ = ("call", "content", "key", "buf", "texts", "tokens", "usage", "reason", "ended", "chunks",
                 "hooked", "waiter")

    def __init__(self, call: Call, key: str) -> None:
        self.call = call
        self.content = content = call.response
        self.key = key
        self.buf = call.tail
        call.tail = b""
        self.texts: list[str] = []
        self.tokens = 0
        self.usage: dict[str, Any] | None = None
        self.reason = ""
        self.ended = call.done
        self.chunks: list[bytes] = []
        self.waiter: asyncio.Future[None] | None = None
        self.hooked = not self.ended
        if self.hooked:
            content.data_sink = self._hook
            content.raw_sink = self._raw_hook

    def _hook(self, data: bytes) -> None:
        self.chunks.append(data)
        if b"[DONE]" in data:
            waiter = self.waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _raw_hook(self, data: bytes, chunks: int) -> bool:
        """The engine client's fast path: ``data`` is exactly ``chunks`` whole chunks of the chunked body.
        One chunk (a token event, the usual read) is unframed here with one search, which skips the
        client's chunk decoder; several go to the decoder (False), which hands them to ``_hook`` in order."""
        if chunks != 1:
            return False
        self._hook(data[data.index(b"\r\n") + 2 : -2])
        return True

    def _unhook(self) -> None:
        content = self.content
        if content.data_sink == self._hook:
            content.data_sink = None
        if content.raw_sink == self._raw_hook:
            content.raw_sink = None

    def close(self) -> None:
        if self.hooked:
            self._unhook()
            self.hooked = False

    def take(self) -> str:
        text = "".join(self.texts)
        self.texts = []
        return text

    def take_tokens(self) -> int:
        n, self.tokens = self.tokens, 0
        return n

    async def gather(self, wait_s: float) -> None:
        """Lets the stream's chunks pile up for ``wait_s`` (less when [DONE] arrives meanwhile)."""
        loop = asyncio.get_running_loop()
        waiter = self.waiter = loop.create_future()
        timer = loop.call_later(wait_s, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None

    async def read(self) -> None:
        """Waits for the next bytes of the stream and takes them (with what piled up before)."""
        self.drain()
        if self.texts or self.ended:
            return
        content = self.content
        if self.hooked:
            self._unhook()  # unhooked while it waits: the next bytes wake it
        try:
            chunk = await content.readany()
        except (EngineHttpError, OSError):
            self.ended = True  # the engine went away (call.done stays False)
            return
        finally:
            if self.hooked:
                content.data_sink = self._hook
                content.raw_sink = self._raw_hook
        self._take(chunk)

    def drain(self) -> None:
        """Takes what is there now, without waiting (the tokens that came while the caller slept);
        the end of the stream is noticed by the next ``read``."""
        try:
            chunk = self.content.read_nowait()  # bytes buffered while the hook was off (older)
        except (EngineHttpError, OSError):
            chunk = b""
            self.ended = True  # the engine went away: what the hook took before still goes out
        if self.chunks:
            chunk += b"".join(self.chunks)
            self.chunks.clear()
        if chunk:
            self._take(chunk)

    def _take(self, chunk: bytes) -> None:
        buf = self.buf
        if not chunk:
            if not buf.strip():
                self.ended = True
                return
            chunk = b"\n\n"  # a last event without its blank line
        whole, self.buf = complete_events(buf, chunk)
        if not whole:
            return
        key = self.key
        texts = self.texts
        tokens = 0
        for ev in whole[:-2].split(b"\n\n"):
            text = running_text(ev, key)  # the usual case: a running token
            if text is None:
                if event_data(ev) == b"[DONE]":
                    self.call.done = self.ended = True
                    break
                text, r, u = _parse_event(ev)
                if u:
                    self.usage = u
                if r:
                    self.reason = r
                    if not text:
                        tokens += 1
            if text:
                tokens += 1
                texts.append(text)
        self.tokens += tokens
        self.call.events += tokens


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _parse_event(ev: bytes) -> tuple[str, str | None, dict[str, Any] | None]:
    data = event_data(ev)
    if data is None or data == b"[DONE]":
        return "", None, None
    try:
        obj = json.loads(data)
    except ValueError:
        return "", None, None
    if not isinstance(obj, dict):
        return "", None, None
    choices = obj.get("choices") or ()
    reason = choices[0].get("finish_reason") if choices and isinstance(choices[0], dict) else None
    return chunk_text(obj), reason, obj.get("usage") or None


def _engine_message(body: bytes) -> str:
    try:
        err = json.loads(body).get("error", {})
        return f"engine rejected the request: {err.get('message', body[:200].decode(errors='replace'))}"
    except (ValueError, AttributeError):
        return f"engine rejected the request: {body[:200].decode(errors='replace')}"
