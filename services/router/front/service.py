"""RouterService wiring: the gRPC servicer and the build function the process entry point runs.

The same process serves gRPC (Generate, Route, engine management, Drain) and the OpenAI-compatible HTTP
front on ``--http-port``; both go through one RouterCore (core.py). The settings are in settings.py, the
Generate streaming path in grpc_generate.py, request translation in grpc_requests.py.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from urllib.parse import urlparse

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.common.app import ServiceContext
from greenserve.common.errors import (
    InvalidArgument,
    NotFound,
    Unavailable,
)
from greenserve.common.names import check_name
from greenserve.common.server import Registration, registration
from greenserve.router import models
from greenserve.router.core import RouterCore
from greenserve.router.front.grpc_generate import GenerateStream, _EventReader, _parse_event
from greenserve.router.front.grpc_requests import _body, _finite, describe
from greenserve.router.front.http_front import HttpFront
from greenserve.router.front.http_guard import ssl_context
from greenserve.router.routing.engine_admin import EngineGone
from greenserve.router.routing.engines import EngineState, engine_url_problem
from greenserve.router.routing.policy import NoEngineError, UnknownTargetError
from greenserve.router.routing.prefix_index import chain_hashes
from greenserve.router.settings import RouterSettings
from greenserve.router.upstream import disaggregated
from greenserve.router.workers import current_worker
from greenserve.v1 import common_pb2, router_pb2, router_pb2_grpc

# Re-exported: callers and tests import these from here.
__all__ = ["DRAIN_SETTLE_S", "RouterServicer", "RouterSettings", "_EventReader", "_body", "_parse_event", "build",
           "describe"]

# Drain: how long after the drain mark (beyond the shared state's poll) an engine's own metrics must still show
# nothing before it is called idle: another replica may pick the engine until it has read the mark.
DRAIN_SETTLE_S = 0.25


class RouterServicer(GenerateStream, router_pb2_grpc.RouterServiceServicer):
    """greenserve.v1.RouterService on top of RouterCore."""

    def __init__(self, ctx: ServiceContext, core: RouterCore) -> None:
        self.ctx = ctx
        self.core = core
        self.http: HttpFront | None = None
        self._init_stream_budget(ctx.settings)

    # -- request path ---------------------------------------------------------------------------------

    async def Route(self, request: router_pb2.RouteRequest, context: grpc.aio.ServicerContext
                    ) -> router_pb2.RouteResponse:
        core = self.core
        _, prompt, _ = describe(request.request)
        hashes = chain_hashes(prompt, core.config.prefix_block_chars)
        d = request.request
        try:
            try:
                decision = core.policy.choose(d.pool, d.model, hashes, d.session_key, explain=True)
            except UnknownTargetError:
                assert core.dispatcher is not None
                decision = await core.dispatcher.choose_after_refresh(d.pool, d.model, hashes, d.session_key,
                                                                      explain=True)
        except UnknownTargetError as exc:
            raise NotFound(str(exc), field=exc.grpc_field) from None
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
        # id and pool follow the services' name rule (the id goes out in every response's x-greenserve-engine
        # header and in metric labels, the pool is the optimizer's pool name); the other strings are free text
        # that must still hold no control characters
        check_name("engine.id", e.id, max_chars=models.ID_MAX_CHARS)
        check_name("engine.pool", e.pool, max_chars=models.POOL_MAX_CHARS)
        for name in ("model", "gpu_uuid", "mig_uuid"):
            if not getattr(e, name).isprintable():
                raise InvalidArgument(f"engine.{name}", f"must hold no control characters, got {getattr(e, name)!r}")
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
            if (problem := engine_url_problem(value)) is not None:
                raise InvalidArgument(f"engine.{name}", f"{problem}: {value!r}")
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
        # each engine once, in order: every copy was written and scraped (one engine named 200,000 times: 88 s
        # holding the engine-write lock); the distinct ids are at most the registered engines
        return list(dict.fromkeys(ids))

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
        try:
            idle, busy = await self.core.drain(ids, request.wait, timeout)
        except EngineGone as exc:
            raise NotFound(str(exc), field=f"engine_ids[{list(request.engine_ids).index(exc.engine_id)}]") from None
        worker = current_worker()
        if worker is not None:  # the other workers' requests in flight count too (workers.py)
            idle, busy = await worker.drain_wait(self.core, ids, request.wait, deadline)
        if idle:  # and other replicas' (and clients'), as the engines themselves report them
            idle, more_busy = await self.core.confirm_idle(idle, request.wait, deadline, settle_until)
            busy = [*busy, *more_busy]
        return router_pb2.DrainResponse(idle_engine_ids=idle, busy_engine_ids=busy)

    async def Undrain(self, request: router_pb2.UndrainRequest, context: grpc.aio.ServicerContext
                      ) -> router_pb2.UndrainResponse:
        ids = self._known(list(request.engine_ids))
        try:
            await self.core.undrain(ids)
        except EngineGone as exc:
            raise NotFound(str(exc), field=f"engine_ids[{list(request.engine_ids).index(exc.engine_id)}]") from None
        return router_pb2.UndrainResponse()

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
    envoy = None
    if settings.envoy_picker:  # the endpoint picker of Envoy-based gateways (router/envoy/)
        from greenserve.router.envoy.surface import EnvoySurface

        envoy = EnvoySurface(core, settings.http_max_body_bytes)
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
            if envoy is not None:  # receipts of requests routed through Envoy, by request id
                envoy.add_routes(front.app)
            await front.start()
        except (OSError, ValueError):
            await core.stop()
            raise
        servicer.http = front
        ctx.on_stop.insert(0, front.stop)
        ctx.on_draining.append(front.begin_drain)
    registrations = [registration(router_pb2, router_pb2_grpc, "RouterService", servicer)]
    if envoy is not None:
        registrations += envoy.registrations()
    return registrations
