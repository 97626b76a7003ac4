"""Client side of the runtime: channels to greenserve services with TLS, bearer token, deadlines and
retries for idempotent calls.

Retries use gRPC's own retry policy (service config), applied only to methods that are safe to repeat:
reads and pure computations (Get*, List*, Estimate*, Diff*, Decide*, Convert*, Check, Watch*). Every call
gets a deadline: the caller's timeout, a default, and never more than what is left of the RPC being
served when the call is made from inside a server (deadline propagation).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from greenserve.common.deadline import remaining_s
from greenserve.v1 import (
    cache_manager_pb2,
    forecaster_pb2,
    gpu_partitioner_pb2,
    optimizer_pb2,
    profiler_pb2,
    router_pb2,
)

IDEMPOTENT_PREFIXES = ("Get", "List", "Estimate", "Diff", "Decide", "Convert", "Check")
STREAMING_READ_PREFIXES = ("Watch",)
DEFAULT_TIMEOUT_S = 30.0

_SERVICE_DESCRIPTORS = [
    module.DESCRIPTOR.services_by_name[name]
    for module in (forecaster_pb2, profiler_pb2, optimizer_pb2, cache_manager_pb2, gpu_partitioner_pb2, router_pb2)
    for name in module.DESCRIPTOR.services_by_name
]


def idempotent_methods() -> list[dict[str, str]]:
    """Service-config names of every greenserve method that is safe to retry."""
    names = []
    for service in _SERVICE_DESCRIPTORS:
        for method in service.methods:
            if method.name.startswith(IDEMPOTENT_PREFIXES) and not method.client_streaming:
                names.append({"service": service.full_name, "method": method.name})
    names.append({"service": "grpc.health.v1.Health", "method": "Check"})
    return names


def service_config(max_attempts: int = 4) -> str:
    """gRPC service config JSON with a retry policy for the idempotent methods."""
    return json.dumps(
        {
            "methodConfig": [
                {
                    "name": idempotent_methods(),
                    "retryPolicy": {
                        "maxAttempts": max_attempts,
                        "initialBackoff": "0.1s",
                        "maxBackoff": "2s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"],
                    },
                }
            ]
        }
    )


#: Longest wait between two connection attempts of a channel to a peer that is down.
RECONNECT_BACKOFF_MAX_MS = 10_000


@dataclass(frozen=True)
class ChannelConfig:
    """How to reach a service."""

    address: str
    token: str | None = None
    tls_ca: Path | None = None  # trust this CA (TLS on when set)
    tls_cert: Path | None = None  # client certificate for mTLS
    tls_key: Path | None = None
    tls: bool = False  # TLS with the system trust store when no CA is given
    server_name_override: str | None = None
    default_timeout_s: float = DEFAULT_TIMEOUT_S
    max_message_bytes: int = 16 * 1024 * 1024

    @property
    def secure(self) -> bool:
        return self.tls or self.tls_ca is not None or self.tls_cert is not None


class _Metadata(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor,
                grpc.aio.StreamUnaryClientInterceptor, grpc.aio.StreamStreamClientInterceptor):
    """Adds the bearer token and bounds the timeout by the default and the propagated deadline."""

    def __init__(self, token: str | None, default_timeout_s: float | None) -> None:
        self._auth = ("authorization", f"Bearer {token}") if token else None
        self._default_timeout_s = default_timeout_s

    def _details(self, details: grpc.aio.ClientCallDetails, default_timeout_s: float | None) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        if self._auth and "authorization" not in metadata:
            metadata.add(*self._auth)
        timeout = details.timeout if details.timeout is not None else default_timeout_s
        left = remaining_s()
        if left is not None:
            timeout = max(0.0, left) if timeout is None else max(0.0, min(timeout, left))
        return grpc.aio.ClientCallDetails(details.method, timeout, metadata, details.credentials, details.wait_for_ready)

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details, self._default_timeout_s), request)

    # Streams (WatchPlans, Generate, StreamLoad) may run for long: no default timeout, only the caller's
    # own or a propagated one.
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details, None), request)

    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details, None), request_iterator)

    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details, None), request_iterator)


def _read(path: Path | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


def create_channel(config: ChannelConfig, *, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """An asyncio channel to `config.address` with TLS/mTLS, token, deadlines and retries."""
    opts: list[tuple[str, Any]] = [
        ("grpc.service_config", service_config()),
        ("grpc.enable_retries", 1),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        # A peer back from an outage is reached within 10 s: gRPC's default backoff grows to 120 s, and calls on a
        # channel in backoff fail at once, so a restarted peer could stay unreachable for up to two minutes.
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS),
        *options,
    ]
    if config.server_name_override:
        opts.append(("grpc.ssl_target_name_override", config.server_name_override))
    interceptors = [_Metadata(config.token, config.default_timeout_s)]
    if config.secure:
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(config.tls_ca),
            private_key=_read(config.tls_key),
            certificate_chain=_read(config.tls_cert),
        )
        return grpc.aio.secure_channel(config.address, creds, options=opts, interceptors=interceptors)
    return grpc.aio.insecure_channel(config.address, options=opts, interceptors=interceptors)


async def check_health(channel: grpc.aio.Channel, service: str = "", timeout_s: float | None = None) -> str:
    """grpc.health.v1 status name of `service` ("SERVING", "NOT_SERVING", ...); AioRpcError when unreachable."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


async def wait_until_serving(channel: grpc.aio.Channel, service: str = "", timeout_s: float = 30.0) -> None:
    """Poll grpc.health.v1 until `service` reports SERVING; TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: str = "no answer"
    while time.monotonic() < deadline:
        try:
            last = await check_health(channel, service, timeout_s=2.0)
            if last == "SERVING":
                return
        except grpc.aio.AioRpcError as exc:
            last = f"{exc.code().name}: {exc.details()}"
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{service or 'server'} not SERVING after {timeout_s:g}s ({last})")
