"""CacheManagerService wiring: settings, servicer and the build function the process entry point runs.

State: registered servers and per-(server, plan version) outcomes in the database (models.py); the cache
index per pool in memory, fed by access events that are journaled in the database before they are
acknowledged (journal.py) and checkpointed to `<data_dir>/cache_index/<pool>.npz` every
`--snapshot-interval-s` and on stop (snapshots.py). At start each pool's checkpoint is loaded (an unreadable
one is moved aside with a warning, and the previous checkpoint or the journal alone rebuilds the pool) and
the journal after it is replayed: the index holds exactly the acknowledged events, even after a SIGKILL.
Every change of the index happens under one lock, snapshots included.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import ClassVar

import numpy as np
from pydantic import Field
from sqlalchemy import select

from greenserve.cache_manager import access_history, group_ttl, journal, read_or_recompute, shrink_order
from greenserve.cache_manager.disk_tier import DiskOutcome, resize_disk
from greenserve.cache_manager.enforcer import follow_plans, on_this_host
from greenserve.cache_manager.index import CacheIndex
from greenserve.cache_manager.lmcache_admin import LmcacheAdmin, LmcacheError, check_admin_url
from greenserve.cache_manager.models import CacheApplication, LmcacheServer
from greenserve.cache_manager.resize import resize_server
from greenserve.cache_manager.snapshots import SnapshotStore
from greenserve.common.tasks import cancel_and_wait
from greenserve.common.app import ServiceContext
from greenserve.common.config import DependencyAddresses, ServiceSettings
from greenserve.common.carbon import DISK_MEDIA
from greenserve.common.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable
from greenserve.common.names import check_name
from greenserve.common.orm_conventions import utcnow
from greenserve.common.server import Registration, registration
from greenserve.v1 import cache_manager_pb2, cache_manager_pb2_grpc, common_pb2

log = logging.getLogger("greenserve.cache_manager")
TTL_WINDOW_S = 3600.0  # accesses a scheduled TTL recompute looks at (Kareto recomputes from a recent window)
SERVER_ID_MAX_CHARS = 64  # the lmcache_servers.id column
MAX_BYTES = 1 << 50  # sizes above 1 PiB are refused (a negative size arrives as a huge uint64)
MAX_TTL_S = 30 * 86400.0  # TTLs and TTL windows: at most 30 days
MAX_CHUNKS = 65_536  # chunks of one read-or-recompute question (a 16M-token prompt in 256-token chunks)
MAX_CHUNK_S = 3600.0  # read / recompute time of one chunk, and delay budget / queue wait, seconds
MAX_CHUNK_ENERGY_J = 1e7  # read / recompute energy of one chunk, joules
MAX_BUDGET_BYTES = 1 << 53  # TTL storage budget (exact as a double)
_TIERS = frozenset(common_pb2.CacheTier.values()) - {common_pb2.CACHE_TIER_UNSPECIFIED}


def _in_range(field: str, value: float, low: float, high: float, unit: str = "") -> float:
    """`value` when finite and in [low, high]; else InvalidArgument naming `field` and the range."""
    if not (math.isfinite(value) and low <= value <= high):
        raise InvalidArgument(field, f"must be a finite number in [{low:g}, {high:g}]{unit}, got {value!r}")
    return value


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
    snapshot_interval_s: float = Field(60.0, gt=0, le=86400, description="checkpoint the cache index of every "
                                       "changed pool this often (and on stop); the access journal in the "
                                       "database keeps every acknowledged event in between")
    snapshot_every_events: int = Field(200_000, ge=1, description="also checkpoint once this many events were "
                                       "journaled since the last checkpoint (bounds the journal and the replay "
                                       "at start)")
    index_max_entries: int = Field(2_000_000, ge=1, le=100_000_000, description="entries kept per pool's index; "
                                   "past it a store makes the index forget its lowest-LCS entries (about 119 "
                                   "bytes of memory per entry)")
    index_max_pools: int = Field(256, ge=1, le=65_536, description="pools with an index; accesses of a new pool "
                                 "past it are refused with RESOURCE_EXHAUSTED")
    ttl_history_per_pool: int = Field(journal.HISTORY_PER_POOL, ge=1, le=10_000_000, description="recent "
                                      "accesses per pool kept for group TTLs (about 200 bytes each)")
    access_history_per_hour: int = Field(access_history.PER_HOUR, ge=1, le=1_000_000, description="accesses "
                                         "recorded per pool and UTC hour for the planner's replay "
                                         "(GetAccessWindow): the hour's first ones")
    access_history_days: float = Field(access_history.DAYS, gt=0, le=400, description="days of recorded "
                                       "accesses kept for the planner's replay (older hours are deleted at "
                                       "checkpoints)")
    follow_plans: bool = Field(True, description="follow the optimizer's plans (WatchPlans at --optimizer-addr) and "
                               "apply their cache targets; off: only the RPCs change cache sizes")
    instance: str = Field(default_factory=socket.gethostname, min_length=1, max_length=253,
                          description="name of this cache-manager in enforcement reports (default: the host name)")
    lmcache_max_dram_bytes: int = Field(0, ge=0, le=2**50, description="largest L1 size a plan may give one LMCache "
                                        "server, bytes (larger: refused); 0: this host's memory for servers on "
                                        "this host, else no limit")


def _now_s() -> float:
    return time.time()


async def _run_to_end(coro):
    """Await `coro` as a task that a cancelled caller (client gone, deadline, shutdown) does not stop midway:
    a journal write is applied to the index once committed, a checkpoint finishes its files."""
    task = asyncio.ensure_future(coro)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved even when nobody awaits
    return await asyncio.shield(task)


class CacheManagerServicer(cache_manager_pb2_grpc.CacheManagerServiceServicer):
    """greenserve.v1.CacheManagerService."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.settings: CacheManagerSettings = ctx.settings  # type: ignore[assignment]
        self.index_dir = Path(self.settings.data_dir) / "cache_index"
        self.snapshots = SnapshotStore(self.index_dir)
        self.indexes: dict[str, CacheIndex] = {}
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
        self.access_history = access_history.AccessHistory(ctx.db, self.settings.access_history_per_hour,
                                                           self.settings.access_history_days)
        self._load_indexes()

    # ----- index persistence ---------------------------------------------------------------------
    def _load_indexes(self) -> None:
        """Each pool's checkpoint, then the journal after it (see the module doc)."""
        rebuilt: list[str] = []
        for pool in self.snapshots.pools():
            index, cur, prev = self.snapshots.load(pool)
            if index is None:
                rebuilt.append(pool)
                continue
            self.indexes[pool] = index
            self._cur_id[pool], self._prev_id[pool] = cur, prev
        # The whole journal kept (pruning bounds it): a pool without any checkpoint (new since the last round,
        # or rebuilt) may have events older than another pool's checkpoint.
        replayed = 0
        for event_id, ev in journal.replay(self.ctx.db, 0):
            index = self.indexes.get(ev.pool)
            if index is not None and event_id <= index.journal_id:
                continue
            self._apply(event_id, ev)
            replayed += 1
        self.last_event_id = max(journal.last_id(self.ctx.db), max(
            (ix.journal_id for ix in self.indexes.values()), default=0))
        self._events_since_checkpoint = replayed
        for pool in rebuilt:
            log.warning("cache index of pool %r rebuilt from the access journal alone (no readable checkpoint): "
                        "%d entries", pool, len(self.indexes[pool]) if pool in self.indexes else 0)
        if replayed:
            log.info("cache index: %d journaled events replayed over the checkpoints", replayed)

    def _apply(self, event_id: int, ev: journal.Event) -> None:
        index = self.indexes.get(ev.pool)
        if index is None:
            index = self.indexes[ev.pool] = CacheIndex()
        history = self.history.get(ev.pool)
        if history is None:
            history = self.history[ev.pool] = journal.new_history(self.settings.ttl_history_per_pool)
        journal.apply(index, event_id, ev, history, self.settings.index_max_entries)

    async def _journal_and_apply(self, events: list[journal.Event]) -> None:
        """Write events to the journal (one transaction), then apply them; the caller holds the lock."""
        ids = await asyncio.to_thread(journal.append, self.ctx.db, events)
        for event_id, ev in zip(ids, events):
            self._apply(event_id, ev)
        if ids:
            self.last_event_id = ids[-1]
        self._events_since_checkpoint += len(ids)

    async def _journal_evictions(self, pool: str, keys: list[str] | tuple[str, ...]) -> None:
        """Record entries this service dropped from a pool's index (resize, TTL expiry); caller holds the lock."""
        if keys:
            now = _now_s()
            await self._journal_and_apply([journal.Event(pool, k, cache_manager_pb2.ACCESS_KIND_EVICT, time_s=now)
                                           for k in keys])

    async def checkpoint(self) -> int:
        """Snapshot every pool changed since its last checkpoint, then prune the journal up to what every
        pool's previous checkpoint includes (so an unreadable current checkpoint can still be rebuilt from
        the previous one plus the journal). Returns the pools written. Runs under the lock, to its end even
        when the caller is cancelled."""
        return await _run_to_end(self._checkpoint())

    async def _checkpoint(self) -> int:
        # One pool at a time under the lock (writers wait for one pool's file at most: about 0.5 s per
        # million entries), then the prune floor from every pool's state, under the lock again.
        written = 0
        self._events_since_checkpoint = 0
        for pool in list(self.indexes):
            async with self._lock:
                index = self.indexes[pool]
                cur = self._cur_id.get(pool)
                if cur is None or index.journal_id > cur:
                    await asyncio.to_thread(self.snapshots.save, pool, index)
                    if cur is not None:  # only once written: a failed save leaves the ids on the safe side
                        self._prev_id[pool] = cur
                    self._cur_id[pool] = index.journal_id
                    written += 1
                elif self._prev_id.get(pool) != cur:
                    await asyncio.to_thread(self.snapshots.copy_current_to_previous, pool)
                    self._prev_id[pool] = cur
        async with self._lock:
            floor = self.last_event_id
            for pool, index in self.indexes.items():
                prev, cur = self._prev_id.get(pool), self._cur_id.get(pool)
                if not (prev == cur == index.journal_id):  # else both files hold every event of the pool
                    floor = min(floor, prev or 0)
            self.checkpoints += 1
            await asyncio.to_thread(journal.prune, self.ctx.db, floor)
            await asyncio.to_thread(self.access_history.prune, _now_s())
        return written

    def _maybe_checkpoint(self) -> None:
        if (self._events_since_checkpoint >= self.settings.snapshot_every_events
                and (self._checkpoint_task is None or self._checkpoint_task.done())):
            self._checkpoint_task = asyncio.get_running_loop().create_task(self.checkpoint())

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
        return cache_manager_pb2.CacheServer(id=row.id, pool=row.pool, url=row.url, dram_bytes=dram,
                                             disk_bytes=disk, dram_used_bytes=used, reachable=reachable,
                                             applied_plan_version=self._last_plan(row.id))

    # ----- servers -------------------------------------------------------------------------------
    async def RegisterCacheServer(self, request, context):  # noqa: N802
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

    async def DeregisterCacheServer(self, request, context):  # noqa: N802
        row = self._server(request.server_id)
        with self.ctx.db.session() as s:
            s.delete(s.get(LmcacheServer, row.id))
            s.commit()
        return cache_manager_pb2.DeregisterCacheServerResponse()

    async def ListCacheServers(self, request, context):  # noqa: N802
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
                    results.append(await self._apply_one(row, request.plan_version, t.dram_bytes, t.ttl_s,
                                                         t.disk_bytes, t.disk_medium, t.disk_path))
        return cache_manager_pb2.ApplyCachePlanResponse(results=results)

    @staticmethod
    def _check_targets(targets, known_pools: set[str], field: str = "targets") -> None:
        """InvalidArgument naming the first bad target (ApplyCachePlan and the plan follower, enforcer.py)."""
        seen: set[str] = set()
        for i, t in enumerate(targets):
            check_name(f"{field}[{i}].pool", t.pool)
            if t.pool not in known_pools:
                raise InvalidArgument(f"{field}[{i}].pool", f"unknown pool {t.pool!r} (no registered server)")
            if t.pool in seen:
                raise InvalidArgument(f"{field}[{i}].pool", f"pool {t.pool!r} appears twice")
            seen.add(t.pool)
            _in_range(f"{field}[{i}].ttl_s", t.ttl_s, 0.0, MAX_TTL_S, " s")
            if t.disk_medium and t.disk_medium not in DISK_MEDIA:
                raise InvalidArgument(f"{field}[{i}].disk_medium", f"unknown disk medium {t.disk_medium!r}; known: "
                                      f"{', '.join(DISK_MEDIA)}")
            if t.disk_path and (not t.disk_medium or not t.disk_path.startswith("/") or len(t.disk_path) > 1024
                                or any(c in t.disk_path for c in "\x00\n\r")):
                raise InvalidArgument(f"{field}[{i}].disk_path", "must be the absolute folder (at most 1024 "
                                      "characters) of the disk_medium's L2 adapter, and only with a disk_medium")
            for name in ("dram_bytes", "disk_bytes"):
                if getattr(t, name) > MAX_BYTES:
                    raise InvalidArgument(f"{field}[{i}].{name}", "must be 0-2^50 bytes (a negative size arrives "
                                          "as a huge uint64)")

    async def _apply_one(self, row: LmcacheServer, version: int, dram: int, ttl_s: float, disk: int = 0,
                         disk_medium: str = "", disk_path: str = ""):
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
        return cache_manager_pb2.CacheApplyResult(server_id=row.id, applied=outcome.applied, detail=detail,
                                                  dram_bytes=outcome.dram_bytes, disk_bytes=disk_in_force)

    async def _resize(self, row: LmcacheServer, dram: int):
        """Resize one server (the caller holds the lock); entries it evicts are journaled."""
        admin = self._admin(row.url)
        try:
            outcome = await resize_server(admin, row.id, self.indexes.get(row.pool), dram, _now_s(),
                                          self.settings.lmcache_restart_command)
        finally:
            await admin.aclose()
        await self._journal_evictions(row.pool, outcome.evicted_keys)
        return outcome

    def _shrink_order(self, pool: str) -> Callable[[int], Awaitable[shrink_order.Leader]]:
        """The adaptive policy's order for a shrink of `pool` to a target size (shrink_order.py)."""

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

    async def ResizeCache(self, request, context):  # noqa: N802
        row = self._server(request.server_id)
        if request.dram_bytes > MAX_BYTES:
            raise InvalidArgument("dram_bytes", "must be 0-2^50 bytes (a negative size arrives as a huge uint64)")
        if request.HasField("disk_bytes") and request.disk_bytes > MAX_BYTES:
            raise InvalidArgument("disk_bytes", "must be 0-2^50 bytes (a negative size arrives as a huge uint64)")
        async with self._lock:
            outcome = await self._resize(row, request.dram_bytes)
            applied, detail, evicted = outcome.applied, outcome.detail, outcome.evicted_entries
            disk = 0
            if request.HasField("disk_bytes") and outcome.applied:
                disk_outcome = await self._resize_disk(row, request.disk_bytes)
                applied, disk = disk_outcome.applied, disk_outcome.disk_bytes
                detail += f"; {disk_outcome.detail}" if disk_outcome.detail else ""
                evicted += disk_outcome.evicted_entries
        return cache_manager_pb2.ResizeCacheResponse(
            result=cache_manager_pb2.CacheApplyResult(server_id=row.id, applied=applied, detail=detail,
                                                      dram_bytes=outcome.dram_bytes, disk_bytes=disk),
            evicted_entries=evicted)

    async def SetQuota(self, request, context):  # noqa: N802
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
    async def ReportAccesses(self, request_iterator, context):  # noqa: N802
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

    async def GetAccessWindow(self, request, context):  # noqa: N802
        query = access_history.check_request(request)
        return await asyncio.to_thread(self.access_history.window, query)

    async def ListEvictionCandidates(self, request, context):  # noqa: N802
        check_name("pool", request.pool)
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
        check_name("pool", request.pool)
        if request.window_s != 0:
            _in_range("window_s", request.window_s, 1.0, MAX_TTL_S, " s (0 means 3600)")
        if request.top_k_groups > 1024:
            raise InvalidArgument("top_k_groups", "must be 0-1024 (0 means 16)")
        if not 1 <= request.budget_bytes <= MAX_BUDGET_BYTES:
            raise InvalidArgument("budget_bytes", f"must be 1-2^53 bytes, got {request.budget_bytes}")
        if request.pool not in self.indexes:
            raise NotFound(f"no accesses known for pool {request.pool!r}")
        args = (request.pool, request.window_s or 3600.0, request.top_k_groups or 16, request.budget_bytes,
                request.dry_run)
        if request.dry_run:  # reads only (before its one await): writers need not wait for the solver
            return await self._compute_ttls(*args)
        async with self._lock:  # applying evicts entries and journals them
            return await self._compute_ttls(*args)

    async def _compute_ttls(self, pool: str, window_s: float, top_k: int, budget_bytes: int, dry_run: bool):
        now = _now_s()
        index = self.indexes[pool]
        # In time order: events of several reporters arrive interleaved (out-of-order times made negative
        # inter-arrival gaps, hit fractions above 1 and negative costs).
        hist = sorted((h for h in self.history.get(pool, ()) if now - window_s <= h[0]), key=lambda h: h[0])
        # Budget in block-seconds: bytes / mean entry size, held over the window.
        mean_size = index.bytes_in_use / len(index) if len(index) else 1.0
        stats = group_ttl.group_stats(hist, top_k)
        sol = await asyncio.to_thread(group_ttl.solve, stats, budget_bytes / max(mean_size, 1.0) * window_s,
                                      max_ttl_s=window_s)
        groups = []
        for g, t in zip(sol.groups, sol.ttl_s):
            ttl = min(max(float(t), 0.0), window_s) if math.isfinite(t) else 0.0
            reuse = len(g.inter_arrivals_s)
            held = g.cost(ttl) / window_s * mean_size if reuse or g.unique_blocks else 0.0
            groups.append(cache_manager_pb2.GroupTtl(
                group_id=g.group_id or group_ttl.RESIDUAL, ttl_s=ttl,
                expected_hit_fraction=min(max(g.hits(ttl) / g.accesses, 0.0), 1.0) if g.accesses else 0.0,
                expected_bytes=int(min(max(held, 0.0), float(MAX_BUDGET_BYTES))) if math.isfinite(held) else 0))
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
        await self._journal_evictions(pool, keys)
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
        return evicted

    # ----- read or recompute ---------------------------------------------------------------------
    async def DecideReadOrRecompute(self, request, context):  # noqa: N802
        _in_range("delay_budget_s", request.delay_budget_s, 0.0, MAX_CHUNK_S, " s")
        _in_range("queue_wait_s", request.queue_wait_s, 0.0, MAX_CHUNK_S, " s")
        n = len(request.chunks)
        if n > MAX_CHUNKS:
            raise InvalidArgument("chunks", f"at most {MAX_CHUNKS} chunks, got {n}")
        arrays = np.zeros((4, n))
        limits = (MAX_CHUNK_S, MAX_CHUNK_ENERGY_J, MAX_CHUNK_S, MAX_CHUNK_ENERGY_J)
        for i, c in enumerate(request.chunks):
            for j, name in enumerate(("read_s", "read_energy_j", "recompute_s", "recompute_energy_j")):
                arrays[j, i] = _in_range(f"chunks[{i}].{name}", getattr(c, name), 0.0, limits[j],
                                         " s" if name.endswith("_s") else " J")
            if c.tier not in _TIERS:
                raise InvalidArgument(f"chunks[{i}].tier", "must be set to a known cache tier")
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
        await cancel_and_wait(task, checkpoint_task, servicer._checkpoint_task)  # nothing else changes the index
        await servicer.checkpoint()

    ctx.on_stop.append(stop)
    return [registration(cache_manager_pb2, cache_manager_pb2_grpc, "CacheManagerService", servicer)]
