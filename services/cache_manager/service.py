"""CacheManagerService wiring: settings, servicer and the build function the process entry point runs.

State: registered servers and per-(server, plan version) outcomes in the database (models.py); the cache
index per pool in memory, snapshotted to `<data_dir>/cache_index/<pool>.npz` after every access stream
and on stop, and reloaded at start (so the index survives a restart).
"""

from __future__ import annotations

import asyncio
import math
import re
import socket
import time
from collections import deque
from pathlib import Path
from typing import ClassVar

import numpy as np
from pydantic import Field
from sqlalchemy import select

from greenserve.cache_manager import group_ttl, read_or_recompute
from greenserve.cache_manager.enforcer import follow_plans
from greenserve.cache_manager.index import CacheIndex
from greenserve.cache_manager.lmcache_admin import LmcacheAdmin, LmcacheError
from greenserve.cache_manager.models import CacheApplication, LmcacheServer
from greenserve.cache_manager.resize import resize_server
from greenserve.common.tasks import cancel_and_wait
from greenserve.common.app import ServiceContext
from greenserve.common.config import DependencyAddresses, ServiceSettings
from greenserve.common.errors import InvalidArgument, NotFound, Unavailable
from greenserve.common.persistence import utcnow
from greenserve.common.server import Registration, registration
from greenserve.v1 import cache_manager_pb2, cache_manager_pb2_grpc, common_pb2

_POOL_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
HISTORY_PER_POOL = 200_000
TTL_WINDOW_S = 3600.0  # accesses a scheduled TTL recompute looks at (Kareto recomputes from a recent window)


class CacheManagerSettings(ServiceSettings, DependencyAddresses):
    """Flags and GREENSERVE_* env vars of greenserve-cache-manager."""

    service_name: ClassVar[str] = "cache_manager"

    lmcache_restart_command: str | None = Field(
        None, description="command template that restarts an LMCache server with a new L1 size "
        "({server_id}, {url}, {l1_size_bytes}, {l1_size_gb}); without it L1 resizes fail (LMCache 0.5.6 "
        "cannot resize DRAM L1 at run time)")
    lmcache_timeout_s: float = Field(5.0, gt=0, le=300, description="timeout of one LMCache admin call")
    ttl_recompute_s: float = Field(0.0, ge=0, description="recompute and apply group TTLs of every pool this "
                                   "often (0: only on ComputeGroupTtls)")
    follow_plans: bool = Field(True, description="follow the optimizer's plans (WatchPlans at --optimizer-addr) and "
                               "apply their cache targets; off: only the RPCs change cache sizes")
    instance: str = Field(default_factory=socket.gethostname, min_length=1, max_length=253,
                          description="name of this cache-manager in enforcement reports (default: the host name)")
    lmcache_max_dram_bytes: int = Field(0, ge=0, le=2**50, description="largest L1 size a plan may give one LMCache "
                                        "server, bytes (larger: refused); 0: this host's memory for servers on "
                                        "this host, else no limit")


def _now_s() -> float:
    return time.time()


class CacheManagerServicer(cache_manager_pb2_grpc.CacheManagerServiceServicer):
    """greenserve.v1.CacheManagerService."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.settings: CacheManagerSettings = ctx.settings  # type: ignore[assignment]
        self.index_dir = Path(self.settings.data_dir) / "cache_index"
        self.indexes: dict[str, CacheIndex] = {}
        self.history: dict[str, deque[tuple[float, int, str]]] = {}
        self.ttls: dict[str, dict[str, float]] = {}
        self._lock = asyncio.Lock()
        self.ttl_rounds = 0
        self.last_ttl_error = ""
        self._load_indexes()

    # ----- index persistence ---------------------------------------------------------------------
    def _load_indexes(self) -> None:
        if not self.index_dir.is_dir():
            return
        for path in self.index_dir.glob("*.npz"):
            self.indexes[path.stem] = CacheIndex.load(path)

    def save_indexes(self) -> None:
        for pool, index in self.indexes.items():
            index.save(self.index_dir / f"{pool}.npz")

    def _index(self, pool: str) -> CacheIndex:
        if pool not in self.indexes:
            self.indexes[pool] = CacheIndex()
        return self.indexes[pool]

    # ----- helpers -------------------------------------------------------------------------------
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
        if not server_id:
            raise InvalidArgument("server_id", "required")
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
        try:
            state = await admin.state()
            reachable, dram, used = True, state.l1_total_bytes, state.l1_used_bytes
        except LmcacheError:
            reachable, dram, used = False, 0, 0
        finally:
            await admin.aclose()
        return cache_manager_pb2.CacheServer(id=row.id, pool=row.pool, url=row.url, dram_bytes=dram,
                                             dram_used_bytes=used, reachable=reachable,
                                             applied_plan_version=self._last_plan(row.id))

    # ----- servers -------------------------------------------------------------------------------
    async def RegisterCacheServer(self, request, context):  # noqa: N802
        srv = request.server
        if not srv.id or len(srv.id) > 64:
            raise InvalidArgument("server.id", "required, at most 64 characters")
        if not _POOL_RE.match(srv.pool):
            raise InvalidArgument("server.pool", "required: 1-128 of A-Z a-z 0-9 . _ -")
        if not re.match(r"^https?://[^/\s]+", srv.url):
            raise InvalidArgument("server.url", "must be an http(s) URL of the LMCache HTTP admin API")
        with self.ctx.db.session() as s:
            other = s.scalar(select(LmcacheServer).where(LmcacheServer.url == srv.url, LmcacheServer.id != srv.id))
            if other is not None:
                raise InvalidArgument("server.url", f"already registered as {other.id!r}")
            row = s.get(LmcacheServer, srv.id)
            if row is None:
                row = LmcacheServer(id=srv.id, pool=srv.pool, url=srv.url, registered_at=utcnow())
                s.add(row)
            else:
                row.pool, row.url = srv.pool, srv.url
            s.commit()
            s.expunge(row)
        return cache_manager_pb2.RegisterCacheServerResponse(server=await self._describe(row))

    async def DeregisterCacheServer(self, request, context):  # noqa: N802
        row = self._server(request.server_id)
        with self.ctx.db.session() as s:
            s.delete(s.get(LmcacheServer, row.id))
            s.commit()
        return cache_manager_pb2.DeregisterCacheServerResponse()

    async def ListCacheServers(self, request, context):  # noqa: N802
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

    async def ApplyCachePlan(self, request, context):  # noqa: N802
        if request.plan_version < 1:
            raise InvalidArgument("plan_version", "must be >= 1")
        if request.plan_version > 2**31 - 1:
            raise InvalidArgument("plan_version", "must fit in 31 bits")
        self._check_targets(request.targets, {r.pool for r in self._servers()})
        results = []
        async with self._lock:
            for t in request.targets:
                for row in self._servers(t.pool):
                    results.append(await self._apply_one(row, request.plan_version, t.dram_bytes, t.ttl_s))
        return cache_manager_pb2.ApplyCachePlanResponse(results=results)

    @staticmethod
    def _check_targets(targets, known_pools: set[str], field: str = "targets") -> None:
        """InvalidArgument naming the first bad target (ApplyCachePlan and the plan follower, enforcer.py)."""
        seen: set[str] = set()
        for i, t in enumerate(targets):
            if t.pool not in known_pools:
                raise InvalidArgument(f"{field}[{i}].pool", f"unknown pool {t.pool!r} (no registered server)")
            if t.pool in seen:
                raise InvalidArgument(f"{field}[{i}].pool", f"pool {t.pool!r} appears twice")
            seen.add(t.pool)
            if not math.isfinite(t.ttl_s) or t.ttl_s < 0:
                raise InvalidArgument(f"{field}[{i}].ttl_s", "must be finite and >= 0")
            if t.dram_bytes > 2**50 or t.disk_bytes > 2**53:
                raise InvalidArgument(f"{field}[{i}].dram_bytes", "implausibly large (negative sizes arrive "
                                      "as huge uint64 values)")

    async def _apply_one(self, row: LmcacheServer, version: int, dram: int, ttl_s: float):
        with self.ctx.db.session() as s:
            done = s.scalar(select(CacheApplication).where(
                CacheApplication.server_id == row.id, CacheApplication.plan_version == version,
                CacheApplication.state == "applied"))
            if done is not None:
                return cache_manager_pb2.CacheApplyResult(
                    server_id=row.id, applied=True, dram_bytes=done.l1_size_bytes,
                    detail=f"plan version {version} already applied: {done.detail}")
        outcome = await self._resize(row, dram)
        detail = outcome.detail
        if outcome.applied and ttl_s > 0:
            self.ttls.setdefault(row.pool, {})["*"] = ttl_s
            detail += f"; TTL {ttl_s:g} s in force for pool {row.pool}"
        self._record(row.id, version, outcome.dram_bytes if outcome.applied else dram, None, outcome.applied, detail)
        return cache_manager_pb2.CacheApplyResult(server_id=row.id, applied=outcome.applied, detail=detail,
                                                  dram_bytes=outcome.dram_bytes)

    async def _resize(self, row: LmcacheServer, dram: int):
        admin = self._admin(row.url)
        try:
            return await resize_server(admin, row.id, self.indexes.get(row.pool), dram, _now_s(),
                                       self.settings.lmcache_restart_command)
        finally:
            await admin.aclose()

    async def ResizeCache(self, request, context):  # noqa: N802
        row = self._server(request.server_id)
        if request.dram_bytes > 2**50:
            raise InvalidArgument("dram_bytes", "implausibly large (a negative size arrives as a huge uint64)")
        async with self._lock:
            outcome = await self._resize(row, request.dram_bytes)
        return cache_manager_pb2.ResizeCacheResponse(
            result=cache_manager_pb2.CacheApplyResult(server_id=row.id, applied=outcome.applied,
                                                      detail=outcome.detail, dram_bytes=outcome.dram_bytes),
            evicted_entries=outcome.evicted_entries)

    async def SetQuota(self, request, context):  # noqa: N802
        row = self._server(request.server_id)
        if any(c in request.salt for c in "@/\\\x00") or len(request.salt) > 128:
            raise InvalidArgument("salt", "at most 128 characters, without @ / \\ or NUL (LMCache's rule)")
        if request.quota_bytes > 2**50:
            raise InvalidArgument("quota_bytes", "implausibly large")
        admin = self._admin(row.url)
        try:
            await admin.set_quota(request.salt, request.quota_bytes)
        except LmcacheError as exc:
            raise Unavailable(str(exc)) from exc
        finally:
            await admin.aclose()
        return cache_manager_pb2.SetQuotaResponse()

    # ----- index ---------------------------------------------------------------------------------
    async def ReportAccesses(self, request_iterator, context):  # noqa: N802
        # Validate the whole stream first, then apply: a bad event leaves the index untouched.
        events = [ev async for ev in request_iterator]
        for i, ev in enumerate(events):
            field = f"events[{i}]"
            if not _POOL_RE.match(ev.pool):
                raise InvalidArgument(f"{field}.pool", "required: 1-128 of A-Z a-z 0-9 . _ -")
            if not ev.entry_key:
                raise InvalidArgument(f"{field}.entry_key", "required")
            if ev.kind == cache_manager_pb2.ACCESS_KIND_UNSPECIFIED:
                raise InvalidArgument(f"{field}.kind", "must be set")
            if ev.kind == cache_manager_pb2.ACCESS_KIND_STORE and (ev.tokens == 0 or ev.size_bytes == 0):
                raise InvalidArgument(f"{field}.tokens", "a store needs tokens > 0 and size_bytes > 0")
        for ev in events:
            now = ev.time.ToDatetime().timestamp() if ev.HasField("time") else _now_s()
            index = self._index(ev.pool)
            group = ev.conversation_id or ev.document_id
            if ev.kind == cache_manager_pb2.ACCESS_KIND_STORE:
                index.store(ev.entry_key, tokens=ev.tokens, size_bytes=ev.size_bytes, now_s=now, turn=ev.turn,
                            document_id=ev.document_id, group=index.group_id(group) if group else None)
            elif ev.kind == cache_manager_pb2.ACCESS_KIND_HIT:
                index.hit(ev.entry_key, hit_tokens=ev.hit_tokens or ev.tokens, now_s=now, turn=ev.turn,
                          document_id=ev.document_id)
            elif ev.kind == cache_manager_pb2.ACCESS_KIND_EVICT:
                index.remove(ev.entry_key)
            if ev.kind != cache_manager_pb2.ACCESS_KIND_EVICT:
                self.history.setdefault(ev.pool, deque(maxlen=HISTORY_PER_POOL)).append(
                    (now, hash(ev.entry_key), group))
        await asyncio.to_thread(self.save_indexes)
        return cache_manager_pb2.ReportAccessesResponse(accepted_events=len(events))

    async def ListEvictionCandidates(self, request, context):  # noqa: N802
        if request.limit > 10000:
            raise InvalidArgument("limit", "at most 10000")
        if request.pool not in self.indexes:
            raise NotFound(f"no index for pool {request.pool!r}")
        views = self.indexes[request.pool].lowest(request.limit or 100, _now_s())
        return cache_manager_pb2.ListEvictionCandidatesResponse(entries=[
            cache_manager_pb2.CacheEntryScore(entry_key=v.entry_key, lcs_score=v.score, size_bytes=v.size_bytes,
                                              hits=v.hits, age_s=v.age_s) for v in views])

    # ----- group TTLs ----------------------------------------------------------------------------
    async def ComputeGroupTtls(self, request, context):  # noqa: N802
        if not math.isfinite(request.window_s) or request.window_s < 0:
            raise InvalidArgument("window_s", "must be finite and >= 0")
        if request.top_k_groups > 1024:
            raise InvalidArgument("top_k_groups", "at most 1024")
        if request.budget_bytes == 0:
            raise InvalidArgument("budget_bytes", "must be > 0")
        if request.pool not in self.indexes:
            raise NotFound(f"no accesses known for pool {request.pool!r}")
        return await self._compute_ttls(request.pool, request.window_s or 3600.0, request.top_k_groups or 16,
                                        request.budget_bytes, request.dry_run)

    async def _compute_ttls(self, pool: str, window_s: float, top_k: int, budget_bytes: int, dry_run: bool):
        now = _now_s()
        index = self.indexes[pool]
        hist = [h for h in self.history.get(pool, ()) if h[0] >= now - window_s]
        # Budget in block-seconds: bytes / mean entry size, held over the window.
        mean_size = index.bytes_in_use / len(index) if len(index) else 1.0
        stats = group_ttl.group_stats(hist, top_k)
        sol = await asyncio.to_thread(group_ttl.solve, stats, budget_bytes / max(mean_size, 1.0) * window_s,
                                      max_ttl_s=window_s)
        groups = []
        for g, t in zip(sol.groups, sol.ttl_s):
            reuse = len(g.inter_arrivals_s)
            groups.append(cache_manager_pb2.GroupTtl(
                group_id=g.group_id or group_ttl.RESIDUAL, ttl_s=float(t),
                expected_hit_fraction=g.hits(float(t)) / g.accesses if g.accesses else 0.0,
                expected_bytes=int(g.cost(float(t)) / window_s * mean_size) if reuse or g.unique_blocks else 0))
        applied = False
        if not dry_run:
            self.ttls[pool] = sol.by_id()
            await self._apply_ttls(pool)
            applied = True
        return cache_manager_pb2.ComputeGroupTtlsResponse(groups=groups, applied=applied)

    async def _apply_ttls(self, pool: str) -> int:
        """Evict entries idle past their group's TTL (LMCache has no per-object TTL: we delete them by key).

        TTLs: per group (conversation / document id, Kareto top-K), the residual group's TTL for the
        others; a plan's pool-wide TTL ("*") when no group TTLs were computed. Returns entries evicted.
        """
        index = self.indexes.get(pool)
        ttls = self.ttls.get(pool)
        if index is None or not ttls:
            return 0
        default = ttls.get(group_ttl.RESIDUAL, ttls.get("*"))
        table = np.array([ttls.get(name, np.inf if default is None else default) for name in index.group_names],
                         dtype=np.float64)
        expired = index.expired(_now_s(), table, default)
        keys = [index.key_of(int(s)) for s in expired]
        if not keys:
            return 0
        for row in self._servers(pool):
            admin = self._admin(row.url)
            try:
                await admin.delete_objects(keys)
            except LmcacheError:
                pass  # a dead server keeps its entries; the index forgets them and LMCache's LRU ages them out
            finally:
                await admin.aclose()
        for k in keys:
            index.remove(k)
        return len(keys)

    async def ttl_round(self) -> int:
        """One scheduled TTL pass (`--ttl-recompute-s`): recompute every pool's group TTLs from the last
        hour of accesses with a budget of the bytes indexed now, and evict entries idle past them.
        Returns the entries evicted; a failing pool is skipped (recorded in `last_ttl_error`) and retried
        next round."""
        evicted = 0
        async with self._lock:
            for pool in list(self.indexes):
                index = self.indexes[pool]
                if not len(index):
                    continue
                try:
                    before = len(index)
                    await self._compute_ttls(pool, TTL_WINDOW_S, 16, max(index.bytes_in_use, 1), False)
                    evicted += before - len(index)
                except Exception as exc:  # noqa: BLE001 - keep the schedule alive; next round retries
                    self.last_ttl_error = f"{pool}: {type(exc).__name__}: {exc}"
            self.ttl_rounds += 1
        if evicted:
            await asyncio.to_thread(self.save_indexes)
        return evicted

    # ----- read or recompute ---------------------------------------------------------------------
    async def DecideReadOrRecompute(self, request, context):  # noqa: N802
        if not math.isfinite(request.delay_budget_s) or request.delay_budget_s < 0:
            raise InvalidArgument("delay_budget_s", "must be finite and >= 0")
        if not math.isfinite(request.queue_wait_s) or request.queue_wait_s < 0:
            raise InvalidArgument("queue_wait_s", "must be finite and >= 0")
        n = len(request.chunks)
        arrays = np.zeros((4, n))
        for i, c in enumerate(request.chunks):
            for j, name in enumerate(("read_s", "read_energy_j", "recompute_s", "recompute_energy_j")):
                v = getattr(c, name)
                if not math.isfinite(v) or v < 0:
                    raise InvalidArgument(f"chunks[{i}].{name}", "must be finite and >= 0")
                arrays[j, i] = v
            if c.tier == common_pb2.CACHE_TIER_UNSPECIFIED:
                raise InvalidArgument(f"chunks[{i}].tier", "must be set")
        d = read_or_recompute.decide(*arrays, delay_budget_s=request.delay_budget_s,
                                     queue_wait_s=request.queue_wait_s)
        actions = [cache_manager_pb2.CHUNK_ACTION_READ if a == read_or_recompute.READ
                   else cache_manager_pb2.CHUNK_ACTION_RECOMPUTE for a in d.actions]
        return cache_manager_pb2.DecideReadOrRecomputeResponse(actions=actions, energy_j=d.energy_j, time_s=d.time_s)


def build(ctx: ServiceContext) -> list[Registration]:
    servicer = CacheManagerServicer(ctx)
    follow_plans(ctx, servicer)  # stops first (its on_stop hook precedes the index save below)
    settings: CacheManagerSettings = ctx.settings  # type: ignore[assignment]
    task: asyncio.Task | None = None
    if settings.ttl_recompute_s > 0:
        async def loop() -> None:
            while True:
                await asyncio.sleep(settings.ttl_recompute_s)
                await servicer.ttl_round()
        task = asyncio.get_event_loop().create_task(loop())

    async def stop() -> None:
        await cancel_and_wait(task)  # no TTL round runs while the index is saved
        await asyncio.to_thread(servicer.save_indexes)

    ctx.on_stop.append(stop)
    return [registration(cache_manager_pb2, cache_manager_pb2_grpc, "CacheManagerService", servicer)]
