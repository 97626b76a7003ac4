"""The cache-manager's part of the control loop: follow the plan in force and size each pool's LMCache servers.

``follow_plans`` runs one ``PlanFollower`` (component ``cache-manager``, instance ``--instance``) whose reconcile
is ``CacheEnforcer.reconcile``: the ``cache_targets`` of the interval in force, applied to the registered LMCache
servers of each pool with the same resize the ``ApplyCachePlan``/``ResizeCache`` RPCs use (service.py,
resize.py), under the servicer's lock so no RPC resize interleaves. What it reports:

* ``REFUSED``, nothing changed: a target the ``ApplyCachePlan`` checks reject (repeated pool, bad TTL, an
  implausible size), a target for a pool that is neither in the interval's pool figures nor served by a
  registered server, or a DRAM size beyond what a server can take (``--lmcache-max-dram-bytes``; by default
  this host's physical memory for servers on this host).
* ``FAILED``, nothing changed: a server of a target pool is unreachable before anything was resized, or the
  first resize fails.
* ``ROLLED_BACK``: a resize fails after others succeeded; those servers are resized back to their previous
  sizes (entries evicted by a shrink stay evicted: LMCache cannot take them back). ``FAILED`` when a roll-back
  itself fails, naming the servers left at the new size.
* ``APPLIED``: every server of every target pool holds its target, e.g. ``pool chat: dram 1.0 GiB -> 2.0 GiB
  (s1); disk 3.0 GiB -> 2.0 GiB (s1)``. The disk (L2) size is applied at run time, without a restart, as the
  L2 quota of the default salt on servers whose L2 adapter evicts by IsolatedLRU (disk_tier.py); a pool of the
  plan without a registered server, or a disk target a server cannot take (no L2 adapter, L2 adapters
  without quota enforcement, or a target disk medium, ``disk_medium``, in whose folder ``disk_path`` the server
  has no L2 adapter), is said in the detail with the reason and leaves that server's disk size as it was. Re-applying the same interval changes nothing.

The plan in force is kept in ``<data_dir>/cache_manager_plan.pb`` (``plan_file_store``), so a restart during an
optimizer outage keeps following it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from greenserve.cache_manager import journal
from greenserve.cache_manager.disk_tier import (
    NO_L2_ADAPTER,
    why_not_on_medium,
    why_not_sizable,
)
from greenserve.cache_manager.lmcache_admin import LmcacheError, gib
from greenserve.cache_manager.models import LmcacheServer
from greenserve.cache_manager.request_checks import check_targets
from greenserve.cache_manager.resize_recovery import report_recovered
from greenserve.common.app import ServiceContext
from greenserve.common.client import create_channel
from greenserve.common.errors import InvalidArgument
from greenserve.common.plan_follow import (
    APPLIED,
    FAILED,
    REFUSED,
    ROLLED_BACK,
    Outcome,
    PlanFollower,
    plan_file_store,
)
from greenserve.common.tasks import cancel_and_wait
from greenserve.v1 import common_pb2

if TYPE_CHECKING:
    from greenserve.cache_manager.service import CacheManagerServicer

COMPONENT = "cache-manager"
PLAN_FILE = "cache_manager_plan.pb"
MAX_RECORDED_VERSION = 2**31 - 1  # cache_applications.plan_version is a 32-bit column


def host_memory_bytes() -> int:
    """Physical memory of this host, bytes (0 when the platform does not say)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


def on_this_host(url: str) -> bool:
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:  # a malformed URL stored before URLs were checked: unreachable, and not known to be here
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def dram_limit_bytes(url: str, max_dram_bytes: int) -> int | None:
    """Largest L1 size the server at ``url`` can take: ``max_dram_bytes`` (``--lmcache-max-dram-bytes``) when
    set, else this host's memory for a server on this host, else None (unknown: no limit)."""
    if max_dram_bytes > 0:
        return max_dram_bytes
    if on_this_host(url):
        return host_memory_bytes() or None
    return None


def check_dram_limit(field: str, dram_bytes: int, row: LmcacheServer, max_dram_bytes: int) -> None:
    """InvalidArgument naming ``field`` when ``dram_bytes`` is more than server ``row`` can take
    (``dram_limit_bytes``). The one check of a DRAM size against the limit: the plan follower's and the
    ApplyCachePlan / ResizeCache RPCs' (service.py), so a direct call cannot size a server past what a plan may."""
    limit = dram_limit_bytes(row.url, max_dram_bytes)
    if limit is not None and dram_bytes > limit:
        source = "--lmcache-max-dram-bytes" if max_dram_bytes > 0 else \
            "this host's memory (--lmcache-max-dram-bytes is unset)"
        raise InvalidArgument(field, f"{gib(dram_bytes)} is more than server {row.id} of pool {row.pool} can take "
                              f"({gib(limit)}); the limit is {source}")


def check_dram_limits(targets: Iterable[common_pb2.CacheTarget], by_pool: dict[str, list[LmcacheServer]],
                      max_dram_bytes: int, field: str = "targets") -> None:
    """``check_dram_limit`` for every server of every target's pool: InvalidArgument naming the first
    ``<field>[j].dram_bytes`` over its limit, before anything is resized (all or nothing)."""
    for j, target in enumerate(targets):
        for row in by_pool.get(target.pool, ()):
            check_dram_limit(f"{field}[{j}].dram_bytes", target.dram_bytes, row, max_dram_bytes)


@dataclass
class _Step:
    """One server to bring to its pool's target."""

    row: LmcacheServer
    before_bytes: int
    target_bytes: int
    evicted: int = 0
    disk_before_bytes: int | None = None  # None: the disk tier is not sized on this server
    disk_target_bytes: int | None = None
    dram_done: bool = False
    disk_done: bool = False

    @property
    def disk_changes(self) -> bool:
        return self.disk_target_bytes is not None and self.disk_before_bytes != self.disk_target_bytes


class CacheEnforcer:
    """Reconciles the cache targets of a plan interval with the registered LMCache servers (module docstring)."""

    def __init__(self, servicer: CacheManagerServicer, max_dram_bytes: int = 0) -> None:
        self.servicer = servicer
        self.max_dram_bytes = max_dram_bytes
        # plan version -> what recovery at start did about its resize a kill cut: said first in its next report
        self.recovered: dict[int, str] = {}

    def dram_limit_bytes(self, row: LmcacheServer) -> int | None:
        """Largest L1 size ``row`` can take: the flag, else this host's memory for a local server, else None."""
        return dram_limit_bytes(row.url, self.max_dram_bytes)

    async def reconcile(self, plan: common_pb2.Plan, interval: common_pb2.PlanInterval | None) -> Outcome:
        outcome = await self._reconcile(plan, interval)
        note = self.recovered.pop(plan.version, "")
        return Outcome(outcome.state, f"{note}; {outcome.detail}") if note else outcome

    async def _reconcile(self, plan: common_pb2.Plan, interval: common_pb2.PlanInterval | None) -> Outcome:
        if interval is None or not interval.cache_targets:
            return Outcome(APPLIED, "no cache targets in this interval: cache sizes left as they are")
        index = next((i for i, iv in enumerate(plan.intervals) if iv == interval), 0)
        field = f"plan.intervals[{index}].cache_targets"
        svc = self.servicer
        async with svc._lock:  # the servicer's resize lock: no RPC resize interleaves
            rows = svc._servers()
            by_pool: dict[str, list[LmcacheServer]] = defaultdict(list)
            for row in rows:
                by_pool[row.pool].append(row)
            plan_pools = {p.pool for p in interval.pools}
            try:
                check_targets(interval.cache_targets, set(by_pool) | plan_pools, field)
                check_dram_limits(interval.cache_targets, by_pool, self.max_dram_bytes, field)
            except InvalidArgument as exc:
                return Outcome(REFUSED, f"{exc}; nothing changed")
            steps, notes, failure = await self._current_sizes(interval, by_pool)
            if failure:
                return Outcome(FAILED, f"{failure}; nothing changed")
            outcome = await self._apply(plan, interval, steps, notes)
            # every outcome recorded: the journaled restart steps of this apply are over
            journal.end_resize(svc.ctx.db, *(step.row.id for pool_steps in steps.values() for step in pool_steps))
            return outcome

    async def _current_sizes(self, interval: common_pb2.PlanInterval, by_pool: dict[str, list[LmcacheServer]]
                             ) -> tuple[dict[str, list[_Step]], list[str], str]:
        """Each target pool's servers with their L1 size now; notes for pools without servers; a failure."""
        steps: dict[str, list[_Step]] = {}
        notes: list[str] = []
        for target in interval.cache_targets:
            servers = by_pool.get(target.pool, [])
            if not servers:
                notes.append(f"pool {target.pool}: no LMCache server registered, target dram "
                             f"{gib(target.dram_bytes)} not applied")
                continue
            steps[target.pool] = []
            for row in servers:
                admin = self.servicer._admin(row.url)
                step = None
                try:
                    state = await admin.state()
                    step = _Step(row, state.l1_total_bytes, target.dram_bytes)
                    if state.l2_adapters:
                        disk = await admin.disk_state()
                        reason = why_not_sizable(disk)
                        medium_reason = "" if reason else why_not_on_medium(disk, target.disk_medium,
                                                                            target.disk_path)
                        if reason:
                            notes.append(f"pool {target.pool}: disk target {gib(target.disk_bytes)} not applied on "
                                         f"{row.id}: {reason}")
                        elif medium_reason:  # the plan moved the tier to a medium this server has no adapter on
                            notes.append(f"pool {target.pool}: disk target {gib(target.disk_bytes)} on "
                                         f"{target.disk_medium} not applied on {row.id}: {medium_reason}; its disk "
                                         f"tier stays at {gib(disk.quota_bytes or 0)}")
                        else:
                            step.disk_before_bytes, step.disk_target_bytes = disk.quota_bytes or 0, target.disk_bytes
                    elif target.disk_bytes:
                        notes.append(f"pool {target.pool}: disk target {gib(target.disk_bytes)} not applied on "
                                     f"{row.id}: {NO_L2_ADAPTER}")
                except LmcacheError as exc:
                    return steps, notes, f"pool {target.pool}: server {row.id} unreachable: {exc}"
                finally:
                    await admin.aclose()
                steps[target.pool].append(step)
        return steps, notes, ""

    async def _apply(self, plan: common_pb2.Plan, interval: common_pb2.PlanInterval,
                     steps: dict[str, list[_Step]], notes: list[str]) -> Outcome:
        svc = self.servicer
        done: list[_Step] = []
        for pool, pool_steps in steps.items():
            for step in pool_steps:
                if step.before_bytes != step.target_bytes:
                    outcome = await svc._resize(step.row, step.target_bytes, plan.version)
                    if not outcome.applied:
                        reason = (f"pool {pool}: resizing server {step.row.id} from {gib(step.before_bytes)} to "
                                  f"{gib(step.target_bytes)} failed: {outcome.detail}")
                        self._record(plan, step, False, reason)
                        return await self._roll_back(plan, done, reason)
                    step.evicted = outcome.evicted_entries
                    step.dram_done = True
                    done.append(step)
                disk_target = step.disk_target_bytes  # None: the plan leaves this server's disk tier alone
                if disk_target is not None and step.disk_changes:
                    disk_outcome = await svc._resize_disk(step.row, disk_target)
                    if not disk_outcome.applied:
                        reason = (f"pool {pool}: sizing the disk tier of server {step.row.id} from "
                                  f"{gib(step.disk_before_bytes or 0)} to {gib(disk_target)} failed: "
                                  f"{disk_outcome.detail}")
                        self._record(plan, step, False, reason)
                        return await self._roll_back(plan, done, reason)
                    step.evicted += disk_outcome.evicted_entries
                    step.disk_done = True
                    if not step.dram_done:
                        done.append(step)
        lines = []
        for target in interval.cache_targets:
            if target.pool not in steps:
                continue
            pool_steps = steps[target.pool]
            changed = [s for s in pool_steps if s.before_bytes != s.target_bytes]
            ids = ", ".join(s.row.id for s in pool_steps)
            if changed:
                before = " / ".join(sorted({gib(s.before_bytes) for s in changed}))
                evicted = sum(s.evicted for s in changed)
                line = f"pool {target.pool}: dram {before} -> {gib(target.dram_bytes)} ({ids})"
                if evicted:
                    line += f", {evicted} lowest-LCS entries evicted first"
            else:
                line = f"pool {target.pool}: dram {gib(target.dram_bytes)} already in force ({ids})"
            sized = [s for s in pool_steps if s.disk_target_bytes is not None]
            disk_changed = [s for s in sized if s.disk_changes]
            if disk_changed:
                before = " / ".join(sorted({gib(s.disk_before_bytes or 0) for s in disk_changed}))
                line += (f"; disk {before} -> {gib(target.disk_bytes)} without restart "
                         f"({', '.join(s.row.id for s in disk_changed)})")
            elif sized:
                line += f"; disk {gib(target.disk_bytes)} already in force ({', '.join(s.row.id for s in sized)})"
            if target.ttl_s > 0:  # as ApplyCachePlan: the plan's pool-wide TTL
                svc.ttls.setdefault(target.pool, {})["*"] = target.ttl_s
                line += f", TTL {target.ttl_s:g} s"
            lines.append(line)
            for step in pool_steps:
                self._record(plan, step, True, line)
        return Outcome(APPLIED, "; ".join(lines + notes))

    async def _roll_back(self, plan: common_pb2.Plan, done: list[_Step], reason: str) -> Outcome:
        if not done:
            return Outcome(FAILED, f"{reason}; nothing changed")
        back, stuck = [], []
        for step in reversed(done):
            if step.disk_done and step.disk_before_bytes is not None:
                disk_outcome = await self.servicer._resize_disk(step.row, step.disk_before_bytes)
                if disk_outcome.applied:
                    back.append(f"{step.row.id} disk to {gib(step.disk_before_bytes)}")
                else:
                    stuck.append(f"{step.row.id} disk stays at {gib(step.disk_target_bytes or 0)} "
                                 f"({disk_outcome.detail})")
            if not step.dram_done:
                continue
            outcome = await self.servicer._resize(step.row, step.before_bytes, plan.version)
            if outcome.applied:
                back.append(f"{step.row.id} to {gib(step.before_bytes)}")
                self._record(plan, step, False, f"rolled back: {reason}")
            else:
                stuck.append(f"{step.row.id} stays at {gib(step.target_bytes)} ({outcome.detail})")
        if stuck:
            return Outcome(FAILED, f"{reason}; roll-back incomplete: {'; '.join(stuck)}"
                           + (f"; rolled back {', '.join(back)}" if back else ""))
        evicted = sum(s.evicted for s in done)
        tail = f" ({evicted} entries evicted by a shrink stay evicted)" if evicted else ""
        return Outcome(ROLLED_BACK, f"{reason}; rolled back {', '.join(back)}{tail}")

    def _record(self, plan: common_pb2.Plan, step: _Step, applied: bool, detail: str) -> None:
        if 1 <= plan.version <= MAX_RECORDED_VERSION:
            self.servicer._record(step.row.id, plan.version, step.target_bytes, None, applied, detail)


def follow_plans(ctx: ServiceContext, servicer: CacheManagerServicer) -> PlanFollower | None:
    """Starts following the optimizer's plans (unless ``--no-follow-plans``); stops with the service."""
    settings = ctx.settings
    if not getattr(settings, "follow_plans", False):
        return None
    channel = create_channel(settings.channel_config(settings.optimizer_addr))  # type: ignore[attr-defined]
    save, load = plan_file_store(Path(settings.data_dir) / PLAN_FILE)
    enforcer = CacheEnforcer(servicer, settings.lmcache_max_dram_bytes)  # type: ignore[attr-defined]
    follower = PlanFollower(component=COMPONENT, instance=settings.instance,  # type: ignore[attr-defined]
                            channel=channel, reconcile=enforcer.reconcile, save=save, load=load)

    async def start() -> None:
        settled = await servicer.recovered()  # cut resizes settled before any plan is reconciled
        await follower.start()
        await report_recovered(follower, enforcer, settled)

    started = asyncio.get_running_loop().create_task(start(), name="cache-manager-plan-follow")

    async def stop() -> None:
        await cancel_and_wait(started)
        await follower.stop()
        await channel.close()

    ctx.on_stop.append(stop)
    return follower
