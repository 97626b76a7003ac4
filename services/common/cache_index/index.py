"""Cache index: what each cached KV entry holds and how much carbon keeping it saves (GreenCache LCS).

One `CacheIndex` per pool. Entries live in parallel numpy arrays (struct of arrays, one slot per entry),
so memory per entry is small and fixed and scores are computed in vectorised passes:

    Score = (#Token x #Hit) / (Size x Age)              GreenCache Eq. 7 (default)
    Score = (CurTurn x #AccuToken) / (Size x Age)       Eq. 8, entries of a multi-turn conversation
    Score = (#Hit x AccuDocLen) / (Size x Age)          Eq. 9, entries of a document (#Hit and AccuDocLen
                                                        are per document: reuses across questions)

The parts live in modules of their own, mixed into `CacheIndex`: `lcs_scores` (the score definitions and
the online hit decay), `eviction_choice` (the exact incremental choice of victims), `index_keys` (key
storage and the key -> slot table) and `index_snapshot` (save / load). This module keeps the storage and
the events (store, hit, touch, remove) and re-exports the names callers import from it.
"""

from __future__ import annotations

import numpy as np
from greenserve.common.cache_index.eviction_choice import (
    DIRTY_MAX,
    MAX_POOL_SIZE,
    NEAR_SIZE,
    POOL_SIZE,
    THETA_STEPS,
    EntryView,
    EvictionChoice,
)
from greenserve.common.cache_index.index_keys import (
    _EMPTY,
    _KEY_BYTES,
    _LONG_KEY,
    KeyTable,
    key_hash,
)
from greenserve.common.cache_index.index_snapshot import IndexSnapshot, fsync_dir
from greenserve.common.cache_index.lcs_scores import (
    _GAP_BINS,
    GAP_GHOST_MAX,
    GAP_SAMPLE_MOD,
    HIT_DECAYS,
    MIN_AGE_S,
    TAU_MIN_GAPS,
    TAU_QUANTILE,
    LcsScores,
)

__all__ = [
    "AGE_BASES", "DIRTY_MAX", "DOC_TABLE_MIN", "GAP_GHOST_MAX", "GAP_SAMPLE_MOD", "HIT_DECAYS", "MAX_POOL_SIZE", "MIN_AGE_S",
    "NEAR_SIZE", "NO_GROUP", "POOL_SIZE", "TAU_MIN_GAPS", "TAU_QUANTILE", "THETA_STEPS", "TOKEN_TERMS",
    "CacheIndex", "EntryView", "fsync_dir", "key_hash",
]

AGE_BASES = ("access", "stored")
TOKEN_TERMS = ("entry", "accumulated")
NO_GROUP = 0xFFFF
#: Document ids the table holds before it forgets those no indexed entry names (then at most twice the ones kept):
#: a document's reuse statistics are kept while one of its entries is indexed, and memory stays bounded by them.
DOC_TABLE_MIN = 4096


class CacheIndex(KeyTable, LcsScores, EvictionChoice, IndexSnapshot):
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
        self.order = "lcs"  # eviction order: "lcs" or "lru" (`set_order`, lcs_scores.py)
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
        self._doc_limit = DOC_TABLE_MIN  # size of the document table that triggers _compact_docs
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
            new: np.ndarray = np.full(shape, fill, dtype=dtype)
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

    def _scores_inlinable(self) -> bool:
        """Whether eviction_choice may inline this class's scores: a subclass may score differently."""
        return type(self) is CacheIndex

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
            if len(self._doc_slot_of) >= self._doc_limit:
                self._compact_docs()
            d = len(self._doc_slot_of)
            self._doc_slot_of[document_id] = d
            if d >= len(self._doc_hits):
                self._doc_hits = np.concatenate([self._doc_hits, np.zeros(len(self._doc_hits))])
                self._doc_accu = np.concatenate([self._doc_accu, np.zeros(len(self._doc_accu))])
        return d

    def _compact_docs(self) -> None:
        """Forget the documents no indexed entry names (their entries were evicted or removed) and renumber the
        others; the next compaction waits until the table has doubled (amortised O(1) per new document)."""
        n_docs = len(self._doc_slot_of)
        doc = self.doc[: self._n]
        used = np.zeros(n_docs, dtype=np.bool_)
        used[doc[(self.key_hash[: self._n] != 0) & (doc >= 0)]] = True
        kept = np.flatnonzero(used)
        remap = np.full(n_docs, -1, dtype=np.int32)
        remap[kept] = np.arange(len(kept), dtype=np.int32)
        doc[:] = np.where(doc >= 0, remap[np.maximum(doc, 0)], -1)  # free slots' stale ids too
        names = sorted(self._doc_slot_of, key=self._doc_slot_of.__getitem__)
        self._doc_slot_of = {names[int(d)]: i for i, d in enumerate(kept)}
        room = max(16, len(kept))
        self._doc_hits = np.concatenate([self._doc_hits[kept], np.zeros(room)])
        self._doc_accu = np.concatenate([self._doc_accu[kept], np.zeros(room)])
        self._doc_limit = max(DOC_TABLE_MIN, 2 * len(kept))

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

    def _init_slots(self, slots: np.ndarray, tokens: np.ndarray | int, size_bytes: np.ndarray | float, now_s: float,
                    parents: np.ndarray | None, group: int | None, turn: int) -> None:
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
