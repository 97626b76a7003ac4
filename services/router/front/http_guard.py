"""What the HTTP front checks before a handler reads anything: bearer token, TLS/mTLS, connection cap,
header/body/keep-alive timeouts and the body-size limit.

The same ``--auth-token`` / ``--auth-token-file`` and ``--tls-cert`` / ``--tls-key`` / ``--tls-client-ca``
as the gRPC side (``greenserve.common.server``) protect the HTTP front: ``Authorization: Bearer <token>``
(the scheme in any case, as OpenAI clients send it; every token of a rotation list is accepted),
compared in constant time; ``/health`` stays open
for probes, every other route (``/metrics`` included) needs the token when one is configured.

Limits, against slow or greedy clients (a slowloris holding connections, a huge body):

* ``max_connections``: connections beyond it get a 503 and are closed at once, before anything is read;
* ``header_timeout_s``: a new connection must deliver a complete request head within it (TLS handshake
  included) or it is closed;
* ``keepalive_timeout_s``: an idle keep-alive connection is closed after it (aiohttp's keep-alive
  timer, which also closes a connection that has not sent the next request head by then);
* ``max_requests_per_connection``: the response to the last one says ``Connection: close``;
* ``body_timeout_s``: the whole body must arrive within it (408 otherwise);
* ``max_body_bytes``: a declared ``Content-Length`` above it gets 413 before the body is read; a chunked
  body is cut off (413) as soon as it passes the limit;
* ``max_body_bytes_in_flight``: the bytes of the bodies held by the requests running at once (a chunked
  body counts as ``max_body_bytes`` until it has arrived); a request that would pass it gets 429 before
  its body is read.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import resource
import ssl
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger("greenserve.router.http")

OPEN_PATHS = frozenset({"/health"})
"""Routes answered without a token (Kubernetes and load balancers probe them unauthenticated)."""

FD_RESERVE = 64
"""File descriptors kept out of the default connection cap (database, gRPC, logs, listening sockets)."""


def default_max_connections() -> int:
    """Half of the file descriptors the process may open, less a reserve: each client connection of a
    request in flight also holds one connection to an engine. At most 4096, at least 32."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(32, min(4096, (soft - FD_RESERVE) // 2))


@dataclass(frozen=True)
class HttpLimits:
    """Limits of the HTTP front (flags ``--http-*`` of the router; defaults in docs/router.md)."""

    max_body_bytes: int = 16 * 1024 * 1024
    max_body_bytes_in_flight: int = 256 * 1024 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 75.0
    max_connections: int = 1024
    max_requests_per_connection: int = 1000


def bearer_matches(header: str | None, tokens: str | Sequence[str]) -> bool:
    """True when an ``Authorization`` header carries one of ``tokens`` as a bearer credential (scheme in any
    case, surrounding blanks ignored). Compared in constant time with every accepted token (two during a
    rotation), without an early exit, so the time taken does not say which one was close."""
    if not header:
        return False
    scheme, _, credentials = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    # surrogateescape: aiohttp hands header bytes that are not UTF-8 over as surrogates, which a plain
    # encode() refuses (a UnicodeEncodeError, a 500); so encoded they are their own bytes and match no token
    given = credentials.strip().encode("utf-8", "surrogateescape")
    ok = False
    for token in [tokens] if isinstance(tokens, str) else tokens:
        ok |= hmac.compare_digest(given, token.encode())
    return ok


def ssl_context(cert: Path | None, key: Path | None, client_ca: Path | None) -> ssl.SSLContext | None:
    """A server TLS context from the same files as the gRPC side, or None for plaintext; mTLS (client
    certificate required and verified against ``client_ca``) when a client CA is given."""
    if cert is None and key is None:
        if client_ca is not None:
            raise ValueError("tls_client_ca needs tls_cert and tls_key")
        return None
    if cert is None or key is None:
        raise ValueError("tls_cert and tls_key must be given together")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert), str(key))
    if client_ca is not None:
        ctx.load_verify_locations(cafile=str(client_ca))
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def error_response(status: int, message: str, err_type: str, code: str | int | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    """An OpenAI-shaped error body."""
    body = {"error": {"message": message, "type": err_type, "param": None, "code": status if code is None else code}}
    return web.json_response(body, status=status, headers=headers)


def auth_middleware(tokens: Sequence[str]) -> Callable[..., Any]:
    """Refuses every route but the open ones without an accepted bearer token (401, OpenAI's shape);
    no tokens: auth off."""
    accepted = [t for t in tokens if t]

    @web.middleware
    async def check(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        if accepted and request.path not in OPEN_PATHS:
            header = request.headers.get("Authorization")
            if not bearer_matches(header, accepted):
                reason = "missing bearer token" if not header else "invalid bearer token"
                resp = error_response(401, f"{reason}: send 'Authorization: Bearer <token>'",
                                      "invalid_request_error", "invalid_api_key",
                                      headers={"WWW-Authenticate": 'Bearer realm="greenserve-router"'})
                resp.force_close()  # never read the body of an unauthenticated caller
                return resp
        return await handler(request)

    return check


_REFUSAL_BODY = json.dumps({"error": {
    "message": "router at its HTTP connection limit; retry later", "type": "service_unavailable",
    "param": None, "code": 503}}).encode()
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(_REFUSAL_BODY)).encode() + b"\r\n\r\n" + _REFUSAL_BODY)


class _Refused(asyncio.Protocol):
    """A connection over the cap: one 503, then closed; nothing it sends is read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(_REFUSAL)
        transport.close()

    def data_received(self, data: bytes) -> None:  # pragma: no cover - the transport is closing
        pass


_REQUEST_NUMBER = web.RequestKey("greenserve_request_number", int)


class _GuardedHandler(RequestHandler):
    """aiohttp's request handler with room (no ``__slots__``) for the guard's bookkeeping."""

    def __init__(self, manager: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.greenserve_guard = guard
        self.greenserve_requests = 0  # request heads seen on this connection

    def connection_lost(self, exc: BaseException | None) -> None:
        self.greenserve_guard.live.discard(self)
        super().connection_lost(exc)


class ConnectionGuard:
    """Caps connections and times out request heads; counts what it refuses. ``handler_kwargs``: the
    keyword arguments of aiohttp's RequestHandler (the ones given to the AppRunner)."""

    def __init__(self, limits: HttpLimits, handler_kwargs: dict[str, Any]) -> None:
        self.limits = limits
        self.handler_kwargs = handler_kwargs
        self.refused = 0
        self.head_timeouts = 0
        # accepted connections not yet lost (a TLS handshake that fails never reaches the handler; its
        # handler is garbage at once and leaves this set)
        self.live: weakref.WeakSet[_GuardedHandler] = weakref.WeakSet()

    def factory(self, runner: web.AppRunner) -> Callable[[], asyncio.BaseProtocol]:
        """The protocol factory of the listening socket: aiohttp's request handler, or a refusal."""
        loop = asyncio.get_running_loop()

        def make() -> asyncio.BaseProtocol:
            if len(self.live) >= self.limits.max_connections:
                self.refused += 1
                if self.refused == 1 or self.refused % 1000 == 0:
                    log.warning("HTTP connection refused at the limit",
                                extra={"max_connections": self.limits.max_connections, "refused": self.refused})
                return _Refused()
            server = runner.server
            assert server is not None
            proto = _GuardedHandler(server, self, loop=loop, **self.handler_kwargs)
            self.live.add(proto)
            loop.call_later(self.limits.header_timeout_s, self._head_deadline, weakref.ref(proto))
            return proto

        return make

    @staticmethod
    def count_request(request: web.Request) -> int:
        """Counts the request on its connection (once); returns the requests seen on it so far."""
        count = request.get(_REQUEST_NUMBER)
        if count is None:
            proto = request.protocol
            count = getattr(proto, "greenserve_requests", 0) + 1
            if isinstance(proto, _GuardedHandler):
                proto.greenserve_requests = count
            request[_REQUEST_NUMBER] = count
        return int(count)

    def _head_deadline(self, ref: weakref.ref[_GuardedHandler]) -> None:
        proto = ref()
        if proto is None or proto.greenserve_requests or proto not in self.live:
            return
        self.head_timeouts += 1
        self.live.discard(proto)
        proto.force_close()  # no complete request head in time (or no TLS handshake): slowloris
        transport = proto.transport
        if transport is not None:
            transport.close()

    def middleware(self) -> Callable[..., Any]:
        """Counts requests per connection (which also marks it as having sent a head)."""

        @web.middleware
        async def mark(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
            self.count_request(request)
            return await handler(request)

        return mark

    async def on_response_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """The last request a connection may carry gets ``Connection: close``."""
        if self.count_request(request) >= self.limits.max_requests_per_connection:
            response.force_close()
            response.headers["Connection"] = "close"  # aiohttp wrote its headers before this hook ran


class CappedSite(web.SockSite):
    """A SockSite whose connections come from a ConnectionGuard's factory (the cap, the head timeout)
    and whose TLS handshake is bounded by the head timeout."""

    def __init__(self, runner: web.AppRunner, sock: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(runner, sock, **kwargs)
        self._guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        extra: dict[str, Any] = {}
        if self._ssl_context is not None:
            extra["ssl_handshake_timeout"] = self._guard.limits.header_timeout_s
        factory = self._guard.factory(self._runner)  # type: ignore[arg-type]
        self._server = await loop.create_server(factory, sock=self._sock, ssl=self._ssl_context,
                                                backlog=self._backlog, **extra)
