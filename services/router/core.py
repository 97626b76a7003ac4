"""RouterCore: the router's parts wired together, shared by the gRPC servicer and the HTTP front.

It owns the engine registry, the prefix index, the plan store and watcher, the routing policy, the
dispatcher with its pooled session, the engine monitor, the CI cache, the feeds and the metrics, and
does the bookkeeping of a finished request (receipt, OTel metrics, feeds) in one place.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
from greenserve.common import carbon
from greenserve.common.client import ChannelConfig, create_channel
from greenserve.common.persistence import Database
from greenserve.router.accounting.attainment import AttainmentReporter, AttainmentWindow
from greenserve.router.accounting.feeds import AccessFeed, LoadFeed
from greenserve.router.accounting.folded_metrics import (
    FoldedCounter,
    FoldedHistogram,
    FoldedLabelledCounter,
    MetricFolder,
)
from greenserve.router.accounting.receipt import (
    CarbonIntensityCache,
    CarbonSettings,
    Measurement,
    Receipt,
    ReceiptMetrics,
    compute_receipt,
    load_router_defaults,
)
from greenserve.router.routing.enforcer import ActivePlan, PlanWatcher
from greenserve.router.routing.engine_admin import EngineAdmin
from greenserve.router.routing.engine_sleep import EngineSleeper, SleepSettings
from greenserve.router.routing.engines import EngineRegistry, EngineState, HealthPolicy
from greenserve.router.routing.monitor import EngineMonitor
from greenserve.router.routing.policy import PolicyConfig, RoutingPolicy
from greenserve.router.routing.prefix_index import PrefixIndex
from greenserve.router.routing.shared_state import (
    HEARTBEAT_S,
    Listener,
    SharedState,
    Snapshot,
    expired,
    until_wall_s,
    wall_to_monotonic,
)
from greenserve.router.upstream.dispatcher import Call, Dispatcher, make_session
from greenserve.router.upstream.engine_replies import MAX_MODELS_BYTES, ReplyTooLarge, read_capped
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

log = logging.getLogger("greenserve.router")

# A request naming a pool or model unknown here reads the shared state again, at most this often (refresh_state).
UNKNOWN_REFRESH_MIN_INTERVAL_S = 0.05
# While the interval in force weights MIG placements no engine runs at yet, the fleet is read again after 1, 2,
# 4 ... s (at most 30 s apart), for at most 15 minutes (a layout change and a large model's load included).
PLACEMENT_RETRY_FIRST_S = 1.0
PLACEMENT_RETRY_MAX_S = 30.0
PLACEMENT_WAIT_MAX_S = 900.0


@dataclass(frozen=True)
class CoreConfig:
    """Everything RouterCore needs from the settings (see service.RouterSettings for meanings)."""

    scrape_interval_s: float = 0.5
    stale_after_s: float = 2.0
    health_interval_s: float = 1.0
    probe_timeout_s: float = 1.0
    eject_after_failures: int = 3
    eject_base_s: float = 1.0
    eject_max_s: float = 30.0
    max_in_flight: int = 4096
    max_attempts: int = 3
    first_token_timeout_s: float = 60.0
    engine_stream_idle_timeout_s: float = 120.0  # an engine silent this long mid-response is cut (0: never)
    prefix_block_chars: int = 256
    prefix_index_max_bytes: int = 64 * 1024 * 1024
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    default_pool: str = "default"
    region: str = ""
    fallback_ci_g_per_kwh: float | None = None
    ci_refresh_s: float = 60.0
    default_busy_power_w: float | None = None
    default_idle_power_w: float | None = None
    watch_plans: bool = True
    slo_window_s: float = 300.0  # SLO attainment reported to the optimizer over this window
    slo_report_interval_s: float = 60.0
    feeds: bool = True
    load_feed_interval_s: float = 10.0
    access_feed_interval_s: float = 1.0
    replica_id: str = ""  # in router_replicas; default host:pid
    state_poll_interval_s: float = 0.25  # the shared state's change counter is read this often (shared_state.py)
    sleep: SleepSettings = field(default_factory=SleepSettings)  # engines the plan puts to sleep (engine_sleep.py)


class RouterCore(EngineAdmin):
    """See the module docstring."""

    def __init__(self, config: CoreConfig, db: Database | None, meter: Any,
                 channels: dict[str, ChannelConfig] | None = None) -> None:
        self.config = config
        self.db = db
        defaults = load_router_defaults()
        power, carbon_d, slo, kv = defaults["power"], defaults["carbon"], defaults["slo"], defaults["kv"]
        self.busy_power_w = config.default_busy_power_w if config.default_busy_power_w is not None else power["busy_power_w"]
        self.idle_power_w = config.default_idle_power_w if config.default_idle_power_w is not None else power["idle_power_w"]
        self.saturation_requests = int(power["saturation_requests"])
        self.chars_per_token = float(kv["chars_per_token"])
        params = carbon.load_default_params()
        self.carbon_settings = CarbonSettings(
            params=params, platform=params.platform(dict(carbon_d["platform"])),
            saturation_requests=self.saturation_requests, slo_ttft_s=slo["ttft_s"], slo_tpot_s=slo["tpot_s"])
        fallback_ci = config.fallback_ci_g_per_kwh if config.fallback_ci_g_per_kwh is not None \
            else carbon_d["fallback_ci_g_per_kwh"]

        self.index = PrefixIndex(config.prefix_index_max_bytes)
        self.registry = EngineRegistry(HealthPolicy(config.eject_after_failures, config.eject_base_s,
                                                    config.eject_max_s, config.stale_after_s),
                                       on_change=self._sync_index, on_verdict=self._on_verdict)
        # replicas and workers agree through the database (shared_state.py)
        self.shared = SharedState(db, config.replica_id or f"{socket.gethostname()}:{os.getpid()}") \
            if db is not None else None
        self.state_version = 0
        self._state_wake = asyncio.Event()
        self._verdict_writes = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()
        self._state_task: asyncio.Task[None] | None = None
        self._listener: Listener | None = None
        self._heartbeat: tuple[int, int, float] = (-1, -1, 0.0)
        self._refresh: asyncio.Future[bool] | None = None  # a read for a target unknown here (refresh_state)
        self._placement_task: asyncio.Task[None] | None = None  # _watch_placements
        self._refreshed_at = -UNKNOWN_REFRESH_MIN_INTERVAL_S
        self.plans = ActivePlan(db)
        self.policy = RoutingPolicy(self.registry, self.index, self.plans, config.policy)
        self.monitor = EngineMonitor(self.registry, scrape_interval_s=config.scrape_interval_s,
                                     health_interval_s=config.health_interval_s, probe_timeout_s=config.probe_timeout_s)
        channels = channels or {}
        self._channels: list[grpc.aio.Channel] = []
        forecaster = self._channel(channels.get("forecaster"))
        cache_manager = self._channel(channels.get("cache_manager"))
        self._optimizer = self._channel(channels.get("optimizer")) if config.watch_plans else None
        self.ci = CarbonIntensityCache(fallback_ci, forecaster, config.ci_refresh_s)
        self.load_feed = LoadFeed(forecaster if config.feeds else None, config.load_feed_interval_s)
        self.access_feed = AccessFeed(cache_manager if config.feeds else None, config.access_feed_interval_s,
                                      bytes_per_token=int(kv["bytes_per_token"]))
        self.sleeper = EngineSleeper(self.registry, self.monitor.scrape, config.sleep, on_change=self._runs_changed)
        self.watcher = PlanWatcher(self.plans, self._optimizer, self._on_plan,
                                   known_engines=lambda: set(self.registry.engines),
                                   on_unresolved=self._watch_placements, sleeper=self.sleeper) \
            if self._optimizer is not None else None
        self.receipt_metrics = ReceiptMetrics(meter)
        self.attainment = AttainmentWindow(config.slo_window_s)
        self.attainment_reporter = AttainmentReporter(self.attainment, self._optimizer, config.slo_report_interval_s) \
            if self._optimizer is not None else None
        self.dispatcher: Dispatcher | None = None
        self.in_flight = 0
        self.rejected = 0
        self._idle_waiters: dict[str, asyncio.Event] = {}
        self._engine_writes = asyncio.Lock()
        self.deregistered: set[str] = set()  # not registered again from the plan (EngineAdmin.deregistered)
        self.prom = CollectorRegistry()
        # the per-request counters and histograms are updated in plain Python and folded into these prometheus
        # objects when the registry is collected (folded_metrics.py): the folder is registered first
        self.prom_folder = MetricFolder()
        self.prom.register(self.prom_folder)
        fold = self.prom_folder.add
        self._prom_requests = fold(FoldedLabelledCounter(Counter(
            "greenserve_router_requests", "requests finished", ["protocol", "outcome"], registry=self.prom)))
        self._prom_ok: dict[str, FoldedCounter] = {}
        self._prom_ttft = fold(FoldedHistogram(Histogram(
            "greenserve_router_ttft_seconds", "time to first token through the router",
            buckets=(.005, .01, .025, .05, .1, .2, .5, 1, 2, 5, 10, 30), registry=self.prom)))
        self.prom_overhead = fold(FoldedHistogram(Histogram(
            "greenserve_router_overhead_seconds",
            "time the router adds before a request's first token leaves it: (arrival to first byte written) minus "
            "(request sent upstream to first token received); first-attempt requests only",
            buckets=(5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1), registry=self.prom)))
        self._prom_carbon = fold(FoldedCounter(Counter(
            "greenserve_router_carbon_grams", "gCO2e of finished requests", registry=self.prom)))
        # multiprocess_mode: how /metrics combines the router's worker processes (workers.py; unused with
        # one process): levels of live workers are summed, counts of all (dead ones too) summed, versions maxed
        Gauge("greenserve_router_in_flight", "requests in flight", registry=self.prom,
              multiprocess_mode="livesum").set_function(lambda: self.in_flight)
        Gauge("greenserve_router_plan_version", "plan version in force", registry=self.prom,
              multiprocess_mode="livemax").set_function(lambda: self.plans.version)
        Gauge("greenserve_router_prefix_index_bytes", "estimated prefix index memory", registry=self.prom,
              multiprocess_mode="livesum").set_function(self.index.estimated_bytes)
        Gauge("greenserve_router_feed_dropped", "feed items dropped", ["feed"], registry=self.prom,
              multiprocess_mode="sum")
        self._feed_gauge = self.prom._names_to_collectors["greenserve_router_feed_dropped"]
        self._feed_gauge.labels("load").set_function(lambda: self.load_feed.dropped)  # type: ignore[attr-defined]
        self._feed_gauge.labels("access").set_function(lambda: self.access_feed.dropped)  # type: ignore[attr-defined]
        Gauge("greenserve_router_retries", "requests retried on another engine before the first token",
              registry=self.prom, multiprocess_mode="sum").set_function(
            lambda: self.dispatcher.retries if self.dispatcher else 0)
        Gauge("greenserve_router_rejected", "requests refused at the in-flight limit",
              registry=self.prom, multiprocess_mode="sum").set_function(lambda: self.rejected)

    def _channel(self, cfg: ChannelConfig | None) -> grpc.aio.Channel | None:
        if cfg is None:
            return None
        channel = create_channel(cfg)
        self._channels.append(channel)
        return channel

    def _sync_index(self) -> None:
        ids = set(self.registry.engines)
        for engine_id in list(self.index._lru):
            if engine_id not in ids:
                self.index.remove_engine(engine_id)
        for engine_id in ids:
            self.index.add_engine(engine_id)

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self, engine_urls: list[str]) -> None:
        """Loads stored engines and plan, adds the flag engines, starts the background tasks."""
        if self.db is not None:
            await asyncio.to_thread(self._load_stored)
        for _i, url in enumerate(engine_urls):
            url = url.rstrip("/")
            if self.registry.by_url(url) is None:
                engine_id = url.split("://", 1)[-1].replace("/", "_")
                self.add_engine(EngineState(id=engine_id, url=url, pool=self.config.default_pool, model="",
                                            source="flag"), persist=False)
        self.dispatcher = Dispatcher(self.registry, self.policy, self.index, make_session(),
                                     max_attempts=self.config.max_attempts,
                                     first_token_timeout_s=self.config.first_token_timeout_s,
                                     saturation_requests=self.saturation_requests)
        self.dispatcher.engines.stream_idle_timeout_s = self.config.engine_stream_idle_timeout_s
        if self.shared is not None:
            self.dispatcher.refresh_state = self.refresh_state
        self.monitor.start()
        self.receipt_metrics.start()
        await self._discover_models()
        self.ci.start()
        if self.config.feeds:
            self.load_feed.start()
            self.access_feed.start()
        if self.watcher is not None:
            self.watcher.start()
        if self.attainment_reporter is not None:
            self.attainment_reporter.start()
        if self.shared is not None:
            self._state_task = asyncio.get_running_loop().create_task(self._follow_state(), name="router-state")
            if self.shared.db.backend == "postgresql":
                loop = asyncio.get_running_loop()
                self._listener = Listener(self.shared.db, lambda: loop.call_soon_threadsafe(self._state_wake.set))
                self._listener.start()

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.stop()
        if self._state_task is not None:
            self._state_task.cancel()
            await asyncio.gather(self._state_task, return_exceptions=True)
        if self._placement_task is not None:
            self._placement_task.cancel()  # the others are writes that finish
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self.attainment_reporter is not None:
            await self.attainment_reporter.stop()
        if self.watcher is not None:
            await self.watcher.stop()
        await self.sleeper.stop()
        await self.monitor.stop()
        await self.receipt_metrics.stop()
        await self.ci.stop()
        await self.load_feed.stop()
        await self.access_feed.stop()
        if self.dispatcher is not None:
            await self.dispatcher.close()  # the engine pool and the lookup session
        for channel in self._channels:
            await channel.close()
        self.prom_folder.fold()  # a worker's last counts reach its multiprocess file (folded_metrics.py)

    def _load_stored(self) -> None:
        assert self.shared is not None
        self._apply_snapshot(self.shared.snapshot())
        if self.plans.load_persisted():
            log.info("routing on stored plan v%d", self.plans.version)

    # -- shared state (replicas and workers) -----------------------------------------------------------

    async def _follow_state(self) -> None:
        """Polls the change counter (or wakes on a PostgreSQL notification) and reloads what changed;
        records what this replica routes on (router_replicas)."""
        assert self.shared is not None
        interval = self.config.state_poll_interval_s
        while True:
            try:
                await asyncio.wait_for(self._state_wake.wait(), interval)
            except TimeoutError:
                pass
            self._state_wake.clear()
            try:
                await self.sync_state()
                plan_version, state_version, beat_at = self._heartbeat
                now = time.monotonic()
                if (plan_version, state_version) != (self.plans.version, self.state_version) or \
                        now - beat_at >= HEARTBEAT_S:
                    await asyncio.to_thread(self.shared.heartbeat, self.plans.version, self.state_version)
                    self._heartbeat = (self.plans.version, self.state_version, now)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a database hiccup: keep routing on what is known
                log.warning("shared state not read", extra={"error": str(exc)})

    async def refresh_state(self) -> None:
        """Reads the shared state now, for a request naming a pool or model unknown here: another replica may have
        registered it since the last poll, and answering 404 (which no client retries) in that window would break
        the replicas' agreement. Callers at once share one read, and a read starts at most every
        ``UNKNOWN_REFRESH_MIN_INTERVAL_S`` (requests for pools that do not exist cost the database no more)."""
        if self.shared is None:
            return
        task = self._refresh
        if task is None or task.done():
            now = time.monotonic()
            if now - self._refreshed_at < UNKNOWN_REFRESH_MIN_INTERVAL_S:
                return
            self._refreshed_at = now
            task = self._refresh = asyncio.ensure_future(self.sync_state())
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a database hiccup: answer on what is known
            log.warning("shared state not read", extra={"error": str(exc)})

    async def sync_state(self) -> bool:
        """Reloads the shared state if its counter moved; True when it did."""
        assert self.shared is not None
        version = await asyncio.to_thread(self.shared.version)
        if version == self.state_version:
            return False
        async with self._engine_writes:
            snap = await asyncio.to_thread(self.shared.snapshot)
            plan = await asyncio.to_thread(self.plans.read_persisted) \
                if snap.plan_version > self.plans.version else None
            self._apply_snapshot(snap)
            if plan is not None and self.plans.apply(plan):
                log.info("plan in force from the shared database (WatchPlans lags)",
                         extra={"plan_version": plan.version})
                self.sleeper.apply(self.plans.run_targets())
        return True

    def _apply_snapshot(self, snap: Snapshot) -> None:
        """Makes the registry and the ejections match the shared state (on the event loop, or at start-up)."""
        assert self.shared is not None
        registry = self.registry
        stored = {e.id: e for e in snap.engines}
        for engine in snap.engines:
            engine = self.engine_defaults(engine)
            known = registry.get(engine.id)
            if known is None or _static(known) != _static(engine) or known.draining != engine.draining:
                kept, _ = registry.upsert(engine)
                kept.draining = engine.draining
            if engine.source != "plan":  # registered again through another replica
                self.deregistered.discard(engine.id)
        for engine_id, known in list(registry.engines.items()):
            if engine_id not in stored and known.source != "flag":  # flag engines are per replica
                registry.remove(engine_id)  # deregistered through another replica (or worker)
                self.deregistered.add(engine_id)
        now_mono, now_wall = time.monotonic(), time.time()
        mine = self.shared.replica_id
        for engine_id, engine in registry.engines.items():
            verdict = snap.verdicts.get(engine_id)
            if verdict is not None and verdict.replica_id != mine and not expired(verdict, now_wall):
                engine.apply_shared_ejection(wall_to_monotonic(verdict.ejected_until, now_mono, now_wall),
                                             verdict.eject_count, now_mono)
            elif verdict is None and engine.shared_ejection:
                engine.lift_shared_ejection()
        self.state_version = snap.version

    def _on_verdict(self, engine: EngineState, ejected: bool, reason: str) -> None:
        """An ejection or recovery on this replica: stored for the others (in order, off the event loop)."""
        if self.shared is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        until = until_wall_s(engine, time.monotonic(), time.time()) if ejected else 0.0
        shared = self.shared

        async def write() -> None:
            async with self._verdict_writes:
                try:
                    await asyncio.to_thread(shared.record_verdict, engine.id, ejected, until, engine.eject_count,
                                            reason)
                except Exception as exc:  # noqa: BLE001 - the verdict stays local; the poll goes on
                    log.warning("engine verdict not stored", extra={"engine_id": engine.id, "error": str(exc)})

        task = loop.create_task(write())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _discover_models(self) -> None:
        """Fills in the served model of engines that were given without one (GET /v1/models)."""
        assert self.dispatcher is not None
        unknown = [e for e in self.registry.engines.values() if not e.model]

        async def one(engine: EngineState) -> None:
            try:
                async with self.dispatcher.session.get(engine.url + "/v1/models", timeout=_short()) as resp:  # type: ignore[union-attr]
                    data = json.loads(await read_capped(resp, MAX_MODELS_BYTES))
                models_ = data.get("data") or []
                if models_:
                    engine.model = str(models_[0].get("id", ""))
            except ReplyTooLarge as exc:  # the model stays unknown, as for an engine down at start
                log.warning("engine reply over its cap: model not read", extra={
                    "engine_id": engine.id, "path": "/v1/models", "error": str(exc)})
            except Exception:  # noqa: BLE001 - an engine down at start is found by the monitor later
                return

        if unknown:
            await asyncio.gather(*(one(e) for e in unknown))
            self.registry.reindex()

    # -- engines ------------------------------------------------------------------------------------

    def _runs_changed(self) -> None:
        """An engine reached the run state the plan gives it, or failed to: the optimizer hears of it."""
        if self.watcher is not None:
            self.watcher.report_runs()

    async def _on_plan(self, plan: common_pb2.Plan) -> None:
        """A new plan: fetch the fleet for pool SLOs/regions and for engines the plan names but we lack."""
        await self._fetch_fleet()

    def _watch_placements(self) -> None:
        """Reads the fleet again, at growing intervals, while the interval in force weights MIG placements no
        engine of the fleet runs at yet (``ActivePlan.unresolved_placements``). A plan that changes a MIG layout
        names the new instances by placement; the gpu-partitioner creates them, starts their engines and reports
        them only after the plan arrived, and a report of new instances does not make a new plan (the optimizer
        would chase its own tail), so without this their engines had no weight until the next plan, up to an
        hour later."""
        if self._optimizer is None or (self._placement_task is not None and not self._placement_task.done()):
            return

        async def watch() -> None:
            delay_s, waited_s = PLACEMENT_RETRY_FIRST_S, 0.0
            while self.plans.unresolved_placements() and waited_s < PLACEMENT_WAIT_MAX_S:
                await asyncio.sleep(delay_s)
                waited_s += delay_s
                delay_s = min(2 * delay_s, PLACEMENT_RETRY_MAX_S)
                await self._fetch_fleet()
            left = self.plans.unresolved_placements()
            if left:
                log.warning("MIG placements of the plan still run no engine", extra={
                    "plan_version": self.plans.version, "placements": sorted(left)[:10], "waited_s": waited_s})
            else:
                log.info("MIG placements of the plan resolved to engines", extra={"plan_version": self.plans.version})
                if self.watcher is not None and waited_s:  # the report said their weight went to no engine
                    await self.watcher.follower.reconcile_now(force=True)

        self._placement_task = asyncio.get_running_loop().create_task(watch(), name="router-placements")
        self._background.add(self._placement_task)
        self._placement_task.add_done_callback(self._background.discard)

    async def _fetch_fleet(self) -> None:
        """GetFleet: pool SLOs and regions, the engines of MIG placements, and the engines the plan names that
        the router lacks (registered, source "plan"), but not one that was deregistered (``deregistered``): the
        gpu-partitioner deregisters the engines of the MIG instances it destroys before its next GPU report, and a
        plan names them (weight 0) until the next plan, so a fleet read meanwhile still lists them, with their URLs;
        registered again, they would stay in the router for good, on instances that no longer exist."""
        if self._optimizer is None:
            return
        try:
            reply = await optimizer_pb2_grpc.OptimizerServiceStub(self._optimizer).GetFleet(
                optimizer_pb2.GetFleetRequest(), timeout=5.0)
        except grpc.aio.AioRpcError as exc:
            log.warning("fleet unavailable; plan engines not registered", extra={"code": exc.code().name})
            return
        self.plans.apply_fleet(reply.fleet)
        wanted = self.plans.engine_ids()
        listed = {e.id for pool in reply.fleet.pools for e in pool.engines}
        self.deregistered &= listed  # one the fleet no longer lists may come back as a new engine
        for pool in reply.fleet.pools:
            for e in pool.engines:
                if e.id in self.deregistered:
                    if e.id in wanted and self.registry.get(e.id) is None:
                        log.info("plan engine deregistered; not registered again from the fleet",
                                 extra={"engine_id": e.id})
                    continue
                if e.id in wanted and e.url and self.registry.get(e.id) is None:
                    state = EngineState(id=e.id, url=e.url.rstrip("/"), pool=e.pool or pool.name,
                                        model=e.model or pool.model, kind=e.kind, gpu_uuid=e.gpu_uuid,
                                        mig_uuid=e.mig_uuid, idle_power_w=e.idle_power_w,
                                        busy_power_w=e.busy_power_w, source="plan",
                                        prefill_url=e.prefill_url.rstrip("/"),
                                        prefill_kv_transfer_params=e.prefill_kv_transfer_params)
                    try:
                        await self.register_engine(state)
                    except ValueError as exc:
                        log.warning("plan engine not registered", extra={"engine_id": e.id, "error": str(exc)})

    # -- per request ------------------------------------------------------------------------------------

    def admit(self) -> bool:
        """Counts a request in unless the in-flight limit is reached."""
        if self.in_flight >= self.config.max_in_flight:
            self.rejected += 1
            return False
        self.in_flight += 1
        return True

    def release(self) -> None:
        self.in_flight -= 1

    def finish(self, call: Call, protocol: str, acc_end: tuple[float, float], prompt_chars: int) -> Receipt:
        """Receipt, metrics and feeds of a request that reached its engine."""
        now = time.monotonic()
        engine = call.engine
        usage = call.usage or {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0) or int(prompt_chars / self.chars_per_token)
        completion_tokens = int(usage.get("completion_tokens") or 0) or call.events
        details = usage.get("prompt_tokens_details") or {}
        block_tokens = self.config.prefix_block_chars / self.chars_per_token
        matched_tokens = int(call.decision.matched_blocks * block_tokens)
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        cached_tokens = int(cached) if cached is not None else min(prompt_tokens, matched_tokens)
        region = self.plans.pool_region.get(engine.pool) or self.config.region
        m = Measurement(
            engine_id=engine.id, pool=engine.pool, ttft_s=call.t_first - call.t0, e2e_s=now - call.t0,
            prompt_tokens=prompt_tokens, cached_prompt_tokens=cached_tokens, completion_tokens=completion_tokens,
            energy_j=acc_end[0] - call.acc_start[0], busy_slot_s=acc_end[1] - call.acc_start[1],
            ci_g_per_kwh=self.ci.get(region), plan_version=call.decision.plan_version)
        receipt = compute_receipt(m, self.carbon_settings, self.plans.pool_slo.get(engine.pool))
        self.receipt_metrics.record(receipt, protocol)
        self.attainment.record(engine.pool, receipt.slo_met)
        ok = self._prom_ok.get(protocol)
        if ok is None:
            ok = self._prom_ok[protocol] = self._prom_requests.labels(protocol, "ok")
        ok.inc()
        self._prom_ttft.observe(m.ttft_s)
        self._prom_carbon.inc(receipt.total_g)
        if self.config.feeds:
            self.load_feed.record(engine.pool, prompt_tokens, completion_tokens)
            total = call.decision.total_blocks
            if total:
                hashes = call.hashes
                matched = call.decision.matched_blocks
                self.access_feed.record(engine.pool, hashes[-1], hashes[matched - 1] if matched else 0,
                                        int(total * block_tokens), matched_tokens, "")
        return receipt

    def count_failure(self, protocol: str, outcome: str) -> None:
        self._prom_requests.labels(protocol, outcome).inc()

def _static(e: EngineState) -> tuple[Any, ...]:
    return (e.url, e.pool, e.model, e.kind, e.gpu_uuid, e.mig_uuid, e.idle_power_w, e.busy_power_w, e.source,
            e.prefill_url, e.prefill_kv_transfer_params)


def _short() -> Any:
    import aiohttp

    return aiohttp.ClientTimeout(total=2.0)
