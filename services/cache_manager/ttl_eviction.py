"""Group TTLs in force: ComputeGroupTtls, the scheduled TTL round (`--ttl-recompute-s`) and the eviction of
entries idle past their group's TTL (group_ttl.py solves for the TTLs).

``GroupTtlEviction`` is a part of ``CacheManagerServicer`` (service.py), which sets the attributes it declares
and provides ``_servers`` and ``_admin``.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING

import grpc
import numpy as np

from greenserve.cache_manager import group_ttl
from greenserve.cache_manager.index_state import JournaledIndexes, _now_s
from greenserve.cache_manager.lmcache_admin import LmcacheAdmin, LmcacheError
from greenserve.cache_manager.models import LmcacheServer
from greenserve.cache_manager.request_checks import MAX_BUDGET_BYTES, MAX_TTL_S, in_range
from greenserve.common.errors import InvalidArgument, NotFound
from greenserve.common.names import check_name
from greenserve.v1 import cache_manager_pb2

TTL_WINDOW_S = 3600.0  # accesses a scheduled TTL recompute looks at (Kareto recomputes from a recent window)


class GroupTtlEviction(JournaledIndexes):
    """ComputeGroupTtls of greenserve.v1.CacheManagerService and the scheduled TTL round."""

    ttls: dict[str, dict[str, float]]
    ttl_rounds: int
    last_ttl_error: str

    if TYPE_CHECKING:  # CacheManagerServicer's (service.py)
        def _admin(self, url: str) -> LmcacheAdmin: ...
        def _servers(self, pool: str | None = None) -> list[LmcacheServer]: ...

    async def ComputeGroupTtls(self, request: cache_manager_pb2.ComputeGroupTtlsRequest,
                               context: grpc.aio.ServicerContext) -> cache_manager_pb2.ComputeGroupTtlsResponse:
        check_name("pool", request.pool)
        if request.window_s != 0:
            in_range("window_s", request.window_s, 1.0, MAX_TTL_S, " s (0 means 3600)")
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

    async def _compute_ttls(self, pool: str, window_s: float, top_k: int, budget_bytes: int,
                            dry_run: bool) -> cache_manager_pb2.ComputeGroupTtlsResponse:
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
