"""The cache-manager's cache indexes, one per pool, and how they survive a restart.

Each pool's index lives in memory, fed by access events that are journaled in the database before they are
acknowledged (journal.py) and checkpointed to `<data_dir>/cache_index/<pool>.npz` every
`--snapshot-interval-s` and on stop (snapshots.py). At start each pool's checkpoint is loaded (an unreadable
one is moved aside with a warning, and the previous checkpoint or the journal alone rebuilds the pool) and
the journal after it is replayed: the index holds exactly the acknowledged events, even after a SIGKILL.
Every change of the index happens under one lock, snapshots included.

``JournaledIndexes`` is a part of ``CacheManagerServicer`` (service.py), which sets the attributes it declares.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from greenserve.cache_manager import access_history, adaptive, journal
from greenserve.common.cache_index.index import CacheIndex
from greenserve.cache_manager.settings import CacheManagerSettings
from greenserve.cache_manager.snapshots import SnapshotStore
from greenserve.common.app import ServiceContext
from greenserve.v1 import cache_manager_pb2

log = logging.getLogger("greenserve.cache_manager")

_T = TypeVar("_T")


def _now_s() -> float:
    return time.time()


async def _run_to_end(coro: Awaitable[_T]) -> _T:
    """Await `coro` as a task that a cancelled caller (client gone, deadline, shutdown) does not stop midway:
    a journal write is applied to the index once committed, a checkpoint finishes its files."""
    task = asyncio.ensure_future(coro)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved even when nobody awaits
    return await asyncio.shield(task)


class JournaledIndexes:
    """The servicer's indexes: loading them at start, journaling events before applying them, checkpoints."""

    ctx: ServiceContext
    settings: CacheManagerSettings
    index_dir: Path
    snapshots: SnapshotStore
    indexes: dict[str, CacheIndex]
    policies: dict[str, adaptive.LivePolicy]
    server_bytes: dict[str, tuple[str, int]]  # server id -> (pool, L1 bytes last read or applied)
    history: dict[str, deque[tuple[float, int, str]]]
    _lock: asyncio.Lock
    _cur_id: dict[str, int | None]
    _prev_id: dict[str, int | None]
    last_event_id: int
    _events_since_checkpoint: int
    _checkpoint_task: asyncio.Task | None
    checkpoints: int
    access_history: access_history.AccessHistory

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
            self._restore_policy(pool, index.journal_id)
            index.set_order(self.policies[pool].order)  # a loaded index evicts in the order in force
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
        policy = self.policy(ev.pool)
        if index.order != policy.order:  # a pool's new or loaded index takes the order in force
            index.set_order(policy.order)
        journal.apply(index, event_id, ev, history, self.settings.index_max_entries)
        access = adaptive.access_of(ev)
        if access is not None and policy.observe(access):
            index.set_order(policy.order)
            log.info("cache eviction policy of pool %r: %s now leads; %s", ev.pool, policy.leader, policy.text(),
                     extra={"pool": ev.pool, "eviction_order": policy.leader})

    # ----- the eviction policy (adaptive.py) -----------------------------------------------------------
    def _policy_path(self, pool: str) -> Path:
        return self.index_dir / "policy" / f"{pool}.json"

    def _save_policy(self, pool: str, journal_id: int, state: adaptive.PolicyState) -> None:
        """The duel's state at a checkpoint (atomic; taken back only with the index of the same journal id)."""
        path = self._policy_path(pool)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({"journal_id": journal_id, **state}))
        tmp.replace(path)

    def _restore_policy(self, pool: str, journal_id: int) -> None:
        """Take back the pool's duel state saved with this checkpoint: the journal replay then continues it.
        Anything else (no file, another checkpoint's, unreadable) leaves the policy new (LRU leads)."""
        self.policy(pool)  # the pool's policy exists (and shows in the metrics) from the start
        path = self._policy_path(pool)
        if not path.exists():
            return
        try:
            state = json.loads(path.read_text())
            if state.get("journal_id") != journal_id:
                return
            self.policy(pool).restore(state)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("eviction policy state of pool %r not restored (%s: %s); LRU leads until LCS proves itself",
                        pool, type(exc).__name__, exc)
            self.policies.pop(pool, None)
            self.policy(pool)

    def policy(self, pool: str) -> adaptive.LivePolicy:
        """The pool's eviction policy (made on its first access: --eviction-policy, the pool's capacity)."""
        policy = self.policies.get(pool)
        if policy is None:
            policy = self.policies[pool] = adaptive.LivePolicy(
                self.settings.eviction_policy, self._pool_capacity(pool),
                max_entries=self.settings.policy_shadow_max_entries)
        return policy

    def _pool_capacity(self, pool: str) -> int:
        """The bytes the pool's shadow caches simulate: --policy-capacity-bytes, else the L1 sizes of the pool's
        servers as last read or applied (0: none known)."""
        if self.settings.policy_capacity_bytes:
            return self.settings.policy_capacity_bytes
        return sum(size for p, size in self.server_bytes.values() if p == pool)

    def note_server_bytes(self, server_id: str, pool: str, l1_bytes: int | None) -> None:
        """Record a server's L1 size (None: the server is gone); the pool's shadow caches follow it."""
        old = self.server_bytes.pop(server_id, None)
        if l1_bytes is not None:
            self.server_bytes[server_id] = (pool, int(l1_bytes))
        for p in {pool} | ({old[0]} if old else set()):
            if p in self.policies:
                self.policies[p].set_capacity(self._pool_capacity(p))

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
                    policy = self.policies.get(pool)
                    if policy is not None:
                        await asyncio.to_thread(self._save_policy, pool, index.journal_id, policy.state())
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
