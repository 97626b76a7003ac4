"""OpenAI-compatible HTTP front: ``/v1/completions``, ``/v1/chat/completions`` (JSON or SSE),
``/v1/models``, ``/health``, ``/metrics``.

Existing clients (the official ``openai`` SDK, ``vllm bench serve``, curl) talk to it exactly as to a
vLLM server. Routing hints travel in headers: ``x-greenserve-pool`` and ``x-greenserve-session`` (or
``x-session-id``; the body's ``user`` field is the session key otherwise).

Streams are forwarded as the engine's own bytes; response headers are sent only once the first token is
in hand, so a retry on another engine is invisible and a request no engine can serve still gets a clean
503. The carbon receipt goes in a ``greenserve`` field of the final SSE chunk (the usage chunk when the
client asked for usage, else the chunk with the finish reason; the router always asks the engine for
usage and drops that chunk when the client did not want it), and in ``x-greenserve-*`` headers of
non-streamed responses (a streamed response's headers leave before the receipt exists, so they carry
the engine, plan version and CI in force). Limits: 429 with ``Retry-After`` at ``max_in_flight``. A pool the
router does not know (``x-greenserve-pool``) gets 404, as vLLM answers an unknown model; 503 means a known pool
with no engine up now.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import socket
import time
from collections.abc import Sequence
from ssl import SSLContext
from typing import Any

from aiohttp import web
from greenserve.router.core import RouterCore
from greenserve.router.front.http_guard import CappedSite, ConnectionGuard, HttpLimits, auth_middleware

# the SSE forwarding after the first token lives in http_stream.py; its names stay importable from here
from greenserve.router.front.http_stream import (  # noqa: F401
    _DIRECT_WRITE_MAX_BUFFERED,
    _DONE_EVENT,
    _FINISH_KEY,
    _USAGE_NULL,
    _WRITABLE_POLL_S,
    _direct_sender,
    _final_events,
    _Forwarder,
    _only_running,
    _pass_events,
    _until_writable,
)
from greenserve.router.routing.policy import UnknownTargetError
from greenserve.router.routing.prefix_index import chain_hashes, render_chat
from greenserve.router.upstream.dispatcher import (
    _RUNNING,  # noqa: F401 (importable from here, as tests do)
    Call,
    RouteRequest,
    UpstreamUnavailable,
    complete_events,
    split_events,
)
from greenserve.router.upstream.engine_wire import EngineHttpError, UpstreamClientError
from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest

log = logging.getLogger("greenserve.router.http")

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Connection": "keep-alive"}


def _error(status: int, message: str, param: str | None = None, err_type: str = "invalid_request_error",
           headers: dict[str, str] | None = None) -> web.Response:
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return web.json_response(body, status=status, headers=headers)


LINGER_S = 2.0
"""Seconds the unread rest of a refused request's body is read and dropped before the connection closes."""

MAX_JSON_DEPTH = 64
"""Nesting levels a request body may have (OpenAI bodies, tool schemas included, need far fewer)."""


def _too_large(limit: int, length: int | None) -> web.Response:
    said = f" (Content-Length {length})" if length is not None else ""
    resp = _error(413, f"request body larger than the limit of {limit} bytes{said} (--http-max-body-bytes)",
                  err_type="invalid_request_error")
    resp.force_close()  # the rest of the body is never read
    return resp


def json_too_deep(obj: Any, max_depth: int) -> bool:
    """True when arrays/objects nest more than ``max_depth`` levels (iterative: no recursion to exhaust)."""
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


class BadRequest(Exception):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif not isinstance(part, dict):
                raise BadRequest(f"{where}[{j}]", "must be an object")
        return "\n".join(parts)
    raise BadRequest(where, "must be a string or a list of content parts")


def prompt_text(body: dict[str, Any], chat: bool) -> str:
    """The text whose blocks are hashed for prefix affinity (400 naming the field when malformed)."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages", "must be a non-empty list")
        pairs = []
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict):
                raise BadRequest(f"messages[{i}]", "must be an object")
            pairs.append((str(msg.get("role", "")), _content_text(msg.get("content"), f"messages[{i}].content")))
        return render_chat(pairs)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, int) for p in prompt):
            return ",".join(map(str, prompt))
        if all(isinstance(p, str) for p in prompt):
            return prompt[0]
    raise BadRequest("prompt", "must be a string, a list of strings or a list of token ids")


class HttpFront:
    """The aiohttp server; ``start`` binds ``host:port`` (0 picks a free port) and sets ``port``.

    ``tokens``: the bearer tokens accepted on every route but ``/health`` (none: open); ``ssl``: the TLS context
    (None: plaintext); ``limits``: connection, timeout and body limits (http_guard.py)."""

    def __init__(self, core: RouterCore, host: str, port: int, *, limits: HttpLimits | None = None,
                 tokens: Sequence[str] = (), ssl: SSLContext | None = None, reuse_port: bool = False) -> None:
        self.core = core
        self.host = host
        self.port = port
        self.limits = limits or HttpLimits()
        self.ssl = ssl
        self.reuse_port = reuse_port  # SO_REUSEPORT: one of several router workers (workers.py) shares the port
        self.metrics_registry = core.prom  # what /metrics serves (a worker serves the whole router's: workers.py)
        self.scheme = "https" if ssl is not None else "http"
        # keepalive_timeout: aiohttp's default (3630 s) let idle or silent connections pile up;
        # lingering_time: after a refusal (413, 408) the unread rest of a body is read and dropped this long
        # (so that the client sees the answer) before the connection closes (aiohttp's default: 10 s)
        self._handler_kwargs: dict[str, Any] = {"access_log": None, "lingering_time": LINGER_S,
                                                "keepalive_timeout": self.limits.keepalive_timeout_s}
        self.guard = ConnectionGuard(self.limits, self._handler_kwargs)
        self.draining = False  # set by begin_drain as the router stops
        self.body_bytes_in_flight = 0  # request body bytes held by the handlers running now
        guard = self.guard
        for name, doc, read in (
                ("greenserve_router_http_connections", "open HTTP connections", lambda: len(guard.live)),
                ("greenserve_router_http_connections_refused", "HTTP connections refused at --http-max-connections",
                 lambda: guard.refused),
                ("greenserve_router_http_head_timeouts", "HTTP connections closed without a request head in time",
                 lambda: guard.head_timeouts),
                ("greenserve_router_http_body_bytes_in_flight", "request body bytes held by HTTP requests in flight",
                 lambda: self.body_bytes_in_flight)):
            Gauge(name, doc, registry=core.prom,  # summed over workers; counts of dead ones kept
                  multiprocess_mode="sum" if name.endswith(("_refused", "_timeouts")) else "livesum"
                  ).set_function(read)
        # without tokens the auth middleware is left out: each middleware is a coroutine per request
        middlewares = [self.guard.middleware(), *([auth_middleware(tokens)] if any(tokens) else [])]
        app = web.Application(client_max_size=self.limits.max_body_bytes, middlewares=middlewares)
        app.on_response_prepare.append(self.guard.on_response_prepare)
        # the generation handlers are _generate itself (no wrapper coroutine frame to resume per token)
        app.router.add_post("/v1/completions", functools.partial(self._generate, path="/v1/completions", chat=False))
        app.router.add_post("/v1/chat/completions",
                            functools.partial(self._generate, path="/v1/chat/completions", chat=True))
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self.app = app
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        # handler_cancellation: a client that goes away cancels its handler at once, which closes the
        # upstream connection, which is how vLLM learns to abort the request.
        self._runner = web.AppRunner(self.app, handler_cancellation=True, **self._handler_kwargs)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise OSError(f"cannot bind HTTP front {self.host}:{self.port}: {exc}") from exc
        site = CappedSite(self._runner, sock, self.guard, ssl_context=self.ssl, backlog=4096)
        await site.start()
        self.port = sock.getsockname()[1]
        return self.port

    def begin_drain(self) -> None:
        """The router is stopping: /health answers 503 from now on, so that load balancers stop sending; requests
        are still served until the front stops."""
        self.draining = True

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- simple routes ----------------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "greenserve-router", "root": m,
                 "parent": None} for m in self.core.registry.models() if m]
        return web.json_response({"object": "list", "data": data})

    async def _health(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        routable = sum(1 for e in self.core.registry.engines.values() if e.routable(now))
        status = "stopping" if self.draining else "ok" if routable else "unavailable"
        body = {"status": status, "routable_engines": routable,
                "engines": len(self.core.registry.engines), "plan_version": self.core.plans.version}
        return web.json_response(body, status=200 if status == "ok" else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics_registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    # -- generation ---------------------------------------------------------------------------------------

    async def _generate(self, request: web.Request, path: str, *, chat: bool) -> web.StreamResponse:
        core = self.core
        t_arrival = time.monotonic()
        # Size and admission come before the body is read: a refused request costs no buffer.
        limit = self.limits.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            return _too_large(limit, length)
        # the bytes of bodies held at once are capped too: a declared length is reserved, an undeclared
        # (chunked) one reserves the whole limit until its real size is known
        reserved = length if length is not None else limit
        budget = self.limits.max_body_bytes_in_flight
        if self.body_bytes_in_flight + reserved > budget:
            core.rejected += 1
            core.count_failure("http", "rejected")
            return _error(429, f"router at its limit of request body bytes in flight ({budget} bytes, "
                               "--http-max-body-bytes-in-flight); retry later",
                          err_type="rate_limit_exceeded", headers={"Retry-After": "1"})
        if not core.admit():
            core.count_failure("http", "rejected")
            return _error(429, f"router at its in-flight limit ({core.config.max_in_flight}); retry later",
                          err_type="rate_limit_exceeded", headers={"Retry-After": "1"})
        self.body_bytes_in_flight += reserved
        try:
            try:
                if request.content.is_eof():  # the whole body came with the head: read without a timer
                    raw = await request.read()
                else:
                    # asyncio.timeout, not wait_for: wait_for wraps the read in a task of its own per request
                    async with asyncio.timeout(self.limits.body_timeout_s):
                        raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                return _too_large(limit, None)
            except web.RequestPayloadError as exc:  # e.g. a Content-Encoding the body does not decode with
                return _error(400, f"request body could not be read: {exc}")
            except asyncio.TimeoutError:
                resp = _error(408, f"request body not received within {self.limits.body_timeout_s:g} s "
                                   "(--http-body-timeout-s)", err_type="timeout")
                resp.force_close()
                return resp
            if length is None:  # a chunked body: now its size is known
                self.body_bytes_in_flight -= reserved - len(raw)
                reserved = len(raw)
            try:
                body = json.loads(raw)
            except RecursionError:
                body = None  # deeper than the parser's own recursion limit
            except ValueError as exc:
                return _error(400, f"request body is not JSON: {exc}")
            if body is None or json_too_deep(body, MAX_JSON_DEPTH):
                return _error(400, f"request body is nested deeper than {MAX_JSON_DEPTH} levels")
            if not isinstance(body, dict):
                return _error(400, "request body must be a JSON object")
            try:
                model = body.get("model", "")
                if not isinstance(model, str):
                    raise BadRequest("model", "must be a string")
                text = prompt_text(body, chat)
                stream = body.get("stream", False)
                if not isinstance(stream, bool):
                    raise BadRequest("stream", "must be a boolean")
            except BadRequest as exc:
                return _error(400, f"{exc.param}: {exc}", exc.param)
            headers = request.headers
            pool = headers.get("x-greenserve-pool", "")
            user = body.get("user")
            session_key = headers.get("x-greenserve-session") or headers.get("x-session-id") or \
                (user if isinstance(user, str) else "")
            want_usage = False
            # the bytes forwarded as the caller sent them (None: re-encoded from ``body``); the only reference
            # left to the body's bytes, so that setting it to None frees them
            forward: bytes | None = raw
            del raw
            if stream:
                options = body.get("stream_options")
                if options is None and forward is not None:
                    # forward the caller's bytes with the usage request spliced in (no re-encoding)
                    forward = forward.rstrip()
                    forward = forward[:-1] + b',"stream_options":{"include_usage":true}}' \
                        if forward.endswith(b"}") else None
                elif not (isinstance(options, dict) and options.get("include_usage") is True):
                    forward = None  # re-encoded from ``body``
                options = dict(options) if isinstance(options, dict) else {}
                want_usage = bool(options.get("include_usage"))
                options["include_usage"] = True
                body["stream_options"] = options
            hashes = chain_hashes(text, core.config.prefix_block_chars)
            assert core.dispatcher is not None
            try:
                call = await core.dispatcher.open(RouteRequest(path, body, pool, model, session_key, hashes, stream,
                                                               raw=forward))
            except UnknownTargetError as exc:
                # the caller's error, answered as vLLM answers an unknown model (404 NotFoundError): a 503
                # is retried by clients and gateways, and no retry makes the pool or the model exist
                core.count_failure("http", exc.outcome)
                return _error(404, str(exc), exc.http_param, err_type="NotFoundError")
            except UpstreamUnavailable as exc:
                core.count_failure("http", "unavailable")
                return _error(503, str(exc), err_type="service_unavailable", headers={"Retry-After": "1"})
            except UpstreamClientError as exc:
                core.count_failure("http", "client_error")
                return web.Response(status=exc.status, body=exc.body, content_type=exc.content_type or None)
            if not stream:
                return self._unary(call, len(text))
            return await self._stream(request, call, want_usage, len(text), t_arrival)
        finally:
            self.body_bytes_in_flight -= reserved
            core.release()

    def _unary(self, call: Call, prompt_chars: int) -> web.Response:
        core = self.core
        acc = core.dispatcher.finish(call, aborted=False)  # type: ignore[union-attr]
        receipt = core.finish(call, "http", acc, prompt_chars)
        try:
            obj = json.loads(call.body)
            obj["greenserve"] = receipt.to_json()
            payload = json.dumps(obj, separators=(",", ":")).encode()
        except ValueError:
            payload = call.body
        return web.Response(body=payload, headers={**receipt.headers(), "Content-Type": "application/json"})

    async def _stream(self, request: web.Request, call: Call, want_usage: bool, prompt_chars: int,
                      t_arrival: float) -> web.StreamResponse:
        """Forwards the engine's SSE bytes. Hot path: per upstream read, the complete events are checked
        with a few byte searches (C speed) and, when none of them is a final one (finish reason, usage,
        [DONE], error), forwarded in one write without being split or decoded; only the final events
        are held, decoded and rewritten with the receipt."""
        core = self.core
        dispatcher = core.dispatcher
        assert dispatcher is not None
        engine = call.engine
        region = core.plans.pool_region.get(engine.pool) or core.config.region
        resp = web.StreamResponse(headers={
            **_SSE_HEADERS, "x-greenserve-engine": engine.id,
            "x-greenserve-plan-version": str(call.decision.plan_version),
            "x-greenserve-ci-g-per-kwh": f"{core.ci.get(region):.6g}",
        })
        held: list[tuple[bytes, dict[str, Any] | None]] = []
        finished = False
        try:
            await resp.prepare(request)
            out = _pass_events(call.head_events, held, call, counted=True)
            if out:
                await resp.write(out)  # also flushes the headers aiohttp holds back until the first bytes
            send = _direct_sender(request, resp) if out else None
            if call.attempts == 1:
                core.prom_overhead.observe((time.monotonic() - t_arrival) - (call.t_first - call.t_sent))
            if not call.done:
                buf = call.tail
                call.tail = b""
                response = call.response
                write = resp.write
                # the fast path: whole chunks of running token events go from the engine connection's
                # data_received straight to the client (engine_pool.py), whenever this loop holds nothing
                forward = _Forwarder(call, response, request.transport) if send is not None else None
                while True:
                    if forward is not None and not buf:
                        response.raw_sink = forward
                    try:
                        chunk = await response.readany()
                    except (EngineHttpError, OSError):
                        break  # the engine went away mid-stream
                    response.raw_sink = None  # until this chunk is handled (the loop may wait on the client)
                    if not chunk:
                        if buf.strip():  # a last event without its blank line
                            out = _pass_events(split_events(buf + b"\n\n")[0], held, call)
                            if out:
                                await write(out)
                        break
                    whole, buf = complete_events(buf, chunk)
                    if not whole:
                        continue
                    running = _only_running(whole)
                    if running >= 0:
                        call.events += running  # only running token chunks: forward as they are
                        if send is None:
                            await write(whole)
                        elif send(whole):
                            await _until_writable(request)
                        continue
                    out = _pass_events(whole[:-2].split(b"\n\n"), held, call)
                    if out:
                        await write(out)
                    if call.done:
                        break
            if not call.done:
                # The engine went away after the first token: end with an error, never replay.
                core.registry.record_failure(engine, time.monotonic(), "stream cut after first token")
                dispatcher.finish(call, aborted=True)
                core.count_failure("http", "upstream_cut")
                err = {"error": {"message": f"engine {engine.id} stopped mid-stream", "type": "upstream_error",
                                 "code": 502}}
                await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
                finished = True
                return resp
            acc = dispatcher.finish(call, aborted=False)
            finished = True
            receipt = core.finish(call, "http", acc, prompt_chars)
            # the final events and the end of the chunked body in one write
            await resp.write_eof(_final_events(held, receipt.to_json(), want_usage, call))
            return resp
        except ConnectionError:
            # The client went away while we wrote to it: an everyday event, not a server error (re-raised,
            # aiohttp would log it at ERROR with a traceback). aiohttp ends the response quietly.
            core.count_failure("http", "cancelled")
            log.info("client disconnected", extra={"engine_id": engine.id, "path": request.path})
            return resp
        except asyncio.CancelledError:  # the client went away while we waited (handler cancellation)
            core.count_failure("http", "cancelled")
            log.info("client disconnected", extra={"engine_id": engine.id, "path": request.path})
            raise
        finally:
            call.response.raw_sink = None
            if not finished:
                dispatcher.finish(call, aborted=True)
