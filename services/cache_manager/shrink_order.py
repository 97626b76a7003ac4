"""Which entries a disk-tier shrink deletes first: the adaptive LRU/LCS policy's choice (policies.py, "Adaptive").

The replay's adaptive policy follows whichever of two shadow caches, one LRU and one LCS of the cache's capacity,
has earned more hit tokens recently, and LCS must beat LRU by ``policies.ADAPTIVE_MARGIN`` (relative) to lead:
the burden of proof is on LCS, whose frequency term can mislead it on traffic it was not tuned on (issue 18: LCS
fell 0.9 points below LRU at 10 % capacity on an unseen trace). A shrink asks the same question at the size it
shrinks to: the pool's most recent journaled accesses (at most ``WINDOW_EVENTS``; what the journal still holds
after its checkpoint pruning) are replayed through a metadata-only LRU cache and a metadata-only LCS index
(``CacheIndex``, the same score as the pool's index) of the target size, each counting the hit tokens of the HIT
events it would have served. The leader orders the deletions:

* LCS: the pool index's lowest-LCS leaves first (``resize.victims_to_fit``), as before;
* LRU: the least recently accessed leaves first (``lru_victims_to_fit``: leaves only, a parent becoming a leaf
  once its cached children are chosen, as the index's own choice does).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from greenserve.cache_manager import policies
from greenserve.cache_manager.index import CacheIndex
from greenserve.cache_manager.journal import Event
from greenserve.cache_manager.models import AccessEvent
from greenserve.common.persistence import Database
from greenserve.v1 import cache_manager_pb2
from sqlalchemy import select

WINDOW_EVENTS = 20_000
MARGIN = policies.ADAPTIVE_MARGIN


@dataclass(frozen=True)
class Leader:
    """The shrink order chosen, and the evidence."""

    policy: str  # "LCS" or "LRU"
    lru_hit_tokens: float
    lcs_hit_tokens: float
    events: int

    def text(self) -> str:
        return (f"adaptive order: {self.policy} led (hit tokens at the target size over the last {self.events} "
                f"accesses: LRU {self.lru_hit_tokens:.0f}, LCS {self.lcs_hit_tokens:.0f}; LCS leads only "
                f"{MARGIN:.0%} ahead)")


def recent_events(db: Database, pool: str, limit: int = WINDOW_EVENTS) -> list[Event]:
    """The pool's newest journaled events (at most ``limit``), oldest first."""
    with db.session(readonly=True) as s:
        rows = list(s.scalars(select(AccessEvent).where(AccessEvent.pool == pool)
                              .order_by(AccessEvent.id.desc()).limit(limit)))
        out = [Event(r.pool, r.entry_key, r.kind, r.tokens, r.size_bytes, r.hit_tokens, r.turn, r.conversation_id,
                     r.document_id, r.time_s) for r in rows]
    out.reverse()
    return out


def choose_leader(events: list[Event], capacity_bytes: int) -> Leader:
    """Replay ``events`` through an LRU and an LCS shadow of ``capacity_bytes``; the adaptive policy's leader."""
    lru: OrderedDict[str, int] = OrderedDict()
    lru_bytes = 0
    lcs = CacheIndex()
    earned = {"LRU": 0.0, "LCS": 0.0}
    sizes: dict[str, tuple[int, int]] = {}  # key -> (size_bytes, tokens) of its last store

    def store(key: str, size: int, tokens: int, ev: Event, in_lru: bool, in_lcs: bool) -> None:
        nonlocal lru_bytes
        if not 0 < size <= capacity_bytes:
            return
        if not in_lru:
            lru[key] = size
            lru_bytes += size
            while lru_bytes > capacity_bytes:
                lru_bytes -= lru.popitem(last=False)[1]
        if not in_lcs:
            slot = lcs.store(key, tokens=tokens, size_bytes=size, now_s=ev.time_s, turn=ev.turn,
                             document_id=ev.document_id)
            while lcs.bytes_in_use > capacity_bytes:
                victims = lcs.choose_victims(1, ev.time_s, exclude=np.array([slot], dtype=np.int64))
                if not len(victims):
                    break
                lcs.remove_slot(int(victims[0]))

    for ev in events:
        key = ev.entry_key
        if ev.kind == cache_manager_pb2.ACCESS_KIND_HIT:
            # The real cache served it; a shadow that does not hold it would have recomputed and stored it.
            tokens = float(ev.hit_tokens or ev.tokens)
            in_lru, in_lcs = key in lru, key in lcs
            if in_lru:
                earned["LRU"] += tokens
                lru.move_to_end(key)
            if in_lcs:
                earned["LCS"] += tokens
                lcs.hit(key, hit_tokens=int(tokens), now_s=ev.time_s, turn=ev.turn, document_id=ev.document_id)
            if key in sizes and not (in_lru and in_lcs):
                store(key, *sizes[key], ev, in_lru, in_lcs)
        elif ev.kind == cache_manager_pb2.ACCESS_KIND_STORE:
            sizes[key] = (ev.size_bytes, ev.tokens)
            if key in lru:
                lru_bytes -= lru.pop(key)
            store(key, ev.size_bytes, ev.tokens, ev, False, False)
    policy = "LCS" if earned["LCS"] > earned["LRU"] * (1.0 + MARGIN) else "LRU"
    return Leader(policy, earned["LRU"], earned["LCS"], len(events))


def lru_victims_to_fit(index: CacheIndex, target_bytes: int) -> list[str]:
    """Keys of the least recently accessed leaves to drop so that the indexed bytes are <= target_bytes (a
    parent is a candidate once every cached child of it is chosen)."""
    excess = index.bytes_in_use - target_bytes
    if excess <= 0:
        return []
    live = index.live
    slots = np.flatnonzero(live)
    nchild = index.nchild[:len(live)].astype(np.int64)
    leaves = slots[nchild[slots] == 0]
    heap = list(zip(index.last_access_s[leaves].tolist(), leaves.tolist()))
    heapq.heapify(heap)
    keys: list[str] = []
    while excess > 0 and heap:
        _, s = heapq.heappop(heap)
        keys.append(index.key_of(s))
        excess -= int(index.size_bytes[s])
        parent = int(index.parent[s])
        if 0 <= parent < len(live) and live[parent]:
            nchild[parent] -= 1
            if nchild[parent] == 0:
                heapq.heappush(heap, (float(index.last_access_s[parent]), parent))
    return keys
