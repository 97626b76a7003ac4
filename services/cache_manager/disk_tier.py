"""Sizing one LMCache server's disk (L2) tier at run time, without a restart.

What LMCache 0.5.6 offers, read from its source (`lmcache/v1/distributed/...`):

- The L2 capacity of an adapter evicting by aggregate usage (`"eviction": {"eviction_policy": "LRU"}`) is
  `max_capacity_bytes`, fixed when the adapter is built (`L2AdapterInterface.__init__`, base.py); the fs
  adapter (`fs_l2_adapter.py`) does not even declare one, so its usage fraction is -1 and aggregate LRU
  never triggers (`L2EvictionController._check_and_evict_global`).
- Run-time L2 reconfiguration (`POST /reconfigure/{backend}/l2/{operation}`, reconfigure_api.py) is only
  implemented by the Device-DAX adapter (`dax_l2_adapter.py`, the only `L2ReconfigurableAdapter`); it needs a
  `/dev/dax` device. Adding or removing whole adapters is not a size change.
- Per-salt quotas (`PUT /quota/{salt}`, `QuotaManager`) are read by the L2 eviction controller on every
  cycle (1 s) for adapters evicting by `IsolatedLRU`: a salt at or above `trigger_watermark x quota` loses
  `eviction_ratio` of its least recently used keys, each cycle, until it is below. "Any change takes effect
  on the very next eviction cycle (no restart needed)" (quota_manager.py).

So the disk tier is sized by the quota of the pool's salt ("" by default, `_default` in the path) on a
server started with an L2 adapter evicting by IsolatedLRU, e.g.
`--l2-adapter '{"type":"fs","base_path":"/var/cache/lmcache","eviction":{"eviction_policy":"IsolatedLRU",
"trigger_watermark":1.0,"eviction_ratio":0.1}}'`. IsolatedLRU is an allow-list: a salt without a quota
loses all its L2 data, so a disk target of 0 removes the quota and empties the salt's disk tier.

A shrink first deletes the pool's entries in the adaptive policy's order (`shrink_order.py`: lowest LCS first
while LCS leads, least recently used first while LRU does; lowest LCS when no order is given) (`DELETE /cache/objects`, both tiers: the index does not
know which tier holds an entry, and LMCache's store controller writes every L1 object through to L2) until
the salt's L2 usage fits the target, then lowers the quota; LMCache's own LRU trims whatever the index did
not know about at its next cycle. A grow only raises the quota. A server without an L2 adapter, or whose L2
adapters do not enforce quotas, cannot take a disk size: the previous state stays and the outcome says why.

A target naming a disk medium (``CacheTarget.disk_medium``, chosen by the planner among the pool's declared
``disk_tiers``) is applied only on a server with an L2 fs adapter in that medium's folder (``disk_path``): LMCache
cannot move an adapter to another disk at run time, so a server without one keeps its disk tier as it is and the
outcome says why. The quota is the salt's over the server's L2 adapters (LMCache 0.5.6 has no per-adapter quota),
so a server that should hold its L2 on one medium runs one fs adapter, on that disk.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from greenserve.common.cache_index.index import CacheIndex
from greenserve.cache_manager.lmcache_admin import (
    DiskTierState,
    LmcacheAdmin,
    LmcacheError,
)
from greenserve.cache_manager.resize import victims_to_fit
from greenserve.cache_manager.shrink_order import Leader, lru_victims_to_fit

# How long an apply waits for LMCache's eviction controller (one pass per second) to bring the usage under
# a lowered quota before it reports the usage it sees.
SETTLE_S = 5.0


@dataclass(frozen=True)
class DiskOutcome:
    """Result of one disk-tier resize."""

    applied: bool
    detail: str
    disk_bytes: int  # the quota in force after the call (0: none)
    evicted_entries: int = 0
    evicted_keys: tuple[str, ...] = ()  # entries dropped from the index (the caller journals them)
    used_bytes: int = 0  # the salt's L2 bytes after the call


NO_L2_ADAPTER = "the server has no L2 adapter (started without --l2-adapter), so it has no disk tier to size"


def why_not_sizable(state: DiskTierState) -> str:
    """Empty when LMCache can size this server's disk tier at run time, else the reason."""
    if state.adapters == 0:
        return NO_L2_ADAPTER
    if not state.quota_enforced:
        policies = ", ".join(p or "none" for p in state.eviction_policies) or "none"
        return (f"its L2 adapters evict by {policies}: LMCache 0.5.6 fixes an aggregate-LRU adapter's capacity "
                "when the adapter is built (max_capacity_bytes; the fs adapter has none) and reconfigures only "
                "Device-DAX adapters at run time; a run-time disk size needs an L2 adapter with "
                "\"eviction\": {\"eviction_policy\": \"IsolatedLRU\"}, whose per-salt quotas apply each second")
    return ""


def why_not_on_medium(state: DiskTierState, medium: str, path: str) -> str:
    """Empty when the target names no medium or the server has an L2 fs adapter in the medium's folder, else why."""
    if not medium:
        return ""
    folders = {os.path.normpath(p) for p in state.base_paths}
    if path and os.path.normpath(path) in folders:
        return ""
    return (f"it has no disk tier on {medium}: no L2 fs adapter in {path or '(no folder named)'} (its L2 adapter "
            f"folders: {', '.join(state.base_paths) or 'none'}); LMCache 0.5.6 cannot move an L2 adapter to another "
            "disk at run time")


def disk_capacity_bytes(state: DiskTierState) -> int | None:
    """Size of the file system under the server's fs adapter folders (None when unknown or not on this host)."""
    sizes = []
    for path in state.base_paths:
        try:
            sizes.append(shutil.disk_usage(path).total)
        except OSError:
            return None
    return min(sizes) if sizes else None


async def resize_disk(admin: LmcacheAdmin, index: CacheIndex | None, target_bytes: int, now_s: float, *,
                      salt: str = "", local: bool = False, settle_s: float = SETTLE_S,
                      choose_order: Callable[[int], Awaitable[Leader]] | None = None, disk_medium: str = "",
                      disk_path: str = "") -> DiskOutcome:
    """Apply target_bytes as the disk (L2) size of `salt` on one server; on failure nothing changes.

    ``choose_order(target_bytes)``, when given, says which entries a shrink deletes first (the adaptive
    policy's leader, ``shrink_order``); without it, lowest LCS first. ``disk_medium`` / ``disk_path``: the target's
    medium and its folder; a server without an L2 adapter there keeps its disk tier (``why_not_on_medium``)."""
    try:
        state = await admin.disk_state(salt)
    except LmcacheError as exc:
        return DiskOutcome(False, f"cannot read the server's L2 state: {exc}", 0)
    current = state.quota_bytes or 0
    reason = why_not_sizable(state)
    if reason:
        if target_bytes == 0 and state.adapters == 0:
            return DiskOutcome(True, "", 0)  # no disk tier, and none asked for: nothing to say
        return DiskOutcome(False, f"disk target not applied: {reason}; nothing changed", current,
                           used_bytes=state.used_bytes)
    medium_reason = why_not_on_medium(state, disk_medium, disk_path)
    if medium_reason:
        return DiskOutcome(False, f"disk target on {disk_medium} not applied: {medium_reason}; the disk tier in force "
                           f"({current} bytes) stays", current, used_bytes=state.used_bytes)
    if local:
        capacity = disk_capacity_bytes(state)
        if capacity is not None and target_bytes > capacity:
            return DiskOutcome(False, f"disk target {target_bytes} bytes is more than the file system under "
                               f"{', '.join(state.base_paths)} holds ({capacity} bytes); nothing changed", current,
                               used_bytes=state.used_bytes)
    if state.quota_bytes == target_bytes or (state.quota_bytes is None and target_bytes == 0):
        return DiskOutcome(True, "disk size already in force", current, used_bytes=state.used_bytes)
    evicted: tuple[str, ...] = ()
    deleted = 0
    leader: Leader | None = None
    if state.used_bytes > target_bytes and index is not None and len(index):
        # The adaptive order's (or lowest-LCS) entries first, until the index's bytes have shed the L2 excess.
        # Strictly under the target: IsolatedLRU evicts a salt at or above watermark x quota (watermark <= 1).
        leader = await choose_order(target_bytes) if choose_order is not None else None
        fit = max(0, index.bytes_in_use - (state.used_bytes - target_bytes) - 1)
        if leader is not None and leader.policy == "LRU":
            keys = lru_victims_to_fit(index, fit)
            what = "least recently used"
        else:
            keys = victims_to_fit(index, fit, now_s, order="lcs")
            what = "lowest-LCS"
        if keys:
            try:
                deleted, _ = await admin.delete_objects(keys, tier="all")
            except LmcacheError as exc:
                return DiskOutcome(False, f"evicting {len(keys)} {what} entries failed: {exc}; previous disk "
                                   f"size {current} bytes stays in force", current, used_bytes=state.used_bytes)
            for k in keys:
                index.remove(k)
            evicted = tuple(keys)
    try:
        await admin.set_quota(salt, target_bytes)
    except LmcacheError as exc:
        return DiskOutcome(False, f"setting the L2 quota failed: {exc}; previous disk size {current} bytes stays "
                           "in force", current, len(evicted), evicted, state.used_bytes)
    used = await _settled_usage(admin, salt, target_bytes, settle_s)
    kind = "shrunk" if target_bytes < current else "grown"
    detail = (f"disk {kind} from {current} to {target_bytes} bytes without a restart (L2 quota of salt "
              f"{salt or '_default'}); L2 usage {state.used_bytes} -> {used} bytes")
    if evicted:
        detail += f"; {len(evicted)} {what} entries evicted first (LMCache deleted {deleted} objects)"
        if leader is not None:
            detail += f"; {leader.text()}"
    if used > target_bytes:
        detail += f"; LMCache's IsolatedLRU trims the remaining {used - target_bytes} bytes at its next cycles"
    return DiskOutcome(True, detail, target_bytes, len(evicted), evicted, used)


async def _settled_usage(admin: LmcacheAdmin, salt: str, target_bytes: int, settle_s: float) -> int:
    """The salt's L2 usage once it is within the target, or after settle_s."""
    deadline = time.monotonic() + settle_s
    used = 0
    while True:
        try:
            used = (await admin.disk_state(salt)).used_bytes
        except LmcacheError:
            return used
        if used <= target_bytes or time.monotonic() >= deadline:
            return used
        await asyncio.sleep(0.25)
