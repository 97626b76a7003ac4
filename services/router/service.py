"""RouterService wiring: settings, the gRPC servicer, and the build function the process entry point runs.

The same process serves gRPC (Generate, Route, engine management, Drain) and the OpenAI-compatible HTTP
front on ``--http-port``; both go through one RouterCore (core.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from typing import Any, ClassVar
from urllib.parse import urlparse

import aiohttp
import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.common.app import ServiceContext
from greenserve.common.client import ChannelConfig
from greenserve.common.config import (
    DEFAULT_ROUTER_HTTP_PORT,
    MIB,
    DependencyAddresses,
    ServiceSettings,
)
from greenserve.common.errors import (
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from greenserve.common.server import Registration, registration
from greenserve.router import disaggregated, models
from greenserve.router.core import CoreConfig, RouterCore
from greenserve.router.engines import EngineState
from greenserve.router.http_front import HttpFront
from greenserve.router.http_guard import HttpLimits, default_max_connections, ssl_context
from greenserve.router.policy import NoEngineError, PolicyConfig
from greenserve.router.prefix_index import chain_hashes, render_chat
from greenserve.router.upstream import (
    Call,
    HookedReader,
    RouteRequest,
    UpstreamClientError,
    UpstreamUnavailable,
    chunk_text,
    complete_events,
    TEXT_KEY_CHAT,
    TEXT_KEY_COMPLETION,
    event_data,
    running_text,
    stream_hooks,
)
from greenserve.router.workers import current_worker
from greenserve.v1 import common_pb2, router_pb2, router_pb2_grpc
from pydantic import Field, model_validator


class RouterSettings(ServiceSettings, DependencyAddresses):
    """Flags and GREENSERVE_* env vars of greenserve-router (defaults explained in docs/router.md)."""

    service_name: ClassVar[str] = "router"

    engines: str = Field("", description="comma-separated engine base URLs (http://host:port) routed to from start")
    default_pool: str = Field("default", description="pool of engines given by --engines")
    http_port: int = Field(DEFAULT_ROUTER_HTTP_PORT, ge=-1, le=65535,
                           description="port of the OpenAI-compatible HTTP front; 0 picks a free port, -1 disables it")
    http_host: str | None = Field(None, description="address of the HTTP front (default: --host)")
    http_max_body_bytes: int = Field(16 * MIB, ge=1024, le=1024 * MIB,
                                     description="largest HTTP request body; larger ones get 413 before being read")
    http_max_body_bytes_in_flight: int = Field(
        256 * MIB, ge=1024, le=1024 * 1024 * MIB,
        description="request body bytes held at once by the HTTP requests in flight; above it new ones get 429")
    http_max_connections: int | None = Field(
        None, ge=1, le=1_000_000,
        description="open HTTP connections above which new ones get 503 and are closed (default: half the file "
        "descriptor limit less 64, at most 4096)")
    http_header_timeout_s: float = Field(
        10.0, gt=0, le=3600, description="seconds a new HTTP connection gets to send a complete request head")
    http_body_timeout_s: float = Field(30.0, gt=0, le=3600,
                                       description="seconds an HTTP request body gets to arrive in full (408 after)")
    http_keepalive_timeout_s: float = Field(
        75.0, gt=0, le=3600,
        description="seconds an idle HTTP keep-alive connection is kept open (longer than the idle timeouts of "
        "client pools, 5-60 s, so that a client never reuses a connection the router is closing)")
    http_max_requests_per_connection: int = Field(1000, ge=1, le=10_000_000,
                                                  description="requests one HTTP keep-alive connection may carry")
    scrape_interval_s: float = Field(0.5, gt=0, le=60, description="seconds between /metrics scrapes of each engine")
    stale_after_s: float = Field(2.0, gt=0, le=600, description="metrics older than this make an engine STALE")
    health_interval_s: float = Field(1.0, gt=0, le=60, description="seconds between /health probes of each engine")
    probe_timeout_s: float = Field(1.0, gt=0, le=60, description="timeout of one probe or scrape")
    eject_after_failures: int = Field(3, ge=1, le=100, description="consecutive failures that eject an engine")
    eject_base_s: float = Field(1.0, gt=0, le=600, description="first ejection time; doubles per re-ejection")
    eject_max_s: float = Field(30.0, gt=0, le=3600, description="longest ejection time")
    max_in_flight: int = Field(4096, ge=1, le=1_000_000,
                               description="requests in flight above which new ones get 429 / RESOURCE_EXHAUSTED")
    max_attempts: int = Field(3, ge=1, le=10, description="engines tried per request before the first token")
    first_token_timeout_s: float = Field(60.0, gt=0, le=3600,
                                         description="an attempt without a first token by then is retried elsewhere")
    prefix_block_chars: int = Field(256, ge=16, le=65536, description="characters per prefix-hash block")
    prefix_index_max_bytes: int = Field(64 * MIB, ge=1024, le=64 * 1024 * MIB,
                                        description="memory cap of the whole prefix index")
    plan_weight: float = Field(1.0, ge=0, description="weight of the plan scorer")
    load_weight: float = Field(2.0, ge=0, description="weight of the load scorer")
    prefix_weight: float = Field(3.0, ge=0, description="weight of the prefix-affinity scorer")
    session_weight: float = Field(10.0, ge=0, description="weight of session stickiness")
    bounded_load_factor: float = Field(1.25, ge=1.0, description="c of the bounded-load filter (load <= c x mean)")
    bounded_load_slack: float = Field(8.0, ge=0, description="absolute slack of the bounded-load filter, requests")
    decode_load_weight: float = Field(0.0, ge=0, le=1,
                                      description="load of a decoding request relative to one awaiting its first token")
    max_sessions: int = Field(100_000, ge=1, description="session keys remembered (LRU)")
    grpc_stream_interval_s: float = Field(
        0.05, ge=0, le=1.0,
        description="Generate: after the first token (always sent at once), at most one message per this many "
        "seconds, carrying every token that arrived meanwhile (a gRPC message costs the router several times "
        "what a token costs over HTTP); 0: one message per read of the engine's stream")
    grpc_stream_messages_per_s: float = Field(
        2000.0, ge=0,
        description="Generate: messages per second all streams may send together; when the streams in flight "
        "would send more at --grpc-stream-interval-s, each stream's interval widens to its share (streams / "
        "this), up to --grpc-stream-max-interval-s, so the router's gRPC message CPU stays bounded as "
        "concurrency grows; 0: no budget")
    grpc_stream_max_interval_s: float = Field(
        0.25, ge=0, le=5.0, description="Generate: the widest interval the message budget may set (seconds)")
    workers: int | None = Field(
        None, ge=1, le=64,
        description="worker processes serving both ports (SO_REUSEPORT, Linux) under a supervisor that restarts a "
        "dead one; default: one per CPU the process may use, at most 8; 1: one process, no supervisor (workers.py)")
    affinity_weight: float = Field(3.0, ge=0, description="weight of the deterministic prefix affinity (rendezvous "
                                   "hashing of the conversation's key over the engines; 0 turns it off)")
    affinity_queue_slack: float = Field(3.0, ge=0, description="the affinity holds while its engine has at most this "
                                        "many more requests awaiting a first token than the least queued one")
    replica_id: str = Field("", max_length=128,
                            description="this replica's name in the shared database (default: host:pid)")
    state_poll_interval_s: float = Field(0.25, gt=0, le=1.0,
                                         description="seconds between reads of the shared state's change counter")
    region: str = Field("", description="grid region of the engines when the fleet inventory names none")
    fallback_ci_g_per_kwh: float | None = Field(None, ge=0, description="CI until the forecaster answers (default: data file)")
    ci_refresh_s: float = Field(60.0, gt=0, description="seconds between CI refreshes from the forecaster")
    default_busy_power_w: float | None = Field(None, ge=0, description="engine power when serving (default: data file)")
    default_idle_power_w: float | None = Field(None, ge=0, description="engine idle power (default: data file)")
    watch_plans: bool = Field(True, description="subscribe to the optimizer's WatchPlans")
    slo_window_s: float = Field(300.0, ge=10, le=86400,
                                description="SLO attainment per pool over this window is reported to the optimizer")
    slo_report_interval_s: float = Field(60.0, ge=1, le=3600, description="how often that report is sent")
    feeds: bool = Field(True, description="send load to the forecaster and prefix accesses to the cache-manager")
    load_feed_interval_s: float = Field(10.0, gt=0, description="load window sent to the forecaster, seconds")
    access_feed_interval_s: float = Field(1.0, gt=0, description="seconds between access-event batches")

    @model_validator(mode="after")
    def _consistent(self) -> RouterSettings:
        # A staleness limit below two scrape intervals marks healthy engines stale between scrapes
        # (llm-d-router #2514: 15 s refresh vs 200 ms staleness, 11-13 s added latency).
        if self.stale_after_s < 2 * self.scrape_interval_s:
            raise ValueError(f"stale_after_s ({self.stale_after_s:g}) must be >= 2 x scrape_interval_s "
                             f"({self.scrape_interval_s:g})")
        if self.http_max_body_bytes_in_flight < self.http_max_body_bytes:
            raise ValueError("http_max_body_bytes_in_flight must be >= http_max_body_bytes")
        if self.eject_max_s < self.eject_base_s:
            raise ValueError("eject_max_s must be >= eject_base_s")
        for url in filter(None, (u.strip() for u in self.engines.split(","))):
            parsed = urlparse(url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise ValueError(f"engines: {url!r} is not an http(s)://host:port URL")
        return self

    def core_config(self) -> CoreConfig:
        return CoreConfig(
            scrape_interval_s=self.scrape_interval_s, stale_after_s=self.stale_after_s,
            health_interval_s=self.health_interval_s, probe_timeout_s=self.probe_timeout_s,
            eject_after_failures=self.eject_after_failures, eject_base_s=self.eject_base_s,
            eject_max_s=self.eject_max_s, max_in_flight=self.max_in_flight, max_attempts=self.max_attempts,
            first_token_timeout_s=self.first_token_timeout_s, prefix_block_chars=self.prefix_block_chars,
            prefix_index_max_bytes=self.prefix_index_max_bytes,
            policy=PolicyConfig(self.plan_weight, self.load_weight, self.prefix_weight, self.session_weight,
                                self.bounded_load_factor, self.bounded_load_slack, self.max_sessions,
                                self.decode_load_weight, self.affinity_weight, self.affinity_queue_slack),
            default_pool=self.default_pool, region=self.region, fallback_ci_g_per_kwh=self.fallback_ci_g_per_kwh,
            ci_refresh_s=self.ci_refresh_s, default_busy_power_w=self.default_busy_power_w,
            default_idle_power_w=self.default_idle_power_w, watch_plans=self.watch_plans, feeds=self.feeds,
            slo_window_s=self.slo_window_s, slo_report_interval_s=self.slo_report_interval_s,
            load_feed_interval_s=self.load_feed_interval_s, access_feed_interval_s=self.access_feed_interval_s,
            replica_id=self.replica_id, state_poll_interval_s=self.state_poll_interval_s,
        )

    def http_limits(self) -> HttpLimits:
        return HttpLimits(
            max_body_bytes=self.http_max_body_bytes, max_body_bytes_in_flight=self.http_max_body_bytes_in_flight,
            header_timeout_s=self.http_header_timeout_s,
            body_timeout_s=self.http_body_timeout_s, keepalive_timeout_s=self.http_keepalive_timeout_s,
            max_connections=self.http_max_connections or default_max_connections(),
            max_requests_per_connection=self.http_max_requests_per_connection)

    def channel_config(self, address: str) -> ChannelConfig:
        return ChannelConfig(address=address, token=self.token(), tls_ca=self.tls_ca,
                             tls_cert=self.tls_cert if self.tls_client_ca else None,
                             tls_key=self.tls_key if self.tls_client_ca else None)


# Drain: how long after the drain mark (beyond the shared state's poll) an engine's own metrics must still show
# nothing before it is called idle: another replica may pick the engine until it has read the mark.
DRAIN_SETTLE_S = 0.25

_ROLES = {
    router_pb2.CHAT_ROLE_SYSTEM: "system",
    router_pb2.CHAT_ROLE_USER: "user",
    router_pb2.CHAT_ROLE_ASSISTANT: "assistant",
    router_pb2.CHAT_ROLE_TOOL: "tool",
}


def _finite(field: str, value: float, lo: float, hi: float) -> float:
    if not math.isfinite(value) or not lo <= value <= hi:
        raise InvalidArgument(field, f"must be a finite number in [{lo:g}, {hi:g}], got {value!r}")
    return value


def describe(desc: router_pb2.RequestDescriptor, field: str = "request") -> tuple[str, str, list[dict[str, str]] | None]:
    """(path, prompt text, chat messages or None) of a request descriptor; InvalidArgument when malformed."""
    which = desc.WhichOneof("input")
    if which == "chat":
        if not desc.chat.messages:
            raise InvalidArgument(f"{field}.chat.messages", "must hold at least one message")
        messages = []
        for i, m in enumerate(desc.chat.messages):
            role = _ROLES.get(m.role)
            if role is None:
                raise InvalidArgument(f"{field}.chat.messages[{i}].role", "must be SYSTEM, USER, ASSISTANT or TOOL")
            messages.append({"role": role, "content": m.content})
        return "/v1/chat/completions", render_chat((m["role"], m["content"]) for m in messages), messages
    if which == "completion":
        return "/v1/completions", desc.completion.prompt, None
    raise InvalidArgument(f"{field}.input", "set chat or completion")


def _body(request: router_pb2.GenerateRequest, messages: list[dict[str, str]] | None, prompt: str) -> dict[str, Any]:
    s = request.sampling
    body: dict[str, Any] = {"model": request.request.model, "stream": True,
                            "stream_options": {"include_usage": True}}
    if messages is not None:
        body["messages"] = messages
    else:
        body["prompt"] = prompt
    if s.max_tokens:
        body["max_tokens"] = s.max_tokens
    if s.HasField("temperature"):
        body["temperature"] = _finite("sampling.temperature", s.temperature, 0.0, 2.0)
    if s.HasField("top_p"):
        body["top_p"] = _finite("sampling.top_p", s.top_p, 0.0, 1.0)
    if s.stop:
        body["stop"] = list(s.stop)
    if s.HasField("seed"):
        body["seed"] = s.seed
    if request.request.session_key:
        body["user"] = request.request.session_key
    return body


class RouterServicer(router_pb2_grpc.RouterServiceServicer):
    """greenserve.v1.RouterService on top of RouterCore."""

    def __init__(self, ctx: ServiceContext, core: RouterCore) -> None:
        self.ctx = ctx
        self.core = core
        self.http: HttpFront | None = None
        self.stream_interval_s = float(getattr(ctx.settings, "grpc_stream_interval_s", 0.0))
        self.stream_messages_per_s = float(getattr(ctx.settings, "grpc_stream_messages_per_s", 0.0))
        self.stream_max_interval_s = max(self.stream_interval_s,
                                         float(getattr(ctx.settings, "grpc_stream_max_interval_s", 0.0)))
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

    # -- request path ---------------------------------------------------------------------------------

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
            for ev in call.head_events:
                text, r, u = _parse_event(ev)
                usage = u or usage
                reason = r or reason
                if text or r:
                    tokens += 1
                if text:
                    texts.append(text)
            first = not texts
            if texts:
                await write(Response(request_id=request_id, text_delta="".join(texts), engine_id=engine_id,
                                     token_count=tokens))
            # after the first token: text read but not yet sent waits until the stream's interval has
            # passed since the previous message, gathering the tokens that arrive meanwhile (one timer per
            # message; a token that arrives meanwhile is only appended to a list by the reader's hook)
            reader = _EventReader(call, TEXT_KEY_CHAT if messages is not None else TEXT_KEY_COMPLETION)
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

    async def Route(self, request: router_pb2.RouteRequest, context: grpc.aio.ServicerContext
                    ) -> router_pb2.RouteResponse:
        core = self.core
        _, prompt, _ = describe(request.request)
        hashes = chain_hashes(prompt, core.config.prefix_block_chars)
        d = request.request
        try:
            decision = core.policy.choose(d.pool, d.model, hashes, d.session_key, explain=True)
        except NoEngineError as exc:
            raise Unavailable(str(exc)) from None
        if hashes:
            core.index.insert(decision.engine.id, hashes)
        tokens = int(decision.matched_blocks * core.config.prefix_block_chars / core.chars_per_token)
        return router_pb2.RouteResponse(
            engine=decision.engine.to_proto(time.monotonic(), core.config.stale_after_s), reason=decision.reason,
            plan_version=decision.plan_version, expected_cached_prompt_tokens=tokens)

    # -- engines --------------------------------------------------------------------------------------

    async def RegisterEngine(self, request: router_pb2.RegisterEngineRequest, context: grpc.aio.ServicerContext
                             ) -> router_pb2.RegisterEngineResponse:
        e = request.engine
        for name in ("id", "url", "pool", "model"):
            if not getattr(e, name):
                raise InvalidArgument(f"engine.{name}", "is required")
        for name, limit in (("id", models.ID_MAX_CHARS), ("url", models.URL_MAX_CHARS),
                            ("pool", models.POOL_MAX_CHARS), ("model", models.MODEL_MAX_CHARS),
                            ("gpu_uuid", models.UUID_MAX_CHARS), ("mig_uuid", models.UUID_MAX_CHARS),
                            ("prefill_url", models.URL_MAX_CHARS),
                            ("prefill_kv_transfer_params", models.KV_TRANSFER_PARAMS_MAX_CHARS)):
            if len(getattr(e, name)) > limit:
                raise InvalidArgument(f"engine.{name}", f"must be at most {limit} characters")
        for name in ("url", "prefill_url") if e.prefill_url else ("url",):
            value = getattr(e, name)
            try:
                parsed = urlparse(value)
                parsed.port  # noqa: B018 - raises ValueError on a port out of 0..65535 or not a number
            except ValueError as exc:  # e.g. "http://[::1" (Invalid IPv6 URL)
                raise InvalidArgument(f"engine.{name}",
                                      f"must be an http(s)://host:port URL ({exc}), got {value!r}") from None
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise InvalidArgument(f"engine.{name}", f"must be an http(s)://host:port URL, got {value!r}")
        if e.prefill_url and e.prefill_url.rstrip("/") == e.url.rstrip("/"):
            raise InvalidArgument("engine.prefill_url", "must be the prefiller's URL, not the decoder's (engine.url)")
        if e.prefill_kv_transfer_params:
            if not e.prefill_url:
                raise InvalidArgument("engine.prefill_kv_transfer_params", "only a DPD pair (engine.prefill_url) has it")
            try:
                disaggregated.kv_transfer_params(e.prefill_kv_transfer_params)
            except ValueError as exc:
                raise InvalidArgument("engine.prefill_kv_transfer_params", str(exc)) from None
        if e.kind not in common_pb2.EngineKind.values():
            raise InvalidArgument("engine.kind", f"must be a known EngineKind, got {e.kind}")
        for name in ("idle_power_w", "busy_power_w"):
            _finite(f"engine.{name}", getattr(e, name), 0.0, 1e6)
        state = EngineState(id=e.id, url=e.url.rstrip("/"), pool=e.pool, model=e.model,
                            kind=e.kind or common_pb2.ENGINE_KIND_VLLM, gpu_uuid=e.gpu_uuid, mig_uuid=e.mig_uuid,
                            idle_power_w=e.idle_power_w, busy_power_w=e.busy_power_w, source="rpc",
                            prefill_url=e.prefill_url.rstrip("/"),
                            prefill_kv_transfer_params=e.prefill_kv_transfer_params)
        try:
            stored, created = await self.core.register_engine(state)
        except ValueError as exc:
            raise InvalidArgument("engine.url", str(exc)) from None
        return router_pb2.RegisterEngineResponse(
            engine=stored.to_proto(time.monotonic(), self.core.config.stale_after_s), created=created)

    async def DeregisterEngine(self, request: router_pb2.DeregisterEngineRequest, context: grpc.aio.ServicerContext
                               ) -> router_pb2.DeregisterEngineResponse:
        if not request.engine_id:
            raise InvalidArgument("engine_id", "is required")
        if not await self.core.deregister_engine(request.engine_id):
            raise NotFound(f"engine {request.engine_id!r} is not registered", field="engine_id")
        return router_pb2.DeregisterEngineResponse()

    async def ListEngines(self, request: router_pb2.ListEnginesRequest, context: grpc.aio.ServicerContext
                          ) -> router_pb2.ListEnginesResponse:
        now = time.monotonic()
        stale = self.core.config.stale_after_s
        out = []
        for e in sorted(self.core.registry.engines.values(), key=lambda x: x.id):
            if request.pool and e.pool != request.pool:
                continue
            status = router_pb2.EngineStatus(
                engine=e.to_proto(now, stale), running_requests=int(e.running), waiting_requests=int(e.waiting),
                router_in_flight_requests=e.in_flight, kv_cache_usage_fraction=e.kv_usage_fraction,
                consecutive_failures=e.consecutive_failures, recent_ttft_s=e.recent_ttft_s,
                recent_tpot_s=e.recent_tpot_s)
            if e.metrics_wall_s:
                ts = Timestamp()
                ts.FromNanoseconds(int(e.metrics_wall_s * 1e9))
                status.metrics_scraped_at.CopyFrom(ts)
            out.append(status)
        replicas = []
        if self.core.shared is not None:
            for row in await asyncio.to_thread(self.core.shared.replicas):
                seen = Timestamp()
                seen.FromDatetime(row.seen_at)
                replicas.append(router_pb2.RouterReplica(replica_id=row.replica_id, plan_version=row.plan_version,
                                                         state_version=row.state_version, seen_at=seen))
        return router_pb2.ListEnginesResponse(engines=out, replicas=replicas, state_version=self.core.state_version)

    def _known(self, ids: list[str]) -> list[str]:
        if not ids:
            raise InvalidArgument("engine_ids", "must name at least one engine")
        for i, engine_id in enumerate(ids):
            if self.core.registry.get(engine_id) is None:
                raise NotFound(f"engine {engine_id!r} is not registered", field=f"engine_ids[{i}]")
        return ids

    async def Drain(self, request: router_pb2.DrainRequest, context: grpc.aio.ServicerContext
                    ) -> router_pb2.DrainResponse:
        ids = self._known(list(request.engine_ids))
        timeout = request.timeout_s
        if not math.isfinite(timeout) or timeout < 0:
            raise InvalidArgument("timeout_s", f"must be a finite number >= 0, got {timeout!r}")
        if request.wait and timeout == 0:
            timeout = 600.0
        remaining = context.time_remaining()
        if remaining is not None:
            timeout = min(timeout, max(0.0, remaining - 0.05))
        deadline = time.monotonic() + timeout
        settle_until = time.monotonic() + self.core.config.state_poll_interval_s + DRAIN_SETTLE_S
        idle, busy = await self.core.drain(ids, request.wait, timeout)
        worker = current_worker()
        if worker is not None:  # the other workers' requests in flight count too (workers.py)
            idle, busy = await worker.drain_wait(self.core, ids, request.wait, deadline)
        if idle:  # and other replicas' (and clients'), as the engines themselves report them
            idle, more_busy = await self.core.confirm_idle(idle, request.wait, deadline, settle_until)
            busy = [*busy, *more_busy]
        return router_pb2.DrainResponse(idle_engine_ids=idle, busy_engine_ids=busy)

    async def Undrain(self, request: router_pb2.UndrainRequest, context: grpc.aio.ServicerContext
                      ) -> router_pb2.UndrainResponse:
        await self.core.undrain(self._known(list(request.engine_ids)))
        return router_pb2.UndrainResponse()


class _EventReader:
    """Reads a committed call's SSE stream for Generate: ``read`` waits for the next upstream bytes,
    ``gather`` lets them pile up for a while, ``drain`` takes what piled up; the text of token events goes
    to ``texts`` (running tokens found by a byte scan, no JSON decoded), usage and finish reason are
    noted; ``ended`` once [DONE] came or the stream stopped (``call.done`` tells which).

    Between two reads the reader's hook (``upstream.stream_hooks``) takes each chunk the response
    parser delivers and only appends it to ``chunks``: no StreamReader bookkeeping per token (its buffer,
    chunk splits, flow control) and no wake-up, except for a chunk holding [DONE], which ends ``gather``
    at once so that the last message does not wait out the interval."""

    __slots__ = ("call", "content", "key", "buf", "texts", "tokens", "usage", "reason", "ended", "chunks",
                 "hooked", "waiter")

    def __init__(self, call: Call, key: str) -> None:
        self.call = call
        self.content = content = call.response.content
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
        # only aiohttp's own reader class is swapped (same layout); anything else is read as before
        self.hooked = type(content) is aiohttp.StreamReader and not self.ended
        if self.hooked:
            content.__class__ = HookedReader
            stream_hooks[id(content)] = self._hook

    def _hook(self, data: bytes) -> bool:
        self.chunks.append(data)
        if b"[DONE]" in data:
            waiter = self.waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        return True

    def close(self) -> None:
        if self.hooked:
            stream_hooks.pop(id(self.content), None)
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
        hook = stream_hooks.pop(id(self.content), None) if self.hooked else None
        try:
            chunk = await self.content.readany()
        except (aiohttp.ClientError, OSError):
            self.ended = True  # the engine went away (call.done stays False)
            return
        finally:
            if hook is not None:
                stream_hooks[id(self.content)] = hook
        self._take(chunk)

    def drain(self) -> None:
        """Takes what is there now, without waiting (the tokens that came while the caller slept);
        the end of the stream is noticed by the next ``read``."""
        try:
            chunk = self.content.read_nowait()  # bytes buffered while the hook was off (older)
        except (aiohttp.ClientError, OSError):
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


class _QuietRequestPath(logging.Filter):
    """Drops the runtime's per-RPC INFO line for successful Generate/Route calls: one log line per
    request on the request path costs more than the routing itself. Failures and every other RPC are
    still logged."""

    _METHODS = ("/greenserve.v1.RouterService/Generate", "/greenserve.v1.RouterService/Route")

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno <= logging.INFO and getattr(record, "rpc_method", "") in self._METHODS
                    and getattr(record, "code", "") == "OK")


_QUIET = _QuietRequestPath()


async def build(ctx: ServiceContext) -> list[Registration]:
    if _QUIET not in logging.getLogger("greenserve.server").filters:
        logging.getLogger("greenserve.server").addFilter(_QUIET)
    settings = ctx.settings
    assert isinstance(settings, RouterSettings)
    channels = {
        "forecaster": settings.channel_config(settings.forecaster_addr),
        "cache_manager": settings.channel_config(settings.cache_manager_addr),
        "optimizer": settings.channel_config(settings.optimizer_addr),
    }
    core = RouterCore(settings.core_config(), ctx.db, ctx.telemetry.meter, channels)
    await core.start([u.strip() for u in settings.engines.split(",") if u.strip()])
    servicer = RouterServicer(ctx, core)
    ctx.on_stop.append(core.stop)
    worker = current_worker()
    if worker is not None:  # one of several workers (workers.py): publishes what the whole router reads
        worker.start(core, ctx.on_stop)
    if settings.http_port >= 0:
        try:
            # the HTTP front takes the same credentials as the gRPC side: token, TLS, mTLS
            front = HttpFront(core, settings.http_host or settings.host, settings.http_port,
                              limits=settings.http_limits(), tokens=settings.tokens(),
                              ssl=ssl_context(settings.tls_cert, settings.tls_key, settings.tls_client_ca),
                              reuse_port=worker is not None)
            if worker is not None:  # metrics of the whole router, the worker header
                worker.attach(core, front)
            await front.start()
        except (OSError, ValueError):
            await core.stop()
            raise
        servicer.http = front
        ctx.on_stop.insert(0, front.stop)
    return [registration(router_pb2, router_pb2_grpc, "RouterService", servicer)]
