"""Which entries a disk-tier shrink deletes first: the adaptive LRU/LCS policy's choice at the size it shrinks to.

The live policy (adaptive.py) follows whichever of two shadow caches of the cache's size wins where they
disagree; LCS must win 50 % more than LRU there to lead (`adaptive.LEAD_MARGIN`: the burden of proof is on LCS,
whose frequency term can mislead it on traffic it was not tuned on; LCS fell 0.9 points below LRU at 10 %
capacity on an unseen trace). A shrink asks the same question at the size it shrinks to: the pool's most recent
journaled accesses (at most ``WINDOW_EVENTS``; what the journal still holds after its checkpoint pruning) are
replayed through a fresh ``adaptive.LivePolicy`` of the target size (the same code and rule as the live one, its
shadows holding every key: no sampling over a window this short). The leader orders the deletions:

* LCS: the pool index's lowest-LCS leaves first (``resize.victims_to_fit`` under the LCS order);
* LRU: the least recently accessed leaves first (``lru_victims_to_fit``: leaves only, a parent becoming a leaf
  once its cached children are chosen, as the index's own choice does).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
from greenserve.cache_manager import adaptive
from greenserve.common.cache_index.index import CacheIndex
from greenserve.cache_manager.journal import Event
from greenserve.cache_manager.models import AccessEvent
from greenserve.common.persistence import Database
from sqlalchemy import select

WINDOW_EVENTS = 20_000
MARGIN = adaptive.LEAD_MARGIN


@dataclass(frozen=True)
class Leader:
    """The shrink order chosen, and the evidence."""

    policy: str  # "LCS" or "LRU"
    lru_hit_tokens: float  # decayed window sums of the shadows at the target size (adaptive.Duel)
    lcs_hit_tokens: float
    events: int
    lru_won: float = 0.0  # of which on the accesses where the two shadows disagreed
    lcs_won: float = 0.0
    fixed: bool = False  # the order is --eviction-policy's, not a replay's

    def text(self) -> str:
        if self.fixed:
            return f"{self.policy} order (--eviction-policy {self.policy.lower()})"
        return (f"adaptive order: {self.policy} led (at the target size over the last {self.events} accesses, "
                f"where the shadows disagreed LRU hit {self.lru_won:.0f} tokens, LCS {self.lcs_won:.0f}; "
                f"LCS leads only {MARGIN:.0%} ahead)")


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
    """Replay ``events`` through an adaptive policy of ``capacity_bytes``; its leader at the end."""
    policy = adaptive.LivePolicy("adaptive", capacity_bytes, max_entries=max(16, len(events)))
    for ev in events:
        acc = adaptive.access_of(ev)
        if acc is not None:
            policy.observe(acc)
    d = policy.duel
    return Leader(policy.leader, d.earned[adaptive.LRU], d.earned[adaptive.LCS], len(events),
                  d.won[adaptive.LRU], d.won[adaptive.LCS])


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
