"""The HTTP front's byte-level SSE forwarding, split from http_front.py by concern: what happens to the engine's
stream bytes after the first token.

Running token events (``"finish_reason":null``) are recognised with a few byte searches and forwarded without
being split or decoded: from the engine connection's ``data_received`` straight to the client's transport
(``_Forwarder``, the response's ``raw_sink``) or in one chunk write (``_direct_sender``); a client that is
behind pauses the engine's stream (``_until_writable``, ``_Forwarder``), so the router's memory per stream stays
bounded. Only the final events (finish reason, usage, [DONE], error) are decoded (``_pass_events``,
``_classify``) and held, to carry the carbon receipt (``_final_events``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from greenserve.router.upstream.dispatcher import _RUNNING, Call, event_data
from greenserve.router.upstream.engine_response import EngineResponse

_DONE_EVENT = b"data: [DONE]\n\n"
_FINISH_KEY = b'"finish_reason"'
_USAGE_NULL = b'"usage":null'

_CHUNK_END = b"\r\n"


def _only_running(data: bytes) -> int:
    """The number of running token events in ``data`` when it holds nothing else (no finish reason,
    usage, [DONE] or error), else -1."""
    running = data.count(_RUNNING)
    if running == data.count(_FINISH_KEY) and b"[DONE]" not in data and b'"error"' not in data \
            and data.count(b'"usage"') == data.count(_USAGE_NULL):
        return running
    return -1


class _Forwarder:
    """The engine response's ``raw_sink`` (engine_response.py) while the handler holds nothing: offered the raw
    bytes of one or more whole chunks of the engine's chunked body, it writes them to the client's transport
    unchanged (the client's response is chunked too: no re-framing, one write) when they hold only whole
    running token events, and returns True; anything else (a final event, usage, [DONE], an error, CRLF
    line ends, a chunk that does not end an event, a closing client) it leaves to the handler (False).

    A client that is behind (``_DIRECT_WRITE_MAX_BUFFERED`` bytes or more buffered for it) pauses the
    reading of the engine's stream until it has taken most of them (checked every ``_WRITABLE_POLL_S``): the
    router's memory per stream stays bounded and the engine meets the backpressure."""

    __slots__ = ("call", "response", "transport", "waiting")

    def __init__(self, call: Call, response: EngineResponse, transport: Any) -> None:
        self.call = call
        self.response = response
        self.transport = transport
        self.waiting = False

    def __call__(self, data: bytes, chunks: int) -> bool:
        # only the chunk framing's CRs, and every chunk's data ends with a blank line (whole events)
        if data.count(b"\r") != 2 * chunks or data.count(b"\n\n\r\n") != chunks:
            return False
        running = _only_running(data)
        if running < 0:
            return False
        transport = self.transport
        if transport.is_closing():
            return False  # the handler meets the closed client itself
        transport.write(data)
        self.call.events += running
        if not self.waiting and transport.get_write_buffer_size() >= _DIRECT_WRITE_MAX_BUFFERED:
            self.waiting = True
            self.response.pause_reading()
            asyncio.get_running_loop().call_later(_WRITABLE_POLL_S, self._check_writable)
        return True

    def _check_writable(self) -> None:
        transport = self.transport
        if transport.is_closing() or transport.get_write_buffer_size() < _DIRECT_WRITE_MAX_BUFFERED // 2:
            self.waiting = False
            self.response.resume_reading()
        else:
            asyncio.get_running_loop().call_later(_WRITABLE_POLL_S, self._check_writable)


_WRITABLE_POLL_S = 0.005
_DIRECT_WRITE_MAX_BUFFERED = 64 * 1024


def _direct_sender(request: web.Request, resp: web.StreamResponse) -> Any:
    """A function writing one chunk of a chunked response straight to the socket transport, or None
    when the response is not chunked (the caller then uses ``resp.write``). Per token this saves
    aiohttp's coroutine chain (write, payload writer, chunk framing); used only once the headers are
    out. It returns True when the transport buffers ``_DIRECT_WRITE_MAX_BUFFERED`` bytes or more
    after the write: the caller then waits for a slow reader (``_until_writable``), which is the
    backpressure that reaches the engine (the router stops reading its stream)."""
    transport = request.transport
    if transport is None or resp.headers.get("Transfer-Encoding", "").lower() != "chunked":
        return None
    writelines = transport.writelines
    buffered = transport.get_write_buffer_size

    def send(data: bytes) -> bool:
        if transport.is_closing():
            raise ConnectionResetError("the client went away")
        writelines((b"%x\r\n" % len(data), data, _CHUNK_END))
        return buffered() >= _DIRECT_WRITE_MAX_BUFFERED

    return send


async def _until_writable(request: web.Request) -> None:
    """Waits until a slow client has taken most of what is buffered for it (or has gone away)."""
    transport = request.transport
    while transport is not None and not transport.is_closing() and \
            transport.get_write_buffer_size() >= _DIRECT_WRITE_MAX_BUFFERED // 2:
        await asyncio.sleep(_WRITABLE_POLL_S)


def _pass_events(events: list[bytes], held: list[tuple[bytes, dict[str, Any] | None]], call: Call,
                 counted: bool = False) -> bytes:
    """Events to forward now, joined (each with its blank line); final chunks go to ``held``, [DONE]
    marks the call done. ``counted``: the events were already counted by the dispatcher (read before
    the commit)."""
    out = []
    for ev in events:
        if _RUNNING in ev:
            if not counted:
                call.events += 1
            out.append(ev)
            continue
        kind, obj = _classify(ev)
        if kind == 2:
            call.done = True
            break
        if kind == 1:
            assert obj is not None
            if obj.get("usage"):
                call.usage = obj["usage"]
            if obj.get("choices") and not counted:
                call.events += 1
            held.append((ev, obj))
        else:
            if obj is not None and obj.get("choices") and not counted:
                call.events += 1
            out.append(ev)
    if not out:
        return b""
    out.append(b"")
    return b"\n\n".join(out)


def _classify(ev: bytes) -> tuple[int, dict[str, Any] | None]:
    """0: pass through; 1: a final chunk (finish reason or usage) to hold; 2: [DONE]."""
    if _RUNNING in ev:
        return 0, None
    data = event_data(ev)
    if data is None:
        return 0, None
    if data == b"[DONE]":
        return 2, None
    try:
        obj = json.loads(data)
    except ValueError:
        return 0, None
    if not isinstance(obj, dict):
        return 0, obj
    choices = obj.get("choices")
    if obj.get("usage") and not choices:
        return 1, obj
    if choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"):
        return 1, obj
    return 0, obj


def _final_events(held: list[tuple[bytes, dict[str, Any] | None]], receipt: dict[str, Any], want_usage: bool,
                  call: Call) -> bytes:
    """The held final chunks, with the receipt on the last one the client will see, then [DONE]."""
    keep = [(ev, obj) for ev, obj in held if want_usage or not (obj and obj.get("usage") and not obj.get("choices"))]
    if keep:
        ev, obj = keep[-1]
        assert obj is not None
        tail = b',"greenserve":' + json.dumps(receipt, separators=(",", ":")).encode() + b"}"
        if ev.startswith(b"data: {") and ev.endswith(b"}") and b"\n" not in ev and "greenserve" not in obj:
            keep[-1] = (ev[:-1] + tail, obj)  # splice the receipt in: no re-encoding of the chunk
        else:
            obj = dict(obj)
            obj["greenserve"] = receipt
            keep[-1] = (b"data: " + json.dumps(obj, separators=(",", ":")).encode(), obj)
    else:
        extra = {"id": "", "object": "greenserve.receipt", "choices": [], "greenserve": receipt}
        keep = [(b"data: " + json.dumps(extra, separators=(",", ":")).encode(), extra)]
    return b"".join(ev + b"\n\n" for ev, _ in keep) + _DONE_EVENT
