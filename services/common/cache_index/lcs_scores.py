"""LCS scores of the cache index (GreenCache Eq. 7-9) and the online hit-decay time constant (mixin of
`CacheIndex`).

Definitions (each choice is measured by `greenserve bench cache-policy`, see docs/cache_manager.md):

- `#Hit` counts the entry's hits plus its store (hits + 1), so a freshly stored entry is not scored 0 and
  evicted before it had any chance to be reused. With `hit_decay` (default `"online"`) the hits count
  `1 + hits x exp(-Age / tau)`: past hits predict reuse only while the conversation goes on (on the
  Mooncake trace, up to ~10-15 minutes idle; docs/cache_manager.md). tau is estimated online from the
  stream (`estimated_tau_s`: the 90 % quantile of re-access gaps of a hash-sampled subset of all keys,
  so it does not depend on the cache size) and changes only in a full pass; a number fixes tau, `"none"`
  turns the decay off. Turn and document entries (Eq. 8, 9) do not decay. `#Token` (`token_term="entry"`, default) is the entry's
  own tokens; `"accumulated"` uses the accumulated hit tokens (+ own tokens) as the paper words it, which for
  fixed-size blocks makes the score grow with hits squared. `#AccuToken` / `AccuDocLen` likewise include the
  entry's own tokens.
- `Size` is the storage the entry occupies (`size_bytes` as reported; the policy replay passes a whole
  block even for a request's partial last block, since a partial chunk takes a block of the cache).
- `Age` is the time since the entry was last stored or hit (`age_basis="access"`, default: insight (iv),
  "recently used entries are more likely to be accessed again soon") or since it was first stored
  (`age_basis="stored"`, the paper's literal "how long the cache has stayed in storage").
- Prefix chains (optional `parent`): a chained-prefix block is only useful while its parent is cached, so
  only *leaves* (entries with no cached child) can be evicted -- children go before their parents, the
  way vLLM frees a request's blocks tail first. When an entry's last cached child is evicted the entry
  has been truncated to a shorter prefix; with `truncation_reset` (off by default) its #Hit / #Token restart as
  for a new entry, because the reuses it counted came through a continuation that is no longer cached
  (on the Mooncake trace, blocks idle for 15+ minutes are reused no more often the more hits they had:
  see docs/cache_manager.md for the measurement). The hit decay handles those stale hits directly and
  keeps more of what frequent blocks earn at small capacities, so the reset is off by default.
- Eviction order (`order`, set with `set_order`): `"lcs"` (default) scores as above; `"lru"` scores every
  entry 1 / (time since its last access), so the same exact choice evicts the least recently accessed leaf
  first. The adaptive policy (adaptive.py) switches a pool's index between the two; the statistics (hits,
  tokens, ...) are kept in both orders, so switching back to LCS needs no history.
"""

from __future__ import annotations

import numpy as np
from greenserve.common.cache_index.index_fields import IndexFields

# Ages below this are clamped so that a just-touched entry gets a large but finite score.
MIN_AGE_S = 1e-3
HIT_DECAYS = ("none", "online")
ORDERS = ("lcs", "lru")
# Online hit-decay time constant: the TAU_QUANTILE of the re-access gaps observed so far (histogram of
# log2(gap) in quarter-octave bins from 1 s to 2^32 s); used from TAU_MIN_GAPS gaps on.
TAU_QUANTILE = 0.9
TAU_MIN_GAPS = 256
_GAP_BINS_PER_OCTAVE = 4
_GAP_BINS = 32 * _GAP_BINS_PER_OCTAVE + 1
# Gaps are measured on a hash-sampled subset of ALL accessed keys, cached or not (spatial sampling as in
# SHARDS, Waldspurger et al. FAST'15), so tau does not depend on the cache size: 1 key in GAP_SAMPLE_MOD,
# last access kept for at most GAP_GHOST_MAX sampled keys (oldest dropped first).
GAP_SAMPLE_MOD = 16
GAP_GHOST_MAX = 1 << 15
_MIX = np.uint64(0x9E3779B97F4A7C15)


class LcsScores(IndexFields):
    """Score and tau computations of `CacheIndex` over its per-slot arrays."""

    # ----- eviction order --------------------------------------------------------------------------
    def set_order(self, order: str) -> None:
        """Score entries by LCS (`"lcs"`) or by recency alone (`"lru"`); the next choice rescans."""
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        if order != self.order:
            self.order = order
            self._pool_valid = False  # the candidate pool and its bounds were computed for the other score

    # ----- scores ----------------------------------------------------------------------------------
    def _numerator(self, slots: np.ndarray, *, reset: bool = False) -> np.ndarray:
        """Score numerators (Eq. 7 / 8, documents handled in `scores`) of slots; reset: as if hits were 0."""
        tokens = self.tokens[slots].astype(np.float64)
        hits = np.zeros(len(slots)) if reset else self.hits[slots].astype(np.float64)
        hit_tokens = np.zeros(len(slots)) if reset else self.hit_tokens[slots]
        if self.token_term == "entry":
            num = (hits + 1.0) * tokens
        else:
            num = (hits + 1.0) * (hit_tokens + tokens)
        turn = self.turn[slots]
        t = turn > 0
        if t.any():
            num = np.where(t, turn * (hit_tokens + tokens), num)
        return num

    def _truncated_value(self, s: int) -> float:
        """value (numerator / size) of slot s once its last cached child is gone."""
        if self.order == "lru":
            return 1.0
        if not self.truncation_reset or self.doc[s] >= 0:
            return float(self._value_of(np.array([s]))[0])
        # hits and hit tokens restart: every variant's numerator is then max(turn, 1) x tokens
        turn = int(self.turn[s])
        return float(max(turn, 1) * int(self.tokens[s])) / max(float(self.size_bytes[s]), 1.0)

    def _truncated_score(self, s: int, now_s: float) -> float:
        """Score at now_s of slot s once its last cached child is gone (`_truncated_value`, decayed)."""
        age = max(now_s - float(self._ref_times()[s]), MIN_AGE_S)
        v = np.array([self._truncated_value(s)])
        if self.tau_s == np.inf:
            return float(v[0]) / age
        base = self._base_value(np.array([s]), v)
        return float(self._score_parts(base, v - base, np.array([age]))[0])

    def _refresh_values(self, slots: np.ndarray) -> None:
        self.value[slots] = self._numerator(slots) / np.maximum(self.size_bytes[slots], 1.0)

    def _ref_times(self) -> np.ndarray:
        return self.last_access_s if self.age_basis == "access" or self.order == "lru" else self.stored_s

    def _value_of(self, slots: np.ndarray) -> np.ndarray:
        value = self.value[slots]
        if self.order == "lru":  # 1 / age; dead slots (value inf) stay inf
            return np.where(np.isfinite(value), 1.0, np.inf)
        if self._n_doc_entries:
            doc = self.doc[slots]
            m = doc >= 0
            if m.any():
                value = value.copy()
                d = doc[m]
                size = np.maximum(self.size_bytes[slots][m], 1.0)
                value[m] = (self._doc_hits[d] + 1.0) * (self._doc_accu[d] + self.tokens[slots][m]) / size
        return value

    def _base_value(self, slots: np.ndarray, value: np.ndarray) -> np.ndarray:
        """The part of `value` that does not come from hits (what decays is value - base): tokens / size
        for Eq. 7 entries; turn and document entries (Eq. 8, 9) do not decay (base = value). Under the LRU
        order nothing decays (the score is 1 / age)."""
        if self.order == "lru":
            return value
        plain = (self.turn[slots] == 0) & (self.doc[slots] < 0)
        base = self.tokens[slots] / np.maximum(self.size_bytes[slots], 1.0)
        return np.where(plain, np.minimum(base, value), value)

    def _score_parts(self, base: np.ndarray, extra: np.ndarray, age: np.ndarray) -> np.ndarray:
        """(base + extra x exp(-age / tau)) / age: non-increasing in age (base, extra >= 0)."""
        if self.tau_s == np.inf:
            return (base + extra) / age
        return (base + extra * np.exp(-age / self.tau_s)) / age

    def scores(self, now_s: float, slots: np.ndarray | None = None) -> np.ndarray:
        """LCS scores at `now_s` of all used slots (inf for dead ones) or of the given slots.

        With a hit decay the hit part of the numerator is weighted by exp(-Age / tau): a block's past hits
        predict reuse only while its conversation goes on (docs/cache_manager.md, measured table).
        """
        if slots is None:
            slots = np.arange(self._n)
        slots = np.asarray(slots, dtype=np.int64)
        age = np.subtract(now_s, self._ref_times()[slots])
        np.maximum(age, MIN_AGE_S, out=age)
        value = self._value_of(slots)
        if self.tau_s == np.inf:
            return np.divide(value, age, out=age)
        with np.errstate(invalid="ignore"):
            base = self._base_value(slots, value)
            out = self._score_parts(base, value - base, age)
        out[~np.isfinite(value)] = np.inf
        return out

    def observe_accesses(self, ids: np.ndarray, now_s: float) -> None:
        """Feed every access (hit or miss, cached or not) for the online tau; `ids` identify keys (key
        hashes, or the caller's stable slot numbers in keyless use). Keyed `store` / `hit` call it."""
        if self.hit_decay != "online":
            return
        ids = np.asarray(ids).astype(np.uint64)
        with np.errstate(over="ignore"):
            sampled = ids[((ids + np.uint64(1)) * _MIX >> np.uint64(32)) % np.uint64(GAP_SAMPLE_MOD) == 0]
        if not len(sampled):
            return
        ghost = self._gap_ghost
        gaps = []
        for i in sampled.tolist():
            last = ghost.pop(i, None)
            if last is not None and now_s > last:
                gaps.append(now_s - last)
            ghost[i] = now_s
        while len(ghost) > GAP_GHOST_MAX:
            del ghost[next(iter(ghost))]
        if gaps:
            gap = np.asarray(gaps)
            b = np.clip(np.ceil(np.log2(np.maximum(gap, 1.0)) * _GAP_BINS_PER_OCTAVE), 0, _GAP_BINS - 1)
            self._gap_hist += np.bincount(b.astype(np.int64), minlength=_GAP_BINS)

    def estimated_tau_s(self) -> float:
        """The TAU_QUANTILE of the re-access gaps seen so far (upper edge of its bin), inf before
        TAU_MIN_GAPS gaps; the online hit-decay time constant."""
        total = int(self._gap_hist.sum())
        if total < TAU_MIN_GAPS:
            return np.inf
        k = int(np.searchsorted(np.cumsum(self._gap_hist), TAU_QUANTILE * total))
        return float(2.0 ** (k / _GAP_BINS_PER_OCTAVE))
