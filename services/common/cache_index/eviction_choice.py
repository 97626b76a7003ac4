"""Exact, incremental eviction choice of the cache index (mixin of `CacheIndex`).

Each score is `(base + extra x exp(-age / tau)) / age` where `base`
and `extra` change only on an access, tau only in a full pass, and `age = now - t_ref`: a non-increasing
function of age between full passes; the ranking changes with time, so a heap keyed at insertion would go stale. A
*refresh* scores every eligible entry in one vectorised pass and keeps a pool of the M lowest by their
score at `T0 + H` (H a short horizon) and the bound `theta`, the lowest such score outside the pool. Any
entry outside the pool that has not been touched since T0 still scores >= theta at any time up to T0 + H
(scores only fall with age). Entries touched, stored or made evictable since T0 are kept in a "dirty"
list. A choice scores only pool + dirty at `now`; a victim whose score is <= theta is the exact minimum,
otherwise (or after T0 + H) the index refreshes and chooses from the full pass. So the answer is always
the exact lowest-score leaf, and the usual cost is O(pool + dirty) instead of O(entries).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np
from greenserve.common.cache_index.index_fields import IndexFields
from greenserve.common.cache_index.lcs_scores import MIN_AGE_S

POOL_SIZE = 1024  # entries kept in the candidate pool after a refresh (adapted up to MAX_POOL_SIZE)
MAX_POOL_SIZE = 8192
NEAR_SIZE = 8192  # entries past the pool whose scores give the exact per-Delta bounds
DIRTY_MAX = 1 << 16  # touched entries tracked between refreshes; more forces a refresh
THETA_STEPS = 8  # bounds kept per refresh, for Delta = H/8, 2H/8, ..., H after it


@dataclass(frozen=True)
class EntryView:
    """One entry, read back from the arrays (for listings and tests)."""

    entry_key: str
    tokens: int
    hits: int
    hit_tokens: int
    size_bytes: int
    stored_s: float
    last_access_s: float
    turn: int
    score: float
    age_s: float

class EvictionChoice(IndexFields):
    """Candidate pool, dirty list and victim choice of `CacheIndex` (lowest-score leaves first)."""

    def _mark(self, slots: np.ndarray | int) -> None:
        """Record that slots changed (score or eligibility) since the last refresh."""
        if not self._pool_valid:
            return
        arr = np.atleast_1d(np.asarray(slots, dtype=np.int64))
        if self._dirty_n + len(arr) > DIRTY_MAX:
            self._pool_valid = False
            return
        self._dirty[self._dirty_n: self._dirty_n + len(arr)] = arr
        self._dirty_n += len(arr)

    # ----- eviction choice -----------------------------------------------------------------------
    def _eligible(self, slots: np.ndarray) -> np.ndarray:
        return (self.key_hash[slots] != 0) & (self.nchild[slots] == 0)

    def _refresh(self, now_s: float) -> None:
        """Full pass: pool = the lowest leaves by score at now + H/2; bounds theta_j for Delta <= j H / G.

        theta_j is the exact lowest score at time now + j H / G among leaves outside the pool: an untouched
        entry outside the pool scores at least theta_j at any time up to then (scores fall with age).
        """
        self.refreshes += 1
        if self.hit_decay == "online":
            # tau changes only here: between full passes every score is a fixed non-increasing function
            # of age, which is what the pool bounds need.
            self.tau_s = self.estimated_tau_s()
        # Adapt the pool size: a pool that lasted few choices was too small, one that lasted long too big.
        if self.refreshes > 1 and self._pool_uses < 4:
            self._pool_size = min(self._pool_size * 2, MAX_POOL_SIZE)
        elif self._pool_uses > 64:
            self._pool_size = max(self._pool_size // 2, POOL_SIZE)
        self._pool_uses = 0
        n = self._n
        cand = np.flatnonzero((self.key_hash[:n] != 0) & (self.nchild[:n] == 0))
        age = np.subtract(now_s, self._ref_times()[cand])
        np.maximum(age, MIN_AGE_S, out=age)
        value = self._value_of(cand)
        base = self._base_value(cand, value) if self.tau_s != np.inf else value
        extra = value - base if self.tau_s != np.inf else np.zeros(len(cand))
        h = self._pool_h
        m = min(self._pool_size, len(cand))
        future = self._score_parts(base, extra, age + 0.5 * h)
        if m < len(cand):
            # theta_j exactly over the next NEAR_SIZE entries past the pool; every entry beyond scores at
            # least their cut at now + H, a valid (looser) bound for every Delta <= H.
            m2 = min(m + NEAR_SIZE, len(cand) - 1)
            part = np.argpartition(future, [m, m2] if m2 > m else [m])
            pool, near = part[:m], part[m:m2 + 1]
            b_near, e_near, a_near = base[near], extra[near], age[near]
            far = part[m2:]
            beyond = float(np.min(self._score_parts(base[far], extra[far], age[far] + h))) \
                if m2 + 1 < len(cand) else np.inf
            steps = h * np.arange(1, THETA_STEPS + 1) / THETA_STEPS
            near_sc = self._score_parts(b_near[None, :], e_near[None, :], a_near[None, :] + steps[:, None])
            self._pool_theta = np.minimum(np.min(near_sc, axis=1), beyond)
        else:
            pool = np.arange(len(cand))
            self._pool_theta = np.full(THETA_STEPS, np.inf)
        self._pool = cand[pool]
        self._pool_t0 = now_s
        if len(pool):
            # Next horizon: a quarter of the typical victim age (only speed depends on it, not results).
            self._pool_h = max(0.25 * float(np.median(age[pool])), MIN_AGE_S)
            if m < len(cand):
                self._pool_h = min(self._pool_h, 2 * h)  # theta above was computed for the previous h
        self._pool_hcur = h
        self._dirty_n = 0
        self._pool_valid = not self._n_doc_entries  # document scores change for many entries at once

    def choose_victims(self, count: int, now_s: float, *, exclude: np.ndarray | None = None) -> np.ndarray:
        """Slots of the `count` entries to evict at `now_s`, in order: repeatedly the lowest-score leaf.

        Exact (the same answer as scoring every entry and evicting one by one, leaves only); `exclude`
        (slot array) is never chosen (e.g. the blocks of the request being served). Parents that become
        leaves once their chosen children go are candidates in the same call (scored as truncated).
        """
        if count <= 0 or self._live == 0:
            return np.empty(0, dtype=np.int64)
        delta = now_s - self._pool_t0
        if self._pool_valid and 0 <= delta <= self._pool_hcur:
            j = min(THETA_STEPS - 1, int(np.ceil(delta / self._pool_hcur * THETA_STEPS - 1e-12)) - 1) \
                if self._pool_hcur > 0 else THETA_STEPS - 1
            bound = float(self._pool_theta[max(j, 0)])
            cand = np.concatenate([self._pool, self._dirty[: self._dirty_n]])
            self._pool_uses += 1
            out = self._choose(count, now_s, cand, bound, exclude)
            if out is not None:
                return out
        self._refresh(now_s)
        if self._pool_valid:
            out = self._choose(count, now_s, self._pool, float(self._pool_theta[0]), exclude)
            if out is not None:
                return out
        n = self._n
        cand = np.flatnonzero((self.key_hash[:n] != 0) & (self.nchild[:n] == 0))
        out = self._choose(count, now_s, cand, np.inf, exclude)
        assert out is not None
        return out

    def _choose(self, count: int, now_s: float, cand: np.ndarray, bound: float,
                exclude: np.ndarray | None) -> np.ndarray | None:
        """Greedy choice from `cand`; None when it would need an entry scoring above `bound` (or one
        outside the sorted head when the bound is finite)."""
        keep = self._eligible(cand)  # duplicates are harmless: _greedy skips entries already chosen
        excluded: set[int] = set()
        if exclude is not None and len(exclude):
            self._scratch[exclude] = True
            keep &= ~self._scratch[cand]
            self._scratch[exclude] = False
            excluded = {int(x) for x in exclude}
        cand = cand[keep]
        sc = self.scores(now_s, cand)
        head = 4 * count + 64
        while True:
            k = min(len(cand), head)
            order = np.argpartition(sc, k - 1)[:k] if 0 < k < len(cand) else np.arange(len(cand))
            order = order[np.lexsort((cand[order], sc[order]))]  # equal scores (LRU: equal times): lower slot first
            chosen, complete = self._greedy(count, now_s, sc, cand, order, bound, excluded)
            if complete:
                return np.asarray(chosen, dtype=np.int64)
            if bound != np.inf:
                return None
            if k == len(cand):
                return np.asarray(chosen, dtype=np.int64)  # fewer evictable entries than asked
            head *= 4

    def _greedy(self, count: int, now_s: float, sc: np.ndarray, cand: np.ndarray, order: np.ndarray,
                bound: float, excluded: set[int]) -> tuple[list[int], bool]:
        """Pop the lowest of (sorted head, parents turned leaves); (chosen, complete?)."""
        head_sc = sc[order].tolist()
        head_s = cand[order].tolist()
        head_p = self.parent[cand[order]].tolist()
        parent, nchild, key_hash, ref = self.parent, self.nchild, self.key_hash, self._ref_times()
        tokens, turns, sizes = self.tokens, self.turn, self.size_bytes
        # The inlined scores below are CacheIndex's own (a subclass may score differently).
        lcs = self.order == "lcs" and self._scores_inlinable()
        fast_truncate = self.truncation_reset and not self._n_doc_entries and lcs
        fast_keep = not self.truncation_reset and not self._n_doc_entries and lcs
        values, tau = self.value, self.tau_s
        chosen: list[int] = []
        chosen_set: set[int] = set()
        removed_children: dict[int, int] = {}
        side: list[tuple[float, int, int]] = []
        i, n_head = 0, len(head_s)
        while len(chosen) < count:
            if i < n_head and not (side and side[0][0] < head_sc[i]):
                score, s, p = head_sc[i], head_s[i], head_p[i]
                i += 1
            elif side:
                score, s, p = heapq.heappop(side)
            else:
                # Head exhausted: complete only when it held every entry that could be evictable.
                return chosen, n_head == len(cand) and bound == np.inf
            if score > bound:
                return [], False
            if s in chosen_set:
                continue
            chosen.append(s)
            chosen_set.add(s)
            if p >= 0 and p not in excluded and key_hash[p] != 0:
                removed = removed_children.get(p, 0) + 1
                removed_children[p] = removed
                if removed == nchild[p]:
                    age = now_s - float(ref[p])
                    if fast_truncate:  # inline _truncated_value (hot path of large evictions)
                        turn = int(turns[p])
                        size = float(sizes[p])
                        v = (turn if turn > 1 else 1) * float(tokens[p]) / (size if size > 1.0 else 1.0)
                        sc_p = v / (age if age > MIN_AGE_S else MIN_AGE_S)
                    elif fast_keep:  # inline _truncated_score without reset: the value is unchanged
                        age = age if age > MIN_AGE_S else MIN_AGE_S
                        v = float(values[p])
                        if tau != np.inf and int(turns[p]) == 0:
                            size = float(sizes[p])
                            base = min(float(tokens[p]) / (size if size > 1.0 else 1.0), v)
                            v = base + (v - base) * math.exp(-age / tau)
                        sc_p = v / age
                    else:
                        sc_p = self._truncated_score(p, now_s)
                    heapq.heappush(side, (sc_p, p, int(parent[p])))
        return chosen, True

    def lowest(self, limit: int, now_s: float) -> list[EntryView]:
        """The next `limit` entries to evict, in the eviction order in force (lowest-score leaves first); each
        view's `score` is its LCS score whatever the order."""
        slots = self.choose_victims(limit, now_s)
        order, self.order = self.order, "lcs"  # a plain read: the candidate pool is left as it is
        try:
            sc = self.scores(now_s, slots) if len(slots) else np.empty(0)
        finally:
            self.order = order
        ref = self._ref_times()
        return [
            EntryView(
                entry_key=self.key_of(int(s)), tokens=int(self.tokens[s]), hits=int(self.hits[s]),
                hit_tokens=int(self.hit_tokens[s]), size_bytes=int(self.size_bytes[s]),
                stored_s=float(self.stored_s[s]), last_access_s=float(self.last_access_s[s]),
                turn=int(self.turn[s]), score=float(sc[i]), age_s=max(now_s - float(ref[s]), 0.0),
            )
            for i, s in enumerate(slots)
        ]

    def expired(self, now_s: float, ttl_by_group_s: np.ndarray, default_ttl_s: float | None) -> np.ndarray:
        """Live slots whose time since last access exceeds their group's TTL (Kareto group TTL).

        `ttl_by_group_s[g]` is the TTL of group g; entries with no group (or a group beyond the array) use
        `default_ttl_s` (None: never expire).
        """
        n = self._n
        default = np.inf if default_ttl_s is None else float(default_ttl_s)
        groups = self.group[:n].astype(np.int64)
        table = np.append(np.asarray(ttl_by_group_s, dtype=np.float64), default)
        idx = np.where(groups < len(ttl_by_group_s), groups, len(ttl_by_group_s))
        ttl = table[idx]
        idle = now_s - self.last_access_s[:n]
        return np.flatnonzero((self.key_hash[:n] != 0) & (idle > ttl))
