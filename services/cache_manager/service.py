"""CacheManagerService wiring: the gRPC servicer and the build function the process entry point runs.

State: registered servers and per-(server, plan version) outcomes in the database (models.py); the cache
index per pool in memory, journaled and checkpointed (index_state.py). The settings are in settings.py, the
group TTLs in ttl_eviction.py, the request limits and checks in request_checks.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict, deque
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from sqlalchemy import select

from greenserve.cache_manager import access_history, adaptive, journal, read_or_recompute, resize_recovery, shrink_order
from greenserve.cache_manager.disk_tier import DiskOutcome, resize_disk
from greenserve.cache_manager.enforcer import check_dram_limit, check_dram_limits, follow_plans, on_this_host
from greenserve.common.cache_index.index import CacheIndex
from greenserve.cache_manager.index_state import _now_s, _run_to_end
from greenserve.cache_manager.lmcache_admin import LmcacheAdmin, LmcacheError, check_admin_url
from greenserve.cache_manager.models import CacheApplication, LmcacheServer
from greenserve.cache_manager.request_checks import (
    CACHE_TIERS,
    MAX_BYTES,
    MAX_CHUNK_ENERGY_J,
    MAX_CHUNK_S,
    MAX_CHUNKS,
    SERVER_ID_MAX_CHARS,
    check_targets,
    in_range,
)
from greenserve.cache_manager.resize import ResizeOutcome, RestartJournal, resize_server
from greenserve.cache_manager.settings import CacheManagerSettings
from greenserve.cache_manager.snapshots import SnapshotStore
from greenserve.cache_manager.ttl_eviction import GroupTtlEviction
from greenserve.common.tasks import cancel_and_wait
from greenserve.common.app import ServiceContext
from greenserve.common.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable
from greenserve.common.names import check_name
from greenserve.common.orm_conventions import utcnow
from greenserve.common.server import Registration, registration
from greenserve.v1 import cache_manager_pb2, cache_manager_pb2_grpc

log = logging.getLogger("greenserve.cache_manager")


class CacheManagerServicer(GroupTtlEviction, cache_manager_pb2_grpc.CacheManagerServiceServicer):
    """greenserve.v1.CacheManagerService."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.settings: CacheManagerSettings = ctx.settings  # type: ignore[assignment]
        self.index_dir = Path(self.settings.data_dir) / "cache_index"
        self.snapshots = SnapshotStore(self.index_dir)
        self.indexes: dict[str, CacheIndex] = {}
        self.policies: dict[str, adaptive.LivePolicy] = {}
        self.server_bytes: dict[str, tuple[str, int]] = {}
        self.history: dict[str, deque[tuple[float, int, str]]] = {}
        self.ttls: dict[str, dict[str, float]] = {}
        self._lock = asyncio.Lock()
        self.ttl_rounds = 0
        self.last_ttl_error = ""
        # Journal ids of each pool's current / previous checkpoint on disk (None: no such file).
        self._cur_id: dict[str, int | None] = {}
        self._prev_id: dict[str, int | None] = {}
        self.last_event_id = 0
        self._events_since_checkpoint = 0
        self._checkpoint_task: asyncio.Task | None = None
        self.checkpoints = 0
        self._recovery: asyncio.Task[list[resize_recovery.Settled]] | None = None
        self.access_history = access_history.AccessHistory(ctx.db, self.settings.access_history_per_hour,
                                                           self.settings.access_history_days)
        self._load_server_sizes()
        self._load_indexes()

    # ----- resize steps a kill cut ----------------------------------------------------------------
    def start_recovery(self) -> None:
        """Settles the resize steps a kill cut (resize_recovery.py), in the background, holding the resize lock."""
        self._recovery = asyncio.get_running_loop().create_task(resize_recovery.recover(self),
                                                               name="cache-manager-resize-recovery")

    async def recovered(self) -> list[resize_recovery.Settled]:
        """The steps settled at start, once they all are ([] without a recovery, or when it failed: logged)."""
        if self._recovery is None:
            return []
        try:
            return await asyncio.shield(self._recovery)
        except asyncio.CancelledError:
            raise
        except Exception:  # the rows stay for the next start; the plan is followed meanwhile
            log.exception("settling the resize steps a kill cut failed")
            return []

    # ----- helpers -------------------------------------------------------------------------------
    def _load_server_sizes(self) -> None:
        """Each registered server's L1 size as last applied by a plan (the adaptive policy's capacity until a
        server is read again)."""
        with self.ctx.db.session() as s:
            for row in s.scalars(select(LmcacheServer)):
                size = s.scalar(select(CacheApplication.l1_size_bytes).where(
                    CacheApplication.server_id == row.id, CacheApplication.state == "applied"
                ).order_by(CacheApplication.plan_version.desc()).limit(1))
                if size:
                    self.server_bytes[row.id] = (row.pool, int(size))

    def _admin(self, url: str) -> LmcacheAdmin:
        return LmcacheAdmin(url, timeout_s=self.settings.lmcache_timeout_s)

    def _servers(self, pool: str | None = None) -> list[LmcacheServer]:
        with self.ctx.db.session() as s:
            stmt = select(LmcacheServer)
            if pool:
                stmt = stmt.where(LmcacheServer.pool == pool)
            rows = list(s.scalars(stmt.order_by(LmcacheServer.id)))
            s.expunge_all()
            return rows

    def _server(self, server_id: str) -> LmcacheServer:
        if not server_id or len(server_id) > SERVER_ID_MAX_CHARS:
            raise InvalidArgument("server_id", f"required, at most {SERVER_ID_MAX_CHARS} characters")
        with self.ctx.db.session() as s:
            row = s.get(LmcacheServer, server_id)
            if row is None:
                raise NotFound(f"no cache server {server_id!r}")
            s.expunge(row)
            return row

    def _last_plan(self, server_id: str) -> int:
        with self.ctx.db.session() as s:
            v = s.scalar(select(CacheApplication.plan_version).where(
                CacheApplication.server_id == server_id, CacheApplication.state == "applied"
            ).order_by(CacheApplication.plan_version.desc()).limit(1))
            return int(v or 0)

    async def _describe(self, row: LmcacheServer) -> cache_manager_pb2.CacheServer:
        admin = self._admin(row.url)
        disk = 0
        try:
            state = await admin.state()
            reachable, dram, used = True, state.l1_total_bytes, state.l1_used_bytes
            if state.l2_adapters:  # the disk size in force: the default salt's L2 quota (disk_tier.py)
                disk = (await admin.disk_state()).quota_bytes or 0
        except LmcacheError:
            reachable, dram, used = False, 0, 0
        finally:
            await admin.aclose()
        if reachable:
            self.note_server_bytes(row.id, row.pool, dram)
        return cache_manager_pb2.CacheServer(id=row.id, pool=row.pool, url=row.url, dram_bytes=dram,
                                             disk_bytes=disk, dram_used_bytes=used, reachable=reachable,
                                             applied_plan_version=self._last_plan(row.id))

    # ----- servers -------------------------------------------------------------------------------
    async def RegisterCacheServer(self, request: cache_manager_pb2.RegisterCacheServerRequest,
                                  context: grpc.aio.ServicerContext) -> cache_manager_pb2.RegisterCacheServerResponse:
        srv = request.server
        check_name("server.id", srv.id, max_chars=SERVER_ID_MAX_CHARS)
        check_name("server.pool", srv.pool)
        try:
            url = check_admin_url(srv.url)
        except ValueError as exc:
            raise InvalidArgument("server.url", f"must be the http(s) base URL of an LMCache HTTP admin API: {exc}") \
                from None
        with self.ctx.db.session() as s:
            other = s.scalar(select(LmcacheServer).where(LmcacheServer.url == url, LmcacheServer.id != srv.id))
            if other is not None:
                raise InvalidArgument("server.url", f"already registered as {other.id!r}")
            row = s.get(LmcacheServer, srv.id)
            if row is None:
                row = LmcacheServer(id=srv.id, pool=srv.pool, url=url, registered_at=utcnow())
                s.add(row)
            else:
                row.pool, row.url = srv.pool, url
            s.commit()
            s.expunge(row)
        return cache_manager_pb2.RegisterCacheServerResponse(server=await self._describe(row))

    async def DeregisterCacheServer(self, request: cache_manager_pb2.DeregisterCacheServerRequest,
                                    context: grpc.aio.ServicerContext) -> cache_manager_pb2.DeregisterCacheServerResponse:
        # Under the lock: an apply or resize in progress records its outcome for the server once its LMCache
        # calls return (a row deleted meanwhile broke the record's foreign key: INTERNAL).
        async with self._lock:
            row = self._server(request.server_id)
            with self.ctx.db.session() as s:
                s.delete(s.get(LmcacheServer, row.id))
                s.commit()
            self.note_server_bytes(row.id, row.pool, None)
        return cache_manager_pb2.DeregisterCacheServerResponse()

    async def ListCacheServers(self, request: cache_manager_pb2.ListCacheServersRequest,
                               context: grpc.aio.ServicerContext) -> cache_manager_pb2.ListCacheServersResponse:
        if request.pool:
            check_name("pool", request.pool)
        rows = self._servers(request.pool or None)
        described = await asyncio.gather(*(self._describe(r) for r in rows))
        return cache_manager_pb2.ListCacheServersResponse(servers=described)

    # ----- plans, resizes, quotas ----------------------------------------------------------------
    def _record(self, server_id: str, version: int, dram: int, disk: int | None, applied: bool, detail: str) -> None:
        with self.ctx.db.session() as s:
            row = s.scalar(select(CacheApplication).where(
                CacheApplication.server_id == server_id, CacheApplication.plan_version == version))
            if row is None:
                row = CacheApplication(server_id=server_id, plan_version=version, l1_size_bytes=dram,
                                       l2_size_bytes=disk, state="pending", detail="", applied_at=utcnow())
                s.add(row)
            row.state = "applied" if applied else "failed"
            row.detail = detail[:2000]
            row.applied_at = utcnow()
            s.commit()

    async def ApplyCachePlan(self, request: cache_manager_pb2.ApplyCachePlanRequest,
                             context: grpc.aio.ServicerContext) -> cache_manager_pb2.ApplyCachePlanResponse:
        if request.plan_version < 1:
            raise InvalidArgument("plan_version", "must be >= 1")
        if request.plan_version > 2**31 - 1:
            raise InvalidArgument("plan_version", "must fit in 31 bits")
        check_targets(request.targets, {r.pool for r in self._servers()})
        results = []
        async with self._lock:
            by_pool: dict[str, list[LmcacheServer]] = defaultdict(list)
            for row in self._servers():
                by_pool[row.pool].append(row)
            # All or nothing, as the plan follower: no server is resized when one target is more than a server
            # of its pool can take (--lmcache-max-dram-bytes; the servers checked are the ones then resized).
            check_dram_limits(request.targets, by_pool, self.settings.lmcache_max_dram_bytes)
            for t in request.targets:
                for row in by_pool.get(t.pool, ()):
                    results.append(await self._apply_one(row, request.plan_version, t.dram_bytes, t.ttl_s,
                                                         t.disk_bytes, t.disk_medium, t.disk_path))
        return cache_manager_pb2.ApplyCachePlanResponse(results=results)

    async def _apply_one(self, row: LmcacheServer, version: int, dram: int, ttl_s: float, disk: int = 0,
                         disk_medium: str = "", disk_path: str = "") -> cache_manager_pb2.CacheApplyResult:
        with self.ctx.db.session() as s:
            done = s.scalar(select(CacheApplication).where(
                CacheApplication.server_id == row.id, CacheApplication.plan_version == version,
                CacheApplication.state == "applied"))
            if done is not None:
                return cache_manager_pb2.CacheApplyResult(
                    server_id=row.id, applied=True, dram_bytes=done.l1_size_bytes,
                    detail=f"plan version {version} already applied: {done.detail}")
        outcome = await self._resize(row, dram, version)
        detail = outcome.detail
        disk_in_force = 0
        if outcome.applied:
            # The disk tier after the DRAM one (disk_tier.py); a disk size LMCache cannot take leaves the
            # previous one and says why, without undoing the DRAM size.
            disk_outcome = await self._resize_disk(row, disk, disk_medium, disk_path)
            disk_in_force = disk_outcome.disk_bytes
            detail += f"; {disk_outcome.detail}" if disk_outcome.detail else ""
        if outcome.applied and ttl_s > 0:
            self.ttls.setdefault(row.pool, {})["*"] = ttl_s
            detail += f"; TTL {ttl_s:g} s in force for pool {row.pool}"
        self._record(row.id, version, outcome.dram_bytes if outcome.applied else dram,
                     disk_in_force if outcome.applied else None, outcome.applied, detail)
        journal.end_resize(self.ctx.db, row.id)  # its outcome recorded: the restart step is over
        return cache_manager_pb2.CacheApplyResult(server_id=row.id, applied=outcome.applied, detail=detail,
                                                  dram_bytes=outcome.dram_bytes, disk_bytes=disk_in_force)

    async def _resize(self, row: LmcacheServer, dram: int, plan_version: int | None = None) -> ResizeOutcome:
        """Resize one server (the caller holds the lock); entries it evicts are journaled, and so is its restart
        step (journal.begin_resize), which the caller ends (journal.end_resize) once the outcome is recorded."""
        db = self.ctx.db
        version = plan_version if plan_version is not None and 1 <= plan_version <= 2**31 - 1 else None
        steps = RestartJournal(
            begin=lambda previous, quotas: journal.begin_resize(db, row.id, version, dram, previous, quotas),
            running=lambda pid, ticks: journal.note_restart(db, row.id, pid, ticks))
        admin = self._admin(row.url)
        try:
            outcome = await resize_server(admin, row.id, self.indexes.get(row.pool), dram, _now_s(),
                                          self.settings.lmcache_restart_command, journal=steps)
        finally:
            await admin.aclose()
        await self._journal_evictions(row.pool, outcome.evicted_keys)
        if outcome.applied:
            self.note_server_bytes(row.id, row.pool, outcome.dram_bytes)
        if outcome.evicted_entries and row.pool in self.policies:
            outcome = replace(outcome, detail=f"{outcome.detail}; {self.policies[row.pool].text()}")
        return outcome

    def _shrink_order(self, pool: str) -> Callable[[int], Awaitable[shrink_order.Leader]] | None:
        """The order of a disk shrink of `pool` to a target size: the adaptive policy's at that size
        (shrink_order.py), or --eviction-policy's fixed one (None: lowest LCS first)."""
        if self.settings.eviction_policy == "lcs":
            return None
        if self.settings.eviction_policy == "lru":
            async def fixed(_target_bytes: int) -> shrink_order.Leader:
                return shrink_order.Leader("LRU", 0.0, 0.0, 0, fixed=True)

            return fixed

        async def choose(target_bytes: int) -> shrink_order.Leader:
            events = await asyncio.to_thread(shrink_order.recent_events, self.ctx.db, pool)
            return await asyncio.to_thread(shrink_order.choose_leader, events, target_bytes)

        return choose

    async def _resize_disk(self, row: LmcacheServer, disk: int, disk_medium: str = "",
                           disk_path: str = "") -> DiskOutcome:
        """Size one server's disk tier at run time (the caller holds the lock); evictions are journaled."""
        admin = self._admin(row.url)
        try:
            outcome = await resize_disk(admin, self.indexes.get(row.pool), disk, _now_s(), local=on_this_host(row.url),
                                        choose_order=self._shrink_order(row.pool), disk_medium=disk_medium,
                                        disk_path=disk_path)
        finally:
            await admin.aclose()
        await self._journal_evictions(row.pool, outcome.evicted_keys)
        return outcome

    async def ResizeCache(self, request: cache_manager_pb2.ResizeCacheRequest,
                          context: grpc.aio.ServicerContext) -> cache_manager_pb2.ResizeCacheResponse:
        row = self._server(request.server_id)
        if request.dram_bytes > MAX_BYTES:
            raise InvalidArgument("dram_bytes", "must be 0-2^50 bytes (a negative size arrives as a huge uint64)")
        if request.HasField("disk_bytes") and request.disk_bytes > MAX_BYTES:
            raise InvalidArgument("disk_bytes", "must be 0-2^50 bytes (a negative size arrives as a huge uint64)")
        check_dram_limit("dram_bytes", request.dram_bytes, row, self.settings.lmcache_max_dram_bytes)
        async with self._lock:
            outcome = await self._resize(row, request.dram_bytes)
            applied, detail, evicted = outcome.applied, outcome.detail, outcome.evicted_entries
            disk = 0
            if request.HasField("disk_bytes") and outcome.applied:
                disk_outcome = await self._resize_disk(row, request.disk_bytes)
                applied, disk = disk_outcome.applied, disk_outcome.disk_bytes
                detail += f"; {disk_outcome.detail}" if disk_outcome.detail else ""
                evicted += disk_outcome.evicted_entries
            journal.end_resize(self.ctx.db, row.id)
        return cache_manager_pb2.ResizeCacheResponse(
            result=cache_manager_pb2.CacheApplyResult(server_id=row.id, applied=applied, detail=detail,
                                                      dram_bytes=outcome.dram_bytes, disk_bytes=disk),
            evicted_entries=evicted)

    async def SetQuota(self, request: cache_manager_pb2.SetQuotaRequest,
                       context: grpc.aio.ServicerContext) -> cache_manager_pb2.SetQuotaResponse:
        row = self._server(request.server_id)
        if any(c in request.salt for c in "@/\\\x00") or len(request.salt) > 128:
            raise InvalidArgument("salt", "at most 128 characters, without @ / \\ or NUL (LMCache's rule)")
        if request.quota_bytes > MAX_BYTES:
            raise InvalidArgument("quota_bytes", "must be 0-2^50 bytes (a negative size arrives as a huge uint64)")
        admin = self._admin(row.url)
        try:
            await admin.set_quota(request.salt, request.quota_bytes)
        except LmcacheError as exc:
            raise Unavailable(str(exc)) from exc
        finally:
            await admin.aclose()
        return cache_manager_pb2.SetQuotaResponse()

    # ----- index ---------------------------------------------------------------------------------
    async def ReportAccesses(self, request_iterator: AsyncIterable[cache_manager_pb2.ReportAccessesRequest],
                             context: grpc.aio.ServicerContext) -> cache_manager_pb2.ReportAccessesResponse:
        # All or nothing: read and check the whole stream, journal it in one transaction, then apply it.
        messages = await journal.read_stream(request_iterator)
        events = journal.check_events(messages, _now_s())
        await _run_to_end(self._report(events))
        self._maybe_checkpoint()
        return cache_manager_pb2.ReportAccessesResponse(accepted_events=len(events))

    async def _report(self, events: list[journal.Event]) -> None:
        async with self._lock:
            new_pools = sorted({ev.pool for ev in events} - self.indexes.keys())
            if len(self.indexes) + len(new_pools) > self.settings.index_max_pools:
                raise ResourceExhausted(f"at most {self.settings.index_max_pools} pools have an index "
                                        f"(--index-max-pools); refused new pool {new_pools[0]!r}",
                                        field="events.pool")
            await self._journal_and_apply(events)
            try:  # the events are acknowledged once journaled: a failed record loses replay samples only
                await asyncio.to_thread(self.access_history.record, events)
            except Exception as exc:  # noqa: BLE001
                log.warning("access history: %d events not recorded for the planner's replay: %s: %s",
                            len(events), type(exc).__name__, exc)

    async def GetAccessWindow(self, request: cache_manager_pb2.GetAccessWindowRequest,
                              context: grpc.aio.ServicerContext) -> cache_manager_pb2.GetAccessWindowResponse:
        query = access_history.check_request(request)
        return await asyncio.to_thread(self.access_history.window, query)

    async def ListEvictionCandidates(self, request: cache_manager_pb2.ListEvictionCandidatesRequest,
                                     context: grpc.aio.ServicerContext) -> cache_manager_pb2.ListEvictionCandidatesResponse:
        check_name("pool", request.pool)
        if request.limit > 10000:
            raise InvalidArgument("limit", "at most 10000")
        # Under the lock: choosing victims changes the index (its candidate pool, the online tau a checkpoint
        # saves), and a checkpoint writes the index from a worker thread while holding the lock (index_state.py).
        async with self._lock:
            if request.pool not in self.indexes:
                raise NotFound(f"no index for pool {request.pool!r}")
            views = self.indexes[request.pool].lowest(request.limit or 100, _now_s())
        return cache_manager_pb2.ListEvictionCandidatesResponse(entries=[
            cache_manager_pb2.CacheEntryScore(entry_key=v.entry_key, lcs_score=v.score, size_bytes=v.size_bytes,
                                              hits=v.hits, age_s=v.age_s) for v in views])

    # ----- read or recompute ---------------------------------------------------------------------
    async def DecideReadOrRecompute(self, request: cache_manager_pb2.DecideReadOrRecomputeRequest,
                                    context: grpc.aio.ServicerContext) -> cache_manager_pb2.DecideReadOrRecomputeResponse:
        in_range("delay_budget_s", request.delay_budget_s, 0.0, MAX_CHUNK_S, " s")
        in_range("queue_wait_s", request.queue_wait_s, 0.0, MAX_CHUNK_S, " s")
        n = len(request.chunks)
        if n > MAX_CHUNKS:
            raise InvalidArgument("chunks", f"at most {MAX_CHUNKS} chunks, got {n}")
        arrays = np.zeros((4, n))
        limits = (MAX_CHUNK_S, MAX_CHUNK_ENERGY_J, MAX_CHUNK_S, MAX_CHUNK_ENERGY_J)
        for i, c in enumerate(request.chunks):
            for j, name in enumerate(("read_s", "read_energy_j", "recompute_s", "recompute_energy_j")):
                arrays[j, i] = in_range(f"chunks[{i}].{name}", getattr(c, name), 0.0, limits[j],
                                         " s" if name.endswith("_s") else " J")
            if c.tier not in CACHE_TIERS:
                raise InvalidArgument(f"chunks[{i}].tier", "must be set to a known cache tier")
        d = read_or_recompute.decide(*arrays, delay_budget_s=request.delay_budget_s,
                                     queue_wait_s=request.queue_wait_s)
        actions = [cache_manager_pb2.CHUNK_ACTION_READ if a == read_or_recompute.READ
                   else cache_manager_pb2.CHUNK_ACTION_RECOMPUTE for a in d.actions]
        return cache_manager_pb2.DecideReadOrRecomputeResponse(actions=actions, energy_j=d.energy_j, time_s=d.time_s)


def _policy_metrics(meter: Meter, servicer: CacheManagerServicer) -> None:
    """The eviction policy of every pool, as observable instruments (read at each metric export)."""

    def leads(_options: CallbackOptions) -> Iterable[Observation]:
        for pool, p in list(servicer.policies.items()):
            yield Observation(1 if p.leader == "LCS" else 0, {"pool": pool, "policy": p.leader, "mode": p.mode})

    def switches(_options: CallbackOptions) -> Iterable[Observation]:
        for pool, p in list(servicer.policies.items()):
            yield Observation(p.duel.switches, {"pool": pool})

    def window(_options: CallbackOptions) -> Iterable[Observation]:
        for pool, p in list(servicer.policies.items()):
            for cache, tokens in p.status()["window_hit_tokens"].items():
                yield Observation(float(tokens), {"pool": pool, "cache": cache})

    meter.create_observable_gauge(
        "greenserve.cache_manager.eviction_policy.lcs_leads", callbacks=[leads], unit="1",
        description="1 while a pool's entries are evicted in LCS order, 0 in LRU order (attribute policy: the leader)")
    meter.create_observable_counter(
        "greenserve.cache_manager.eviction_policy.switches", callbacks=[switches], unit="{switch}",
        description="changes of a pool's eviction order by the adaptive policy")
    meter.create_observable_gauge(
        "greenserve.cache_manager.eviction_policy.window_hit_tokens", callbacks=[window], unit="{token}",
        description="hit tokens over the adaptive policy's window: its LRU and LCS shadow caches and the real cache")


def build(ctx: ServiceContext) -> list[Registration]:
    servicer = CacheManagerServicer(ctx)
    _policy_metrics(ctx.telemetry.meter, servicer)
    servicer.start_recovery()  # before the plan follower starts: it reconciles only once this is done
    follow_plans(ctx, servicer)  # stops first (its on_stop hook precedes the index save below)
    settings: CacheManagerSettings = ctx.settings  # type: ignore[assignment]
    task: asyncio.Task | None = None
    if settings.ttl_recompute_s > 0:
        async def loop() -> None:
            while True:
                await asyncio.sleep(settings.ttl_recompute_s)
                await servicer.ttl_round()
        task = asyncio.get_event_loop().create_task(loop())

    async def checkpoints() -> None:
        while True:
            await asyncio.sleep(settings.snapshot_interval_s)
            try:
                await servicer.checkpoint()
            except Exception as exc:  # noqa: BLE001 - disk full, permissions...: the journal keeps every event
                log.error("cache index checkpoint failed (the journal keeps the events; retried in %g s): %s: %s",
                          settings.snapshot_interval_s, type(exc).__name__, exc)

    checkpoint_task = asyncio.get_event_loop().create_task(checkpoints())

    async def stop() -> None:
        await cancel_and_wait(task, checkpoint_task, servicer._checkpoint_task,  # nothing else changes the index
                              servicer._recovery)  # a restart it runs is killed; its row stays for the next start
        await servicer.checkpoint()

    ctx.on_stop.append(stop)
    return [registration(cache_manager_pb2, cache_manager_pb2_grpc, "CacheManagerService", servicer)]
