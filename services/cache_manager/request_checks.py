"""Limits of the cache-manager's requests and the checks that name the first bad field (InvalidArgument).

Shared by the servicer's RPCs and the plan follower (enforcer.py), which checks a plan's cache targets the
way ApplyCachePlan does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from greenserve.common.carbon_params import DISK_MEDIA
from greenserve.common.errors import InvalidArgument
from greenserve.common.names import check_name
from greenserve.v1 import common_pb2

SERVER_ID_MAX_CHARS = 64  # the lmcache_servers.id column
MAX_BYTES = 1 << 50  # sizes above 1 PiB are refused (a negative size arrives as a huge uint64)
MAX_TTL_S = 30 * 86400.0  # TTLs and TTL windows: at most 30 days
MAX_CHUNKS = 65_536  # chunks of one read-or-recompute question (a 16M-token prompt in 256-token chunks)
MAX_CHUNK_S = 3600.0  # read / recompute time of one chunk, and delay budget / queue wait, seconds
MAX_CHUNK_ENERGY_J = 1e7  # read / recompute energy of one chunk, joules
MAX_BUDGET_BYTES = 1 << 53  # TTL storage budget (exact as a double)
CACHE_TIERS = frozenset(common_pb2.CacheTier.values()) - {common_pb2.CACHE_TIER_UNSPECIFIED}


def in_range(field: str, value: float, low: float, high: float, unit: str = "") -> float:
    """`value` when finite and in [low, high]; else InvalidArgument naming `field` and the range."""
    if not (math.isfinite(value) and low <= value <= high):
        raise InvalidArgument(field, f"must be a finite number in [{low:g}, {high:g}]{unit}, got {value!r}")
    return value


def check_targets(targets: Iterable[common_pb2.CacheTarget], known_pools: set[str], field: str = "targets") -> None:
    """InvalidArgument naming the first bad target (ApplyCachePlan and the plan follower, enforcer.py)."""
    seen: set[str] = set()
    for i, t in enumerate(targets):
        check_name(f"{field}[{i}].pool", t.pool)
        if t.pool not in known_pools:
            raise InvalidArgument(f"{field}[{i}].pool", f"unknown pool {t.pool!r} (no registered server)")
        if t.pool in seen:
            raise InvalidArgument(f"{field}[{i}].pool", f"pool {t.pool!r} appears twice")
        seen.add(t.pool)
        in_range(f"{field}[{i}].ttl_s", t.ttl_s, 0.0, MAX_TTL_S, " s")
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
