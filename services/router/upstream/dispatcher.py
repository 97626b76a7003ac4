"""The request path to engines: pooled keep-alive HTTP, retries before the first token, SSE scanning.

Requests go over the router's own HTTP/1.1 client (engine_pool.py: a keep-alive pool of protocol
connections, no connection set-up per request, a few microseconds per forwarded token); the engine model
lookups keep a small ``aiohttp.ClientSession`` (``Dispatcher.session``), as the monitor's probes and scrapes
keep theirs, so they never queue behind traffic.

``Dispatcher.open`` picks an engine (policy.py), sends the request and reads until the first token. Any
failure before that point (connection refused or reset, HTTP 5xx/429, stream ended, no first token in
``first_token_timeout_s``) is charged to the engine (ejection, engines.py) and the request is retried on
another engine, up to ``max_attempts``; nothing has reached the caller yet, so the retry is invisible.
After the first token the request is committed to its engine: a failure then ends the stream with an
error, never a replay (tokens would be duplicated).

The SSE body is scanned at the byte level: events are split on blank lines and only the events needed
are JSON-decoded (until the first token, and the final finish/usage events; a running chunk carries
``"finish_reason":null`` and is passed through untouched), so the HTTP front forwards engine bytes
without re-encoding them. After the commit, each front reads the rest of the stream itself from
``call.response`` (an ``EngineResponse``; ``call.tail`` holds bytes read past the last complete event),
attaching its sinks to it (``raw_sink`` / ``data_sink``), so no task or coroutine resumes per token.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
# the C string scanner json.loads itself uses; typeshed's json.decoder stub leaves out this public name
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

import aiohttp
from greenserve.router.routing.engines import EngineRegistry, EngineState
from greenserve.router.routing.policy import Decision, NoEngineError, RoutingPolicy, UnknownTargetError
from greenserve.router.routing.prefix_index import PrefixIndex
from greenserve.router.upstream import disaggregated
from greenserve.router.upstream.engine_pool import EnginePool
from greenserve.router.upstream.engine_response import EngineResponse
from greenserve.router.upstream.engine_wire import EngineHttpError, UpstreamClientError

_RUNNING = b'"finish_reason":null'
_FINISH = b'"finish_reason"'
_DONE = b"[DONE]"


class UpstreamUnavailable(Exception):
    """No engine could serve the request (HTTP 503 / gRPC UNAVAILABLE). A request naming a pool the router does not
    know, or a model no engine serves, raises policy.UnknownTargetError instead (HTTP 404 / gRPC NOT_FOUND)."""


class _AttemptFailed(Exception):
    pass


def make_session(limit: int = 0, keepalive_s: float = 75.0) -> aiohttp.ClientSession:
    """The session of the engine model lookups (limit 0: no cap on connections; keep-alive reuse per engine);
    requests themselves go over ``EnginePool``."""
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, keepalive_timeout=keepalive_s,
                                     enable_cleanup_closed=True, ttl_dns_cache=300)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                 skip_auto_headers=("User-Agent",), auto_decompress=False)


def complete_events(buf: bytes, chunk: bytes) -> tuple[bytes, bytes]:
    """Of ``buf + chunk`` (CRLF read as LF): the complete SSE events as one block, each ending with its blank
    line (b"" when none is complete), and the incomplete rest to keep for the next chunk."""
    if buf:
        chunk = buf + chunk
    if b"\r" in chunk:
        chunk = chunk.replace(b"\r\n", b"\n")
    end = chunk.rfind(b"\n\n")
    if end < 0:
        return b"", chunk
    end += 2
    return (chunk, b"") if end == len(chunk) else (chunk[:end], chunk[end:])


def split_events(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete SSE events of ``buf`` (without their blank-line terminator) and the incomplete rest."""
    whole, rest = complete_events(b"", buf)
    return (whole[:-2].split(b"\n\n") if whole else []), rest


def event_data(event: bytes) -> bytes | None:
    """The data of an SSE event (``data:`` lines joined), None for events without data (comments)."""
    if event.startswith(b"data: ") and b"\n" not in event:
        return event[6:]
    lines = [line[5:].lstrip(b" ") if line.startswith(b"data:") else None for line in event.split(b"\n")]
    data = [line for line in lines if line is not None]
    return b"\n".join(data) if data else None


TEXT_KEY_COMPLETION = '"text":"'
TEXT_KEY_CHAT = '"content":"'


def running_text(event: bytes, key: str) -> str | None:
    """Text of a running token event (one choice, ``"finish_reason":null``), found by a scan of the event
    instead of decoding its JSON; None when the event is anything else (final, usage, error, comment,
    several choices, a text key the scan cannot place): the caller then decodes it. ``key`` is
    ``TEXT_KEY_COMPLETION`` or ``TEXT_KEY_CHAT``. In valid JSON the key pattern (a quote, the name, a
    quote, a colon, a quote) cannot occur inside a string value, where every quote is escaped; the value
    is decoded with the json module's own string scanner, so escapes come out exactly as ``json.loads``
    gives them."""
    if not event.startswith(b"data: {") or event.count(_FINISH) != 1 or _RUNNING not in event:
        return None
    try:
        s = event.decode()
    except UnicodeDecodeError:
        return None
    i = s.find(key)
    if i < 0 or s.find(key, i + 1) >= 0 or "\n" in s:
        return None
    try:
        return scanstring(s, i + len(key))[0]
    except ValueError:
        return None


def chunk_text(obj: dict[str, Any]) -> str:
    """Text of one completion or chat chunk (first choice)."""
    choices = obj.get("choices") or ()
    if not choices:
        return ""
    choice = choices[0]
    text = choice.get("text")
    if text is None:
        text = (choice.get("delta") or choice.get("message") or {}).get("content") or ""
    return text


def _finish_reason(obj: dict[str, Any]) -> str | None:
    choices = obj.get("choices") or ()
    return choices[0].get("finish_reason") if choices else None


@dataclass
class RouteRequest:
    """A request as the dispatcher needs it (built by the HTTP or the gRPC front)."""

    path: str  # "/v1/chat/completions" or "/v1/completions"
    body: dict[str, Any]
    pool: str
    model: str
    session_key: str
    hashes: list[int]
    stream: bool
    deadline: float | None = None  # time.monotonic()
    raw: bytes | None = None  # ``body`` as the bytes to send, when the front has them (else JSON-encoded)


@dataclass
class Call:
    """One request committed to an engine (after its first token, or its whole body when not streamed)."""

    decision: Decision
    engine: EngineState
    response: EngineResponse
    t0: float
    t_first: float
    acc_start: tuple[float, float]
    head_events: list[bytes] = field(default_factory=list)  # events read before commit, in order
    tail: bytes = b""
    body: bytes = b""  # non-streamed response body
    attempts: int = 1
    t_sent: float = 0.0  # when the winning attempt's request left for the engine
    first_text: str = ""
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    events: int = 0
    done: bool = False
    closed: bool = False
    hashes: list[int] = field(default_factory=list)


class Dispatcher:
    """Runs requests against engines; see the module docstring."""

    def __init__(
        self,
        registry: EngineRegistry,
        policy: RoutingPolicy,
        index: PrefixIndex,
        session: aiohttp.ClientSession,
        *,
        max_attempts: int = 3,
        first_token_timeout_s: float = 60.0,
        connect_timeout_s: float = 2.0,
        saturation_requests: int = 256,
    ) -> None:
        self.registry = registry
        self.policy = policy
        self.index = index
        self.session = session  # engine model lookups (core.py); requests go over ``engines``
        self.engines = EnginePool(connect_timeout_s=connect_timeout_s)
        self.max_attempts = max_attempts
        self.first_token_timeout_s = first_token_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.saturation_requests = saturation_requests
        self.retries = 0
        self.upstream_failures = 0
        # reads the replicas' shared state again (RouterCore.refresh_state; None without a shared database)
        self.refresh_state: Callable[[], Awaitable[None]] | None = None

    async def choose_after_refresh(self, pool: str, model: str, hashes: list[int], session_key: str = "",
                                   exclude: frozenset[str] | set[str] = frozenset(),
                                   explain: bool = False) -> Decision:
        """``policy.choose`` once more for a request whose pool or model this router did not know, after reading
        the replicas' shared state (``refresh_state``; nothing to read without replicas): another replica may
        have registered it since this one's last poll. Raises what ``choose`` raises: UnknownTargetError if it
        is still unknown (the caller's error: HTTP 404 / gRPC NOT_FOUND), NoEngineError if it is now known with
        no engine up. Only the unknown path comes here; a routable request never awaits it."""
        if self.refresh_state is not None:
            await self.refresh_state()
        return self.policy.choose(pool, model, hashes, session_key, exclude, explain=explain)

    async def open(self, req: RouteRequest) -> Call:
        """Picks an engine and reads up to the first token, retrying on other engines before it."""
        tried: set[str] = set()
        last_error = "no attempt made"
        body = req.raw if req.raw is not None else json.dumps(req.body, separators=(",", ":")).encode()
        t0 = time.monotonic()
        for attempt in range(self.max_attempts):
            try:
                decision = self.policy.choose(req.pool, req.model, req.hashes, req.session_key, tried)
            except UnknownTargetError:
                if attempt > 0:
                    break
                try:
                    decision = await self.choose_after_refresh(req.pool, req.model, req.hashes, req.session_key,
                                                               tried)
                except UnknownTargetError:
                    raise  # the caller's error (HTTP 404 / gRPC NOT_FOUND), not the engines'
                except NoEngineError as exc:
                    raise UpstreamUnavailable(str(exc)) from None
            except NoEngineError as exc:
                if attempt == 0:
                    raise UpstreamUnavailable(str(exc)) from None
                break
            engine = decision.engine
            if attempt == 0 and req.hashes:
                self.index.insert(engine.id, req.hashes)
            if engine.ejected_until:
                engine.probe_in_flight = True
            payload = body
            if not req.body.get("model") and engine.model:  # vLLM needs the served name; fill it in
                payload = json.dumps({**req.body, "model": engine.model}, separators=(",", ":")).encode()
            started = time.monotonic()
            acc = engine.start_request(started, self.saturation_requests)
            engine.prefilling += 1
            try:
                try:
                    call = await self._attempt(req, payload, decision, engine, acc, t0)
                finally:
                    engine.prefilling -= 1
                call.attempts = attempt + 1
                call.hashes = req.hashes
                self.registry.record_success(engine, started)
                return call
            except UpstreamClientError:
                engine.end_request(time.monotonic(), self.saturation_requests)
                engine.probe_in_flight = False
                raise
            except asyncio.CancelledError:
                engine.end_request(time.monotonic(), self.saturation_requests)
                engine.probe_in_flight = False
                raise
            except _AttemptFailed as exc:
                now = time.monotonic()
                engine.end_request(now, self.saturation_requests)
                self.registry.record_failure(engine, now, str(exc))
                self.upstream_failures += 1
                tried.add(engine.id)
                last_error = f"{engine.id}: {exc}"
                if attempt + 1 < self.max_attempts:
                    self.retries += 1
        raise UpstreamUnavailable(f"no engine could serve the request after {len(tried)} attempt(s); last: {last_error}")

    async def _attempt(self, req: RouteRequest, body: bytes, decision: Decision, engine: EngineState,
                       acc: tuple[float, float], t0: float) -> Call:
        timeout = self.first_token_timeout_s
        if req.deadline is not None:
            timeout = min(timeout, max(0.0, req.deadline - time.monotonic()))
        try:
            async with asyncio.timeout(timeout):
                t_sent = time.monotonic()
                if engine.prefill_url:  # a DPD pair: the prefiller first, then the decoder streams (disaggregated.py)
                    await disaggregated.prefill(self.engines, engine, req.path, body)
                resp = await self.engines.post(engine.url, req.path, body)
                try:
                    call = await self._until_first_token(req, resp, decision, engine, acc, t0)
                    call.t_sent = t_sent
                    return call
                except BaseException:
                    resp.close()
                    raise
        except TimeoutError:
            raise _AttemptFailed(f"no first token within {timeout:g}s") from None
        except EngineHttpError as exc:
            raise _AttemptFailed(str(exc)) from None
        except OSError as exc:
            raise _AttemptFailed(f"{type(exc).__name__}: {exc}") from None

    async def _until_first_token(self, req: RouteRequest, resp: EngineResponse, decision: Decision,
                                 engine: EngineState, acc: tuple[float, float], t0: float) -> Call:
        status = resp.status
        if status >= 500 or status == 429:
            await resp.read()
            resp.release()
            raise _AttemptFailed(f"HTTP {status}")
        if status >= 400:
            data = await resp.read()
            resp.release()
            raise UpstreamClientError(status, data, resp.content_type)
        if not req.stream or not resp.content_type.startswith("text/event-stream"):
            data = await resp.read()
            now = time.monotonic()
            call = Call(decision, engine, resp, t0, now, acc, body=data, done=True)
            try:
                obj = json.loads(data)
                call.usage = obj.get("usage")
                call.finish_reason = _finish_reason(obj)
            except ValueError as exc:
                raise _AttemptFailed(f"unreadable response body: {exc}") from None
            return call
        call = Call(decision, engine, resp, t0, 0.0, acc)
        buf = b""
        key = TEXT_KEY_CHAT if req.path.endswith("/chat/completions") else TEXT_KEY_COMPLETION
        while True:
            chunk = await resp.readany()
            if not chunk:
                raise _AttemptFailed("stream ended before the first token")
            events, buf = split_events(buf + chunk)
            for i, event in enumerate(events):
                call.head_events.append(event)
                text = running_text(event, key)  # the usual first token: found by a scan, no JSON decoded
                reason = None
                if text is None:
                    event_body = event_data(event)
                    if event_body is None:
                        continue
                    if event_body == _DONE:
                        raise _AttemptFailed("stream finished without a token")
                    try:
                        obj = json.loads(event_body)
                    except ValueError:
                        raise _AttemptFailed("unreadable stream chunk") from None
                    if not isinstance(obj, dict):
                        raise _AttemptFailed("unreadable stream chunk: not a JSON object")
                    if "error" in obj and "choices" not in obj:
                        raise _AttemptFailed(f"engine error before the first token: {obj['error']}")
                    text = chunk_text(obj)
                    reason = _finish_reason(obj)
                if text or reason:
                    call.t_first = time.monotonic()
                    call.first_text = text
                    call.events = 1
                    rest = events[i + 1 :]
                    if reason:
                        call.finish_reason = reason
                        self._scan_final(call, rest)
                        call.head_events.extend(rest)
                        call.tail = buf
                        return call
                    # keep the events already read after the first token for the caller, in order
                    call.head_events.extend(rest)
                    for ev in rest:
                        self._note(call, ev)
                    call.tail = buf
                    return call

    # -- after the first token ------------------------------------------------------------------------

    def _note(self, call: Call, event: bytes) -> bool:
        """Tracks one event after the first token; True when it is (or follows) the final chunk."""
        if _RUNNING in event:
            call.events += 1
            return False
        data = event_data(event)
        if data is None:
            return False
        if data == _DONE:
            call.done = True
            return True
        try:
            obj = json.loads(data)
        except ValueError:
            return False
        if obj.get("usage"):
            call.usage = obj["usage"]
        reason = _finish_reason(obj)
        if reason:
            call.finish_reason = reason
            call.events += 1
        elif obj.get("choices"):
            call.events += 1
        return bool(reason) or bool(obj.get("usage") and not obj.get("choices"))

    def _scan_final(self, call: Call, events: list[bytes]) -> None:
        for ev in events:
            self._note(call, ev)

    async def close(self) -> None:
        """Closes the idle engine connections and the lookup session (at the router's stop)."""
        await self.engines.close()
        await self.session.close()

    def finish(self, call: Call, *, aborted: bool) -> tuple[float, float]:
        """Ends the request: releases or closes the upstream connection; returns the end accumulators."""
        if call.closed:
            return call.acc_start
        call.closed = True
        if aborted or not call.done:
            call.response.close()  # closing the connection is how an engine learns to abort
        else:
            call.response.release()
        return call.engine.end_request(time.monotonic(), self.saturation_requests)

