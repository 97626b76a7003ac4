"""Settings of greenserve-cache-manager: its flags and GREENSERVE_* environment variables."""

from __future__ import annotations

import socket
from typing import ClassVar, Literal

from pydantic import Field

from greenserve.cache_manager import access_history, adaptive, journal
from greenserve.common.config import DependencyAddresses, ServiceSettings


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
                                   "past it a store makes the index forget its first entries in the eviction "
                                   "order (about 119 bytes of memory per entry)")
    eviction_policy: Literal["adaptive", "lcs", "lru"] = Field(
        "adaptive", description="order in which the cache-manager evicts a pool's entries (resize shrinks, the index "
        "cap, ListEvictionCandidates): adaptive (LRU or LCS, whichever two shadow caches of the pool's size show "
        "winning on the live accesses; LRU until LCS proves itself), lcs (GreenCache's score, the previous "
        "default) or lru")
    policy_shadow_max_entries: int = Field(adaptive.SHADOW_MAX_ENTRIES, ge=16, le=10_000_000, description="keys per "
                                           "shadow cache and pool of the adaptive policy (about 800 bytes each, both "
                                           "shadows together); past it the access stream is hash-sampled (SHARDS)")
    policy_capacity_bytes: int = Field(0, ge=0, le=2**50, description="size the adaptive policy's shadow caches "
                                       "simulate per pool, bytes; 0: the pool's LMCache L1 sizes as last read or "
                                       "applied (unknown: no shadows, LRU order)")
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
    lmcache_max_dram_bytes: int = Field(0, ge=0, le=2**50, description="largest L1 size a plan, ApplyCachePlan or "
                                        "ResizeCache may give one LMCache server, bytes (larger: refused); 0: this "
                                        "host's memory for servers on this host, else no limit")
