"""The gRPC server runtime every greenserve service runs on.

`ServiceServer` wraps a grpc.aio server with: the standard health service (grpc.health.v1) and server
reflection (so grpcurl works), bounded message sizes, optional TLS/mTLS, a bearer-token check, one
interceptor that traces (OpenTelemetry), logs (one JSON line per RPC), measures and maps domain errors
to status codes, deadline propagation to outbound calls, and graceful shutdown on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from greenserve.common.config import ServiceSettings
from greenserve.common.db_errors import unavailable_reason
from greenserve.common.deadline import current_deadline
from greenserve.common.errors import GreenserveError, InvalidArgument, Unavailable
from greenserve.common.telemetry import Telemetry

log = logging.getLogger("greenserve.server")

HEALTH_SERVICE = "grpc.health.v1.Health"
REFLECTION_SERVICE = reflection.SERVICE_NAME
# Methods callable without a token: Kubernetes and load balancers probe health unauthenticated.
AUTH_EXEMPT_PREFIXES = (f"/{HEALTH_SERVICE}/",)
# Metadata keys that carry a caller's trace context (W3C trace context and baggage, the default propagators).
_TRACE_KEYS = frozenset({"traceparent", "tracestate", "baggage"})

@dataclass(frozen=True)
class Registration:
    """A servicer and how to add it to a server."""

    servicer: Any
    add_to_server: Callable[[Any, grpc.aio.Server], None]
    full_name: str  # e.g. "greenserve.v1.OptimizerService"


# Undecodable request bytes: at most one WARNING line per this many seconds (the count of the others rides on it).
UNDECODABLE_LOG_INTERVAL_S = 10.0
# Seconds a request stream's end waits for the gRPC core to cancel a call it cut (checked_stream).
STREAM_END_WAIT_S = 0.02


class _Undecodable:
    """What the tolerant deserializer hands the handler instead of raising (grpc.aio would answer UNKNOWN and log
    a traceback per call): the handler refuses it with INVALID_ARGUMENT."""

    __slots__ = ("error", "type_name")

    def __init__(self, type_name: str, error: str) -> None:
        self.type_name = type_name
        self.error = error


def _message_type_name(deserializer: Callable[[bytes], Any]) -> str:
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    return getattr(descriptor, "full_name", "") or "request message"


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """`deserializer` that returns an _Undecodable instead of raising on bytes that do not parse."""
    if deserializer is None:
        return None
    type_name = _message_type_name(deserializer)

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # noqa: BLE001 - DecodeError (or any parse failure) is the caller's bad input
            return _Undecodable(type_name, type(exc).__name__)

    return deserialize


def _skip_parse(data: bytes) -> None:
    """Deserializer of a call refused before it runs (no token): its bytes are never parsed."""
    return None


class _RateLimitedWarning:
    """One WARNING line per interval, carrying how many were suppressed since the last one."""

    def __init__(self, logger: logging.Logger, interval_s: float) -> None:
        self._log, self._interval_s = logger, interval_s
        self._last = -float("inf")
        self.suppressed = 0

    def warn(self, message: str, **extra: Any) -> bool:
        now = time.monotonic()
        if now - self._last < self._interval_s:
            self.suppressed += 1
            return False
        self._log.warning(message, extra={**extra, "suppressed": self.suppressed})
        self._last, self.suppressed = now, 0
        return True


def _code_name(code: grpc.StatusCode | None) -> str:
    return (code or grpc.StatusCode.OK).name


_CODES_BY_INT = {c.value[0]: c for c in grpc.StatusCode}


def _from_int_code(value: object) -> grpc.StatusCode:
    return _CODES_BY_INT.get(value, grpc.StatusCode.OK) if isinstance(value, int) else grpc.StatusCode.OK


class ServerInterceptor(grpc.aio.ServerInterceptor):
    """Auth, tracing, logging, metrics, deadlines and error mapping around every handler."""

    def __init__(self, service_name: str, telemetry: Telemetry, token: str | list[str] | tuple[str, ...] | None) -> None:
        self._service = service_name
        self._tracer = telemetry.tracer
        tokens = [token] if isinstance(token, str) else list(token or ())
        # Every accepted bearer token (two during a token rotation); None: auth off.
        self._expected_auth = [t.encode() for t in tokens if t] or None
        self._undecodable_log = _RateLimitedWarning(log, UNDECODABLE_LOG_INTERVAL_S)
        meter = telemetry.meter
        # no metric reader (telemetry.py: a no-op meter): skip building the attributes per RPC as well
        self._metrics_on = telemetry.metrics_exported
        self._requests = meter.create_counter("greenserve.rpc.server.requests", unit="{request}", description="RPCs served")
        self._duration = meter.create_histogram("greenserve.rpc.server.duration", unit="s", description="RPC duration")
        # The SDK's span processors (read per RPC: a processor added later counts); None: not the SDK, spans always.
        self._span_processor = getattr(telemetry.tracer_provider, "_active_span_processor", None)
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}
        self._attrs: dict[tuple[str, grpc.StatusCode], dict[str, str]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        if self._expected_auth is not None and not method.startswith(AUTH_EXEMPT_PREFIXES):
            given: str | bytes = ""
            for key, value in details.invocation_metadata or ():
                if key == "authorization":
                    given = value
                    break
            given = given.decode(errors="replace") if isinstance(given, bytes) else given
            scheme, _, credentials = given.strip().partition(" ")  # RFC 6750: the scheme in any case
            given_bytes = credentials.strip().encode() if scheme.lower() == "bearer" else b""
            # Compare with every accepted token (no early exit: the time taken does not say which one was close).
            matches = [hmac.compare_digest(given_bytes, expected) for expected in self._expected_auth]
            if not any(matches):
                reason = "missing bearer token" if not given else "invalid bearer token"
                return _replace_behavior(
                    handler, _rejecting(grpc.StatusCode.UNAUTHENTICATED, reason, handler), request_deserializer=_skip_parse
                )
        # The wrapped handler is built once per method (and handler) and reused: per RPC only the bookkeeping
        # in _Call runs (building a handler, closures and a class per call cost ~0.1 ms of CPU each time).
        wrapped = self._wrapped_for(method, handler)
        if wrapped is not None:
            return wrapped
        wrapped = _replace_behavior(
            handler, self._observed(method, handler), request_deserializer=_tolerant(handler.request_deserializer)
        )
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrapped_for(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler | None:
        """The wrapped handler built earlier for `method`, while the method still has the same `handler`."""
        cached = self._wrapped.get(method)
        return cached[1] if cached is not None and cached[0] is handler else None

    def _tracing(self, metadata: tuple[tuple[str, Any], ...]) -> bool:
        """Whether this RPC gets a span: always while spans go anywhere (a span processor is set); without
        one, only when the caller sent trace context (so outbound calls still join its trace)."""
        processors = getattr(self._span_processor, "_span_processors", None)
        if processors is None or processors:
            return True
        return any(key in _TRACE_KEYS for key, _ in metadata)

    def _metric_attrs(self, method: str, code: grpc.StatusCode) -> dict[str, str]:
        attrs = self._attrs.get((method, code))
        if attrs is None:
            attrs = self._attrs[(method, code)] = {"rpc.method": method, "rpc.grpc.status_code": _code_name(code)}
        return attrs

    def _refuse_undecodable(self, method: str, request: _Undecodable, peer: str) -> InvalidArgument:
        """The error an undecodable request gets; logs one short, rate-limited line (never a traceback)."""
        self._undecodable_log.warn(
            "undecodable request", rpc_method=method, peer=peer, message_type=request.type_name, error=request.error
        )
        return InvalidArgument("", f"request bytes are not a valid {request.type_name} ({request.error})")

    def _observed(self, method: str, handler: grpc.RpcMethodHandler) -> Callable[..., Any]:
        behavior = _behavior_of(handler)
        interceptor = self
        span_name = method.lstrip("/")

        class _Call:
            """Per-RPC bookkeeping: span, timing, final status."""

            def __init__(self, context: grpc.aio.ServicerContext, *, attach: bool = True) -> None:
                self.context = context
                self.start = time.monotonic()
                # Read the peer now: asking the core for it after a stream ended crashes (freed call).
                self.peer = context.peer()
                self.code: grpc.StatusCode = grpc.StatusCode.OK
                metadata = context.invocation_metadata() or ()
                if interceptor._tracing(metadata):
                    parent = propagate.extract({k: v for k, v in metadata if isinstance(v, str)})
                    self.span = interceptor._tracer.start_span(
                        span_name,
                        context=parent,
                        kind=SpanKind.SERVER,
                        attributes={"rpc.system": "grpc", "rpc.method": method, "greenserve.service": interceptor._service},
                    )
                else:  # spans go nowhere and the caller sent no trace: nothing to record or propagate
                    self.span = trace.INVALID_SPAN
                    attach = False
                # Unary handlers run in one task: the span becomes current so outbound calls join the trace.
                # A stream's generator may be closed from another context, where detaching would fail.
                self._token = otel_context.attach(trace.set_span_in_context(self.span)) if attach else None
                remaining = context.time_remaining()
                current_deadline.set(None if remaining is None else self.start + remaining)

            async def fail(self, exc: BaseException) -> None:
                """Turn an exception into the RPC's status (abort raises; never returns normally)."""
                if isinstance(exc, GreenserveError):
                    self.code = exc.code
                    self.span.set_status(Status(StatusCode.ERROR, str(exc)))
                    await self.context.abort_with_status(rpc_status.to_status(exc.to_status(interceptor._service)))
                reason = unavailable_reason(exc)
                if reason is not None:  # the database locked or unreachable: the caller may retry
                    log.warning("%s: %s", method, reason, extra={"rpc_method": method})
                    await self.fail(Unavailable(reason))
                if isinstance(exc, NotImplementedError):
                    self.code = grpc.StatusCode.UNIMPLEMENTED
                    await self.context.abort(
                        grpc.StatusCode.UNIMPLEMENTED, f"{method.lstrip('/')} is not implemented by this release"
                    )
                self.code = grpc.StatusCode.INTERNAL
                self.span.record_exception(exc)
                self.span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                log.exception("unhandled error in %s", method, extra={"rpc_method": method})
                await self.context.abort(grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__}); see server log")

            def finish(self) -> None:
                code = self.code
                if code == grpc.StatusCode.OK:
                    # A handler that aborted by itself leaves its code on the context.
                    ctx_code = self.context.code()
                    code = ctx_code if isinstance(ctx_code, grpc.StatusCode) else _from_int_code(ctx_code)
                elapsed = time.monotonic() - self.start
                if interceptor._metrics_on:
                    attrs = interceptor._metric_attrs(method, code)
                    interceptor._requests.add(1, attrs)
                    interceptor._duration.record(elapsed, attrs)
                if self.span is not trace.INVALID_SPAN:
                    self.span.set_attribute("rpc.grpc.status_code", code.value[0])
                    self.span.end()
                if self._token is not None:
                    otel_context.detach(self._token)
                if log.isEnabledFor(logging.INFO):  # the record and its fields only when it is written
                    log.info(
                        "rpc",
                        extra={"rpc_method": method, "code": _code_name(code), "duration_ms": round(elapsed * 1000, 3),
                               "peer": self.peer},
                    )

        async def _guard(call: _Call, body: Callable[[], Awaitable[Any]]) -> Any:
            try:
                return await body()
            except asyncio.CancelledError:
                call.code = grpc.StatusCode.CANCELLED
                raise
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # noqa: BLE001 - mapped to a status, never swallowed
                await call.fail(exc)

        async def checked_stream(call: _Call, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
            """The request stream, refusing the first undecodable message (raised into the handler's loop)."""
            async for item in requests:
                if isinstance(item, _Undecodable):
                    raise interceptor._refuse_undecodable(method, item, call.peer)
                yield item
            # A stream the gRPC core cut (a message over --max-message-bytes: the client already has
            # RESOURCE_EXHAUSTED) ends like a clean half-close; the core cancels the handler a moment later. Give
            # it that moment here, so a handler never applies a batch whose caller was told it failed.
            deadline = time.monotonic() + STREAM_END_WAIT_S
            while not call.context.done() and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            if call.context.done():
                raise asyncio.CancelledError("the call ended while its request stream was read")

        def checked(call: _Call, request: Any) -> Any:
            if handler.request_streaming:
                return checked_stream(call, request)
            if isinstance(request, _Undecodable):
                raise interceptor._refuse_undecodable(method, request, call.peer)
            return request

        if handler.response_streaming and inspect.iscoroutinefunction(behavior):
            # A handler that writes with context.write (a coroutine): wrapped in a coroutine, so grpc.aio awaits
            # it directly instead of iterating an async-generator layer of ours.

            async def writing(request: Any, context: grpc.aio.ServicerContext) -> None:
                call = _Call(context, attach=False)
                try:
                    await _guard(call, lambda: behavior(checked(call, request), context))
                finally:
                    call.finish()

            return writing

        if handler.response_streaming:

            async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                call = _Call(context, attach=False)
                try:
                    result = behavior(checked(call, request), context)
                    if inspect.isawaitable(result) and not hasattr(result, "__aiter__"):
                        result = await result
                    if hasattr(result, "__aiter__"):
                        async for item in result:
                            yield item
                    elif result is not None:
                        for item in result:
                            yield item
                except asyncio.CancelledError:
                    call.code = grpc.StatusCode.CANCELLED
                    raise
                except (grpc.aio.AbortError, GeneratorExit):
                    raise
                except Exception as exc:  # noqa: BLE001 - mapped to a status, never swallowed
                    await call.fail(exc)
                finally:
                    call.finish()

            return streaming

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            call = _Call(context)

            async def body() -> Any:
                result = behavior(checked(call, request), context)
                return await result if inspect.isawaitable(result) else result

            try:
                return await _guard(call, body)
            finally:
                call.finish()

        return unary


def _behavior_of(handler: grpc.RpcMethodHandler) -> Callable[..., Any]:
    if handler.request_streaming and handler.response_streaming:
        return handler.stream_stream
    if handler.request_streaming:
        return handler.stream_unary
    if handler.response_streaming:
        return handler.unary_stream
    return handler.unary_unary


def _replace_behavior(
    handler: grpc.RpcMethodHandler, behavior: Callable[..., Any], *, request_deserializer: Callable[[bytes], Any] | None
) -> grpc.RpcMethodHandler:
    kwargs = {"request_deserializer": request_deserializer, "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(behavior, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(behavior, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(behavior, **kwargs)
    return grpc.unary_unary_rpc_method_handler(behavior, **kwargs)


def _rejecting(code: grpc.StatusCode, message: str, handler: grpc.RpcMethodHandler) -> Callable[..., Any]:
    if handler.response_streaming:

        async def reject_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await context.abort(code, message)
            yield  # pragma: no cover - abort raises

        return reject_stream

    async def reject(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)

    return reject


def _read(path: Any) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def server_credentials(settings: ServiceSettings) -> grpc.ServerCredentials | None:
    """TLS credentials from the settings, or None for plaintext; mTLS when a client CA is set."""
    if settings.tls_cert is None and settings.tls_key is None:
        if settings.tls_client_ca is not None:
            raise ValueError("tls_client_ca needs tls_cert and tls_key")
        return None
    if settings.tls_cert is None or settings.tls_key is None:
        raise ValueError("tls_cert and tls_key must be given together")
    client_ca = _read(settings.tls_client_ca) if settings.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(_read(settings.tls_key), _read(settings.tls_cert))],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


@dataclass
class ServiceServer:
    """One service's gRPC server: `await start()`, later `await stop()` (idempotent)."""

    service_name: str
    settings: ServiceSettings
    registrations: list[Registration]
    telemetry: Telemetry
    on_stop: list[Callable[[], Awaitable[None] | None]] = field(default_factory=list)
    # called as a stop begins, before the delay: the surfaces other than gRPC report that they stop too
    on_draining: list[Callable[[], None]] = field(default_factory=list)
    port: int = 0
    # SO_REUSEPORT on the listening socket: only for processes that share a port on purpose (the router's
    # workers, whose supervisor guards the port); off, a second process cannot silently share it.
    reuse_port: bool = False
    _server: grpc.aio.Server | None = None
    _health: health.aio.HealthServicer | None = None
    _stopped: bool = False

    async def start(self) -> int:
        """Bind, start and mark every service SERVING; returns the bound port."""
        limit = self.settings.max_message_bytes
        options = [
            ("grpc.max_send_message_length", limit),
            ("grpc.max_receive_message_length", limit),
            # Never let a second process silently share the port (grpc enables SO_REUSEPORT by default),
            # unless this server is one of the router's workers (reuse_port).
            ("grpc.so_reuseport", int(self.reuse_port)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ]
        interceptor = ServerInterceptor(self.service_name, self.telemetry, self.settings.tokens())
        server = grpc.aio.server(interceptors=[interceptor], options=options)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        names = [reg.full_name for reg in self.registrations]
        for reg in self.registrations:
            reg.add_to_server(reg.servicer, server)
        reflection.enable_server_reflection([*names, HEALTH_SERVICE, REFLECTION_SERVICE], server)
        address = f"{self.settings.host}:{self.settings.bind_port}"
        creds = server_credentials(self.settings)
        try:
            port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"cannot bind {address}: {exc}") from exc
        if port == 0:
            raise OSError(f"cannot bind {address} (in use or not a local address)")
        await server.start()
        self._server, self.port = server, port
        for name in ["", *names]:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "serving",
            extra={"service": self.service_name, "address": f"{self.settings.host}:{port}", "tls": creds is not None,
                   "auth": self.settings.token() is not None, "services": names},
        )
        return port

    async def stop(self, grace_s: float | None = None, delay_s: float | None = None) -> None:
        """Report NOT_SERVING (gRPC health, then the on_draining hooks), keep serving for the delay, then refuse new
        calls, let in-flight RPCs finish within the grace period, and run the on_stop hooks."""
        if self._server is None or self._stopped:
            return
        grace = self.settings.shutdown_grace_s if grace_s is None else grace_s
        delay = self.settings.shutdown_delay_s if delay_s is None else delay_s
        log.info("stopping", extra={"service": self.service_name, "grace_s": grace, "delay_s": delay})
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        for draining in self.on_draining:
            draining()
        if delay > 0:
            # a gateway that health-checks this process sees NOT_SERVING and stops sending; what it sends meanwhile
            # is still served (grpc.aio answers CANCELLED to a call that arrives once stop() has begun)
            await asyncio.sleep(delay)
        await self._server.stop(grace)
        for hook in self.on_stop:
            result = hook()
            if inspect.isawaitable(result):
                await result
        self._stopped = True


def registration(pb2_module: Any, grpc_module: Any, service: str, servicer: Any) -> Registration:
    """Registration of `servicer` for greenserve.v1.<service>, named from the generated descriptor."""
    full_name = pb2_module.DESCRIPTOR.services_by_name[service].full_name
    return Registration(servicer, getattr(grpc_module, f"add_{service}Servicer_to_server"), full_name)
