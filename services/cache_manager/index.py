"""Cache index: what each cached KV entry holds and how much carbon keeping it saves (GreenCache LCS).

One `CacheIndex` per pool. Entries live in parallel numpy arrays (struct of arrays, one slot per entry),
so memory per entry is small and fixed and scores are computed in vectorised passes:

    Score = (#Token x #Hit) / (Size x Age)              GreenCache Eq. 7 (default)
    Score = (CurTurn x #AccuToken) / (Size x Age)       Eq. 8, entries of a multi-turn conversation
    Score = (#Hit x AccuDocLen) / (Size x Age)          Eq. 9, entries of a document (#Hit and AccuDocLen
                                                        are per document: reuses across questions)

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

Eviction choice (exact, incremental). Each score is `(base + extra x exp(-age / tau)) / age` where `base`
and `extra` change only on an access, tau only in a full pass, and `age = now - t_ref`: a non-increasing
function of age between full passes; the ranking changes with time, so a heap keyed at insertion would go stale. A
*refresh* scores every eligible entry in one vectorised pass and keeps a pool of the M lowest by their
score at `T0 + H` (H a short horizon) and the bound `theta`, the lowest such score outside the pool. Any
entry outside the pool that has not been touched since T0 still scores >= theta at any time up to T0 + H
(scores only fall with age). Entries touched, stored or made evictable since T0 are kept in a "dirty"
list. A choice scores only pool + dirty at `now`; a victim whose score is <= theta is the exact minimum,
otherwise (or after T0 + H) the index refreshes and chooses from the full pass. So the answer is always
the exact lowest-score leaf, and the usual cost is O(pool + dirty) instead of O(entries).

Keys. Entry keys are `HEX[@suffix]` strings (LMCache objects: `chunk_hash_hex@model@kv_rank@salt[@group]`).
The hex part (<= 64 hex digits) is stored as raw bytes in a fixed 32-byte field and the suffix as an index
into an interned table; other keys are kept as Python strings on the side. The key -> slot map is an
open-addressing table of int32 slots keyed by a 64-bit blake2b hash of the key (load <= 1/2).
"""

from __future__ import annotations

import hashlib
import heapq
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

AGE_BASES = ("access", "stored")
TOKEN_TERMS = ("entry", "accumulated")
# Ages below this are clamped so that a just-touched entry gets a large but finite score.
MIN_AGE_S = 1e-3
NO_GROUP = 0xFFFF
_EMPTY, _TOMB = -1, -2
_KEY_BYTES = 32
_LONG_KEY = 255  # key_len marker: the key is kept in `_long_keys`
POOL_SIZE = 1024  # entries kept in the candidate pool after a refresh (adapted up to MAX_POOL_SIZE)
MAX_POOL_SIZE = 8192
NEAR_SIZE = 8192  # entries past the pool whose scores give the exact per-Delta bounds
DIRTY_MAX = 1 << 16  # touched entries tracked between refreshes; more forces a refresh
THETA_STEPS = 8  # bounds kept per refresh, for Delta = H/8, 2H/8, ..., H after it
HIT_DECAYS = ("none", "online")
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


def fsync_dir(path: Path) -> None:
    """Make a rename in folder `path` durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def key_hash(entry_key: str) -> int:
    """A stable 64-bit id for an entry key; never 0 (0 marks an empty slot)."""
    value = int.from_bytes(hashlib.blake2b(entry_key.encode(), digest_size=8).digest(), "little")
    return value or 1


def _split_key(entry_key: str) -> tuple[bytes, str] | None:
    """(raw hash bytes, suffix incl. '@') when the key's head is <= 64 lowercase hex digits, else None."""
    head, sep, tail = entry_key.partition("@")
    if not head or len(head) % 2 or len(head) > 2 * _KEY_BYTES:
        return None
    try:
        raw = bytes.fromhex(head)
    except ValueError:
        return None
    if raw.hex() != head:
        return None
    return raw, sep + tail


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


class CacheIndex:
    """Index of cache entries of one pool with LCS scores, prefix chains and an exact fast eviction choice.

    Per slot: key hash u8, key bytes 32 + length u1 + suffix id u2, tokens u4, hits u4, hit tokens f8,
    size f8, stored time f8, last access f8, turn u4, document i4, TTL group u2, parent i4, cached
    children u4, score numerator/size `value` f8; plus 8 bytes of key table (int32 at load <= 1/2).
    `array_bytes_per_slot()` gives the fixed part; `greenserve bench cache-eviction` measures the total.

    Keyless use (`store_slots`, `hit_slots`, ...): the caller picks the slots (e.g. dense block ids in the
    policy replay); keyed use (`store`, `hit`, `remove`, `store_many`) allocates slots through the key table.
    """

    _ARRAYS = ("key_hash", "key_raw", "key_len", "key_meta", "tokens", "hits", "hit_tokens", "size_bytes",
               "stored_s", "last_access_s", "turn", "doc", "group", "parent", "nchild", "value")

    def __init__(self, *, age_basis: str = "access", token_term: str = "entry", truncation_reset: bool = False,
                 hit_decay: str | float = "online", initial_capacity: int = 1024) -> None:
        if age_basis not in AGE_BASES:
            raise ValueError(f"age_basis must be one of {AGE_BASES}, got {age_basis!r}")
        if token_term not in TOKEN_TERMS:
            raise ValueError(f"token_term must be one of {TOKEN_TERMS}, got {token_term!r}")
        self.age_basis = age_basis
        self.token_term = token_term
        self.truncation_reset = truncation_reset
        if isinstance(hit_decay, str):
            if hit_decay not in HIT_DECAYS:
                raise ValueError(f"hit_decay must be one of {HIT_DECAYS} or a time constant in s, got {hit_decay!r}")
        elif not hit_decay > 0:
            raise ValueError(f"hit_decay time constant must be > 0 s, got {hit_decay!r}")
        self.hit_decay = hit_decay
        # Time constant of the hit decay in force (changes only in a full pass, see `_refresh`).
        self.tau_s = float(hit_decay) if not isinstance(hit_decay, str) else np.inf
        self._gap_hist = np.zeros(_GAP_BINS, dtype=np.int64)  # re-access gaps seen (online tau)
        self._gap_ghost: dict[int, float] = {}  # sampled key id -> last access time
        self._cap = 0
        self._n = 0  # slots used (high-water mark)
        self._live = 0
        self._free: list[int] = []
        self._metas: list[str] = [""]
        self._meta_id: dict[str, int] = {"": 0}
        self._long_keys: dict[int, str] = {}
        self.group_names: list[str] = []  # TTL group id -> name (conversation / document / subtree)
        self._group_of: dict[str, int] = {}
        self._doc_slot_of: dict[str, int] = {}
        self._doc_hits = np.zeros(16, dtype=np.float64)
        self._doc_accu = np.zeros(16, dtype=np.float64)
        self._n_doc_entries = 0
        self._bytes_live = 0
        self._table = np.full(16, _EMPTY, dtype=np.int32)
        self._table_used = 0  # live + tombstones
        self._alloc(max(16, initial_capacity))
        self._table_resize(max(16, initial_capacity))
        # Candidate pool of the incremental choice (see module doc).
        self._pool = np.empty(0, dtype=np.int64)
        self._pool_t0 = 0.0
        self._pool_h = 1.0
        self._pool_hcur = 1.0
        self._pool_theta = np.full(THETA_STEPS, np.inf)
        self._pool_size = POOL_SIZE
        self._pool_uses = 0
        self._pool_valid = False
        self._dirty = np.empty(DIRTY_MAX, dtype=np.int64)
        self._dirty_n = 0
        self.refreshes = 0  # full passes done (for the benchmark)
        # Id of the last access-journal event these arrays include (the cache-manager's checkpoints);
        # saved with the snapshot, 0 when unused.
        self.journal_id = 0

    # ----- storage -------------------------------------------------------------------------------
    def _alloc(self, capacity: int) -> None:
        def grow(name: str, dtype: type, fill: float = 0, width: int = 0) -> None:
            shape = (capacity, width) if width else capacity
            new = np.full(shape, fill, dtype=dtype)
            old = getattr(self, name, None)
            if old is not None:
                new[: len(old)] = old
            setattr(self, name, new)

        grow("key_hash", np.uint64)
        grow("key_raw", np.uint8, 0, _KEY_BYTES)
        grow("key_len", np.uint8)
        grow("key_meta", np.uint16)
        grow("tokens", np.uint32)
        grow("hits", np.uint32)
        grow("hit_tokens", np.float64)
        grow("size_bytes", np.float64)
        grow("stored_s", np.float64)
        grow("last_access_s", np.float64)
        grow("turn", np.uint32)
        grow("doc", np.int32, -1)
        grow("group", np.uint16, NO_GROUP)
        grow("parent", np.int32, -1)
        grow("nchild", np.uint32)
        grow("value", np.float64, np.inf)  # +inf for dead slots so they never win
        self._scratch = np.zeros(capacity, dtype=np.bool_)
        self._cap = capacity

    def ensure_capacity(self, capacity: int) -> None:
        """Make slots 0..capacity-1 addressable (keyless use)."""
        if capacity > self._cap:
            self._alloc(capacity)
        self._n = max(self._n, capacity)

    def __len__(self) -> int:
        return self._live

    @property
    def live(self) -> np.ndarray:
        """Live flag per slot (view of the first used slots)."""
        return self.key_hash[: self._n] != 0

    @property
    def bytes_in_use(self) -> int:
        """Sum of the sizes of live entries, bytes."""
        return self._bytes_live

    # ----- key table (open addressing, linear probing) -------------------------------------------
    def _table_resize(self, live_capacity: int) -> None:
        size = 16
        while size < 2 * live_capacity:
            size *= 2
        self._table = np.full(size, _EMPTY, dtype=np.int32)
        self._table_used = 0
        slots = np.flatnonzero(self.key_hash[: self._n] != 0)
        if len(slots):
            self._table_insert_many(slots)

    def _table_insert_many(self, slots: np.ndarray) -> None:
        """Insert slots (whose keys are absent) into the table, vectorised over probe rounds."""
        mask = len(self._table) - 1
        pos = (self.key_hash[slots] & np.uint64(mask)).astype(np.int64)
        pending = np.asarray(slots, dtype=np.int64)
        while len(pending):
            free = self._table[pos] < 0
            # Among pending entries aiming at the same free cell, the first one takes it.
            cand = np.flatnonzero(free)
            _, first = np.unique(pos[cand], return_index=True)
            take = cand[first]
            self._table[pos[take]] = pending[take]
            keep = np.ones(len(pending), dtype=np.bool_)
            keep[take] = False
            pending, pos = pending[keep], (pos[keep] + 1) & mask
        self._table_used += len(slots)

    def _find(self, h: int) -> int:
        """Slot of key hash h, or -1."""
        table = self._table
        mask = len(table) - 1
        i = h & mask
        key_hash = self.key_hash
        while True:
            v = int(table[i])
            if v == _EMPTY:
                return -1
            if v >= 0 and int(key_hash[v]) == h:
                return v
            i = (i + 1) & mask

    def _table_add(self, h: int, s: int) -> None:
        if 2 * (self._table_used + 1) > len(self._table):
            self.key_hash[s] = h
            self._table_resize(max(self._live + 1, 16))  # re-inserts s as well (key_hash set)
            return
        table = self._table
        mask = len(table) - 1
        i = h & mask
        while int(table[i]) >= 0:
            i = (i + 1) & mask
        if table[i] == _EMPTY:
            self._table_used += 1
        table[i] = s

    def slot(self, entry_key: str) -> int | None:
        """Slot of a key, None when absent."""
        s = self._find(key_hash(entry_key))
        return None if s < 0 else s

    def __contains__(self, entry_key: str) -> bool:
        return self._find(key_hash(entry_key)) >= 0

    def _set_key(self, s: int, entry_key: str) -> None:
        split = _split_key(entry_key)
        if split is None:
            self.key_len[s] = _LONG_KEY
            self._long_keys[s] = entry_key
            return
        raw, suffix = split
        meta = self._meta_id.get(suffix)
        if meta is None:
            if len(self._metas) >= 0xFFFF:
                self.key_len[s] = _LONG_KEY
                self._long_keys[s] = entry_key
                return
            meta = self._meta_id[suffix] = len(self._metas)
            self._metas.append(suffix)
        self.key_raw[s, : len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        self.key_len[s] = len(raw)
        self.key_meta[s] = meta

    def key_of(self, s: int) -> str:
        """The entry key stored in slot s."""
        if self.key_hash[s] == 0:
            raise KeyError(f"slot {s} is empty")
        n = int(self.key_len[s])
        if n == _LONG_KEY:
            return self._long_keys[s]
        return self.key_raw[s, :n].tobytes().hex() + self._metas[int(self.key_meta[s])]

    def _new_slot(self) -> int:
        if self._free:
            return self._free.pop()
        if self._n == self._cap:
            self._alloc(self._cap * 2)
        self._n += 1
        return self._n - 1

    def group_id(self, name: str) -> int | None:
        """Small id of a TTL group name (interned, persisted with the index); None past 65535 names."""
        g = self._group_of.get(name)
        if g is None:
            if len(self.group_names) >= NO_GROUP:
                return None
            g = self._group_of[name] = len(self.group_names)
            self.group_names.append(name)
        return g

    def _doc_slot(self, document_id: str) -> int:
        d = self._doc_slot_of.get(document_id)
        if d is None:
            d = len(self._doc_slot_of)
            self._doc_slot_of[document_id] = d
            if d >= len(self._doc_hits):
                self._doc_hits = np.concatenate([self._doc_hits, np.zeros(len(self._doc_hits))])
                self._doc_accu = np.concatenate([self._doc_accu, np.zeros(len(self._doc_accu))])
        return d

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
        return self.last_access_s if self.age_basis == "access" else self.stored_s

    def _value_of(self, slots: np.ndarray) -> np.ndarray:
        value = self.value[slots]
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
        for Eq. 7 entries; turn and document entries (Eq. 8, 9) do not decay (base = value)."""
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

    # ----- events: vectorised core (slots chosen by the caller or by the key table) --------------
    def store_slots(self, slots: np.ndarray, *, tokens: np.ndarray, size_bytes: np.ndarray, now_s: float,
                    parents: np.ndarray | None = None, group: int | None = None, turn: int = 0) -> None:
        """Record stores of new entries in free slots (keyless use: the caller owns slot numbers).

        `parents[i]` is the slot of entry i's prefix parent (-1: none); a parent may be an earlier entry
        of the same call. The caller guarantees the slots are free and < capacity (`ensure_capacity`).
        """
        slots = np.asarray(slots, dtype=np.int64)
        if not len(slots):
            return
        self.key_hash[slots] = 1  # keyless entries only need a non-zero "live" mark
        self._init_slots(slots, tokens, size_bytes, now_s, parents, group, turn)

    def _init_slots(self, slots, tokens, size_bytes, now_s, parents, group, turn) -> None:
        self.tokens[slots] = tokens
        self.hits[slots] = 0
        self.hit_tokens[slots] = 0.0
        self.size_bytes[slots] = size_bytes
        self.stored_s[slots] = now_s
        self.last_access_s[slots] = now_s
        self.turn[slots] = turn
        self.doc[slots] = -1
        self.group[slots] = NO_GROUP if group is None else group
        self.nchild[slots] = 0
        if parents is None:
            self.parent[slots] = -1
        else:
            parents = np.asarray(parents, dtype=np.int64)
            self.parent[slots] = parents
            linked = parents[parents >= 0]
            if len(linked):
                np.add.at(self.nchild, linked, 1)
        self._bytes_live += int(np.sum(size_bytes))
        self._live += len(slots)
        self._refresh_values(slots)
        self._mark(slots)

    def hit_slots(self, slots: np.ndarray, *, hit_tokens: np.ndarray, now_s: float, turn: int = 0) -> None:
        """Record hits on live slots (distinct) at `now_s`."""
        slots = np.asarray(slots, dtype=np.int64)
        if not len(slots):
            return
        self.hits[slots] += 1
        self.hit_tokens[slots] += hit_tokens
        self.last_access_s[slots] = now_s
        if turn:
            self.turn[slots] = np.maximum(self.turn[slots], turn)
        self._refresh_values(slots)
        self._mark(slots)

    def touch_slots(self, slots: np.ndarray, now_s: float) -> None:
        """Record an access that is not a hit (e.g. a block after a prefix miss): only its age restarts."""
        slots = np.asarray(slots, dtype=np.int64)
        if len(slots):
            self.last_access_s[slots] = now_s
            self._mark(slots)

    def remove_slots(self, slots: np.ndarray) -> None:
        """Forget live entries (evicted); parents left without cached children become evictable leaves.

        Keyless use (the policy replay, expiry sweeps); keyed entries go through `remove` / `remove_slot`,
        which also drop the key from the key table.
        """
        slots = np.asarray(slots, dtype=np.int64)
        if not len(slots):
            return
        self._bytes_live -= int(self.size_bytes[slots].sum())
        self._live -= len(slots)
        if self._n_doc_entries:
            self._n_doc_entries -= int(np.count_nonzero(self.doc[slots] >= 0))
        parents = self.parent[slots].astype(np.int64)
        self.key_hash[slots] = 0
        self.value[slots] = np.inf
        self.size_bytes[slots] = 0.0
        self.parent[slots] = -1
        linked = parents >= 0
        parents = parents[linked]
        if len(parents):
            np.subtract.at(self.nchild, parents, 1)
        # Children of removed internal entries outside this batch are detached (rare: outside
        # evictions or expiry; LCS evicts leaves only).
        if np.any(self.nchild[slots] > 0):
            self._scratch[slots] = True
            par = self.parent[: self._n]
            orphans = np.flatnonzero((par >= 0) & self._scratch[np.maximum(par, 0)])
            self._scratch[slots] = False
            self.parent[orphans] = -1
        self.nchild[slots] = 0
        if len(parents):
            parents = parents[(self.key_hash[parents] != 0) & (self.nchild[parents] == 0)]
            if len(parents):
                if self.truncation_reset:
                    self.hits[parents] = 0
                    self.hit_tokens[parents] = 0.0
                    self._refresh_values(parents)
                self._mark(parents)

    # ----- events: keyed API ---------------------------------------------------------------------
    def store(self, entry_key: str, *, tokens: int, size_bytes: int, now_s: float, turn: int = 0,
              document_id: str = "", group: int | None = None, parent_key: str | None = None) -> int:
        """Record that an entry was stored (or re-stored: its age restarts); returns its slot."""
        h = key_hash(entry_key)
        self.observe_accesses(np.array([h], dtype=np.uint64), now_s)
        s = self._find(h)
        if s >= 0:
            self._bytes_live += int(size_bytes) - int(self.size_bytes[s])
            self.tokens[s] = tokens
            self.size_bytes[s] = float(size_bytes)
            self.last_access_s[s] = now_s
            if turn:
                self.turn[s] = max(int(self.turn[s]), int(turn))
            if group is not None:
                self.group[s] = group
        else:
            s = self._new_slot()
            ps = -1
            if parent_key is not None:
                ps = self._find(key_hash(parent_key))
            self.key_hash[s] = h
            self._table_add(h, s)
            self._set_key(s, entry_key)
            arr = np.array([s], dtype=np.int64)
            self._init_slots(arr, tokens, float(size_bytes), now_s, np.array([ps]), group, int(turn))
        if document_id and self.doc[s] < 0:
            self.doc[s] = self._doc_slot(document_id)
            self._n_doc_entries += 1
        self._refresh_values(np.array([s]))
        self._mark(s)
        return s

    def store_many(self, keys: list[str], *, tokens: np.ndarray, size_bytes: np.ndarray, now_s: np.ndarray | float,
                   hits: np.ndarray | None = None) -> np.ndarray:
        """Bulk insert of new keys (absent from the index; e.g. loading a listing); returns their slots."""
        n = len(keys)
        start = self._n
        while self._n + n > self._cap:
            self._alloc(self._cap * 2)
        slots = np.arange(start, start + n, dtype=np.int64)
        self._n += n
        self.key_hash[slots] = np.fromiter((key_hash(k) for k in keys), dtype=np.uint64, count=n)
        for s, k in zip(range(start, start + n), keys):
            self._set_key(s, k)
        if 2 * (self._table_used + n) > len(self._table):
            self._table_resize(self._live + n)
        else:
            self._table_insert_many(slots)
        self._init_slots(slots, tokens, np.asarray(size_bytes, dtype=np.float64), 0.0, None, None, 0)
        self.stored_s[slots] = now_s
        self.last_access_s[slots] = now_s
        if hits is not None:
            self.hits[slots] = hits
            self._refresh_values(slots)
        return slots

    def hit(self, entry_key: str, *, hit_tokens: int, now_s: float, turn: int = 0, document_id: str = "") -> bool:
        """Record a hit; returns False when the key is not indexed (the hit is then ignored, but its
        re-access gap still feeds the online tau)."""
        h = key_hash(entry_key)
        self.observe_accesses(np.array([h], dtype=np.uint64), now_s)
        s = self._find(h)
        if s < 0:
            return False
        self.hit_slots(np.array([s]), hit_tokens=np.array([float(hit_tokens)]), now_s=now_s, turn=turn)
        if document_id and self.doc[s] >= 0:
            d = int(self.doc[s])
            self._doc_hits[d] += 1
            self._doc_accu[d] += hit_tokens
        return True

    def remove(self, entry_key: str) -> bool:
        """Forget an entry (evicted by the cache itself or by us); False when absent."""
        h = key_hash(entry_key)
        s = self._find(h)
        if s < 0:
            return False
        self.remove_slot(s)
        return True

    def remove_slot(self, s: int) -> None:
        """Forget the entry in slot s (keyed or keyless)."""
        h = int(self.key_hash[s])
        if h == 0:
            return
        if self.key_len[s] == _LONG_KEY:
            self._long_keys.pop(s, None)
        self.key_len[s] = 0
        self.remove_slots(np.array([s], dtype=np.int64))
        if self._table_drop(h, s):
            self._free.append(s)

    def _table_drop(self, h: int, s: int) -> bool:
        """Drop slot s from the table (probing from hash h); False when absent (keyless slots)."""
        table = self._table
        mask = len(table) - 1
        i = h & mask
        while True:
            v = int(table[i])
            if v == _EMPTY:
                return False
            if v == s:
                table[i] = _TOMB
                return True
            i = (i + 1) & mask

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
            order = order[np.argsort(sc[order], kind="stable")]
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
        fast_truncate = self.truncation_reset and not self._n_doc_entries and type(self) is CacheIndex
        fast_keep = not self.truncation_reset and not self._n_doc_entries and type(self) is CacheIndex
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
        """The next `limit` entries to evict, in eviction order (lowest-score leaves first)."""
        slots = self.choose_victims(limit, now_s)
        sc = self.scores(now_s, slots) if len(slots) else np.empty(0)
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

    # ----- memory and persistence ----------------------------------------------------------------
    def array_bytes_per_slot(self) -> int:
        """Bytes of numpy storage per slot (fixed by the dtypes), key table included (load 1/2)."""
        per = sum(getattr(self, name).itemsize * (getattr(self, name).shape[1] if getattr(self, name).ndim == 2 else 1)
                  for name in self._ARRAYS)
        return int(per + 2 * self._table.itemsize + 1)  # + scratch flag

    def save(self, path: Path) -> None:
        """Write a snapshot (numpy .npz) that `load` restores exactly, atomically: into a temporary file of
        its own (unique name in the same folder, so concurrent savers never share one), flushed to disk
        (fsync), then renamed over `path` and the folder synced. A crash leaves the old file or the new
        one, never a torn one. The caller must keep the index unchanged while it saves (hold its lock)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        n = self._n
        docs = sorted(self._doc_slot_of, key=self._doc_slot_of.__getitem__)
        long_slots = np.array(sorted(self._long_keys), dtype=np.int64)
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as fh:
                self._savez(fh, n, docs, long_slots)
                fh.flush()
                os.fsync(fh.fileno())
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(path.parent)

    def _savez(self, fh, n: int, docs: list[str], long_slots: np.ndarray) -> None:
        np.savez(
            fh, **{name: getattr(self, name)[:n] for name in self._ARRAYS},
            metas=np.array(self._metas, dtype=str),
            group_names=np.array(self.group_names, dtype=str),
            long_slots=long_slots,
            long_keys=np.array([self._long_keys[int(s)] for s in long_slots], dtype=str),
            docs=np.array(docs, dtype=str),
            doc_hits=self._doc_hits[: len(docs)], doc_accu=self._doc_accu[: len(docs)],
            meta=np.array([self.age_basis, self.token_term, str(int(self.truncation_reset)), str(self.hit_decay)]),
            gap_hist=self._gap_hist, tau_s=np.array([self.tau_s]),
            journal_id=np.array([self.journal_id], dtype=np.int64),
        )

    @classmethod
    def load(cls, path: Path) -> CacheIndex:
        """Restore a snapshot written by `save`."""
        with np.load(path, allow_pickle=False) as data:
            meta = [str(x) for x in data["meta"]]
            n = len(data["key_hash"])
            decay: str | float = "none"
            if len(meta) > 3:
                decay = meta[3] if meta[3] in HIT_DECAYS else float(meta[3])
            index = cls(age_basis=meta[0], token_term=meta[1], truncation_reset=meta[2] == "1",
                        hit_decay=decay, initial_capacity=max(16, n))
            if "journal_id" in data:
                index.journal_id = int(data["journal_id"][0])
            if "gap_hist" in data:
                index._gap_hist[:] = data["gap_hist"]
                index.tau_s = float(data["tau_s"][0])
            for name in cls._ARRAYS:
                getattr(index, name)[:n] = data[name]
            index._metas = [str(m) for m in data["metas"]]
            index._meta_id = {m: i for i, m in enumerate(index._metas)}
            index.group_names = [str(g) for g in data["group_names"]]
            index._group_of = {g: i for i, g in enumerate(index.group_names)}
            index._long_keys = {int(s): str(k) for s, k in zip(data["long_slots"], data["long_keys"])}
            docs = [str(d) for d in data["docs"]]
            index._doc_slot_of = {d: i for i, d in enumerate(docs)}
            if docs:
                index._doc_hits = np.concatenate([data["doc_hits"], np.zeros(16)])
                index._doc_accu = np.concatenate([data["doc_accu"], np.zeros(16)])
        index._n = n
        live = index.key_hash[:n] != 0
        index._live = int(live.sum())
        index._bytes_live = int(index.size_bytes[:n][live].sum())
        index._n_doc_entries = int(np.count_nonzero(live & (index.doc[:n] >= 0)))
        index._free = [int(s) for s in np.flatnonzero(~live)[::-1]]
        index._table_resize(max(16, n))
        return index
