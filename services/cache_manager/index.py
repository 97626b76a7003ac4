"""Cache index: what each cached KV entry holds and how much carbon keeping it saves (GreenCache LCS).

One `CacheIndex` per pool. Entries live in parallel numpy arrays (struct of arrays, one slot per entry)
so that memory per entry is small and fixed and the eviction choice is one vectorised pass:

    Score = (#Token x #Hit) / (Size x Age)              GreenCache Eq. 7 (default)
    Score = (CurTurn x #AccuToken) / (Size x Age)       Eq. 8, entries of a multi-turn conversation
    Score = (#Hit x AccuDocLen) / (Size x Age)          Eq. 9, entries of a document (#Hit and AccuDocLen
                                                        are per document: reuses across questions)

`#Token` / `#AccuToken` is the accumulated number of hit tokens of the entry. `Age` is the time since the
entry was last stored or hit (`age_basis="access"`, default) or since it was first stored
(`age_basis="stored"`, the paper's literal "how long the cache has stayed in storage"). The paper's
insight (iv) ("recently used entries are more likely to be accessed again soon") is what the access basis
captures; the policy benchmark (`greenserve bench cache-policy`) measures both, see docs/cache_manager.md.
`#Token` of Eq. 7 (`token_term`): "entry" (default) uses the entry's own token count, so the score is
tokens x (hits + 1) / (size x age); "accumulated" uses the accumulated hit tokens as the paper words it.
For fixed-size blocks (the Mooncake trace: 512-token blocks) the accumulated form is 512 x hits, so the
score grows with hits squared; on the first 3,000 Mooncake requests it lost to LRU at 10 % capacity
(0.123 vs 0.130 token hit rate) while the entry form beat LRU at 5-30 % (see docs/cache_manager.md).
A freshly stored entry has no hit yet; `#Hit` and `#Token` are counted from 1 store (hits + 1, hit tokens +
tokens) so that a new entry is not scored zero and evicted before it had any chance to be reused.

Why ages do not need a sorted structure: each score is `value / age` where `value` only changes on an
access (kept up to date per event, O(1)) and age is `now - t_ref`. Ranking by score therefore changes with
time, so a heap keyed at insertion would go stale. Instead the eviction choice computes all scores at
`now` in one vectorised pass (three float64 array operations and an argmin/argpartition), which is about
2-4 ms for 1,000,000 entries (`greenserve bench cache-eviction`); for larger indexes `max_scan_entries`
bounds the pass to a uniform random sample of slots (Redis-style sampled eviction), which keeps the cost
fixed whatever the size.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VARIANT_GENERIC = 0  # Eq. 7
VARIANT_TURN = 1  # Eq. 8
VARIANT_DOCUMENT = 2  # Eq. 9

AGE_BASES = ("access", "stored")
TOKEN_TERMS = ("entry", "accumulated")
# Ages below this are clamped so that a just-touched entry gets a large but finite score.
MIN_AGE_S = 1e-3
_NO_GROUP = 0xFFFF


def key_hash(entry_key: str) -> int:
    """A stable 64-bit id for an entry key (hex chained-prefix hash or any string); never 0."""
    value = int.from_bytes(hashlib.blake2b(entry_key.encode(), digest_size=8).digest(), "little")
    return value or 1


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
    """Index of cache entries of one pool with LCS scores; bounded memory per entry.

    Per entry (slot): key hash u8, tokens u4, hits u4, hit tokens f8, size f8, stored time f8, last access
    f8, turn u4, document slot i4, TTL group u2, live flag u1, plus the cached score numerator/size `value`
    f8 and the key string for the adapter (kept in a Python list; LMCache evicts by key). The key -> slot
    map is a dict of int -> int. `bytes_per_entry()` reports the measured total.
    """

    def __init__(self, *, age_basis: str = "access", token_term: str = "entry", initial_capacity: int = 1024,
                 max_scan_entries: int | None = None, seed: int = 0) -> None:
        if age_basis not in AGE_BASES:
            raise ValueError(f"age_basis must be one of {AGE_BASES}, got {age_basis!r}")
        if token_term not in TOKEN_TERMS:
            raise ValueError(f"token_term must be one of {TOKEN_TERMS}, got {token_term!r}")
        self.age_basis = age_basis
        self.token_term = token_term
        self.max_scan_entries = max_scan_entries
        self._rng = np.random.default_rng(seed)
        self._cap = 0
        self._n = 0  # slots used (high-water mark); dead slots are recycled through _free
        self._free: list[int] = []
        self._slot_of: dict[int, int] = {}
        self._keys: list[str | None] = []
        self._doc_slot_of: dict[str, int] = {}
        self._doc_hits = np.zeros(16, dtype=np.float64)
        self._doc_accu = np.zeros(16, dtype=np.float64)
        self._n_doc_entries = 0
        self._bytes_live = 0
        self._alloc(max(16, initial_capacity))

    # ----- storage -------------------------------------------------------------------------------
    def _alloc(self, capacity: int) -> None:
        def grow(arr: np.ndarray | None, dtype: np.dtype, fill: float | int = 0) -> np.ndarray:
            new = np.full(capacity, fill, dtype=dtype)
            if arr is not None:
                new[: len(arr)] = arr
            return new

        get = lambda name: getattr(self, name, None)  # noqa: E731
        self.key_hash = grow(get("key_hash"), np.uint64)
        self.tokens = grow(get("tokens"), np.uint32)
        self.hits = grow(get("hits"), np.uint32)
        self.hit_tokens = grow(get("hit_tokens"), np.float64)
        self.size_bytes = grow(get("size_bytes"), np.float64)
        self.stored_s = grow(get("stored_s"), np.float64)
        self.last_access_s = grow(get("last_access_s"), np.float64)
        self.turn = grow(get("turn"), np.uint32)
        self.doc = grow(get("doc"), np.int32, -1)
        self.group = grow(get("group"), np.uint16, _NO_GROUP)
        self.live = grow(get("live"), np.bool_, False)
        # value = numerator / size; +inf for dead slots so they never win the argmin.
        self.value = grow(get("value"), np.float64, np.inf)
        self._keys.extend([None] * (capacity - len(self._keys)))
        self._cap = capacity

    def __len__(self) -> int:
        return len(self._slot_of)

    @property
    def bytes_in_use(self) -> int:
        """Sum of the sizes of live entries, bytes."""
        return self._bytes_live

    def slot(self, entry_key: str) -> int | None:
        """Slot of a key, None when absent."""
        return self._slot_of.get(key_hash(entry_key))

    def __contains__(self, entry_key: str) -> bool:
        return key_hash(entry_key) in self._slot_of

    def _new_slot(self, h: int, entry_key: str) -> int:
        if self._free:
            s = self._free.pop()
        else:
            if self._n == self._cap:
                self._alloc(self._cap * 2)
            s = self._n
            self._n += 1
        self._slot_of[h] = s
        self._keys[s] = entry_key
        self.key_hash[s] = h
        self.live[s] = True
        return s

    def _doc_slot(self, document_id: str) -> int:
        d = self._doc_slot_of.get(document_id)
        if d is None:
            d = len(self._doc_slot_of)
            self._doc_slot_of[document_id] = d
            if d >= len(self._doc_hits):
                self._doc_hits = np.concatenate([self._doc_hits, np.zeros(len(self._doc_hits))])
                self._doc_accu = np.concatenate([self._doc_accu, np.zeros(len(self._doc_accu))])
        return d

    def _refresh_value(self, s: int) -> None:
        size = max(float(self.size_bytes[s]), 1.0)
        if self.doc[s] >= 0:
            d = int(self.doc[s])
            num = (self._doc_hits[d] + 1.0) * (self._doc_accu[d] + float(self.tokens[s]))
        elif self.turn[s] > 0:
            num = float(self.turn[s]) * (self.hit_tokens[s] + float(self.tokens[s]))
        elif self.token_term == "entry":
            num = (float(self.hits[s]) + 1.0) * float(self.tokens[s])
        else:
            num = (float(self.hits[s]) + 1.0) * (self.hit_tokens[s] + float(self.tokens[s]))
        self.value[s] = num / size

    # ----- events --------------------------------------------------------------------------------
    def store(self, entry_key: str, *, tokens: int, size_bytes: int, now_s: float, turn: int = 0,
              document_id: str = "", group: int | None = None) -> int:
        """Record that an entry was stored (or re-stored); returns its slot."""
        h = key_hash(entry_key)
        s = self._slot_of.get(h)
        if s is None:
            s = self._new_slot(h, entry_key)
            self.hits[s] = 0
            self.hit_tokens[s] = 0.0
            self.stored_s[s] = now_s
            self.turn[s] = 0
            self.doc[s] = -1
            self.group[s] = _NO_GROUP
            self.size_bytes[s] = 0.0
        self._bytes_live += int(size_bytes) - int(self.size_bytes[s])
        self.tokens[s] = tokens
        self.size_bytes[s] = float(size_bytes)
        self.last_access_s[s] = now_s
        if turn:
            self.turn[s] = max(int(self.turn[s]), int(turn))
        if document_id and self.doc[s] < 0:
            self.doc[s] = self._doc_slot(document_id)
            self._n_doc_entries += 1
        if group is not None:
            self.group[s] = group
        self._refresh_value(s)
        return s

    def hit(self, entry_key: str, *, hit_tokens: int, now_s: float, turn: int = 0,
            document_id: str = "") -> bool:
        """Record a hit; returns False when the key is not indexed (the hit is then ignored)."""
        s = self._slot_of.get(key_hash(entry_key))
        if s is None:
            return False
        self.hit_slot(s, hit_tokens=hit_tokens, now_s=now_s, turn=turn)
        if document_id and self.doc[s] >= 0:
            d = int(self.doc[s])
            self._doc_hits[d] += 1
            self._doc_accu[d] += hit_tokens
        return True

    def hit_slot(self, s: int, *, hit_tokens: int, now_s: float, turn: int = 0) -> None:
        """Record a hit on a known slot (hot path of the replay)."""
        self.hits[s] += 1
        self.hit_tokens[s] += hit_tokens
        self.last_access_s[s] = now_s
        if turn:
            self.turn[s] = max(int(self.turn[s]), int(turn))
        self._refresh_value(s)

    def remove(self, entry_key: str) -> bool:
        """Forget an entry (evicted by the cache itself or by us); False when absent."""
        s = self._slot_of.get(key_hash(entry_key))
        if s is None:
            return False
        self.remove_slot(s)
        return True

    def remove_slot(self, s: int) -> None:
        h = int(self.key_hash[s])
        del self._slot_of[h]
        self._bytes_live -= int(self.size_bytes[s])
        if self.doc[s] >= 0:
            self._n_doc_entries -= 1
        self.live[s] = False
        self.value[s] = np.inf
        self.size_bytes[s] = 0.0
        self.key_hash[s] = 0
        self._keys[s] = None
        self._free.append(s)

    def key_of(self, s: int) -> str:
        key = self._keys[s]
        if key is None:
            raise KeyError(f"slot {s} is empty")
        return key

    # ----- scores and eviction choice ------------------------------------------------------------
    def _ref_times(self) -> np.ndarray:
        return self.last_access_s if self.age_basis == "access" else self.stored_s

    def scores(self, now_s: float, slots: np.ndarray | None = None) -> np.ndarray:
        """LCS scores at `now_s` of all slots (inf for dead slots) or of the given slots."""
        n = self._n
        value = self.value[:n] if slots is None else self.value[slots]
        ref = self._ref_times()[:n] if slots is None else self._ref_times()[slots]
        if self._n_doc_entries:
            value = value.copy()
            doc = self.doc[:n] if slots is None else self.doc[slots]
            m = doc >= 0
            size = np.maximum(self.size_bytes[:n] if slots is None else self.size_bytes[slots], 1.0)
            tokens = self.tokens[:n] if slots is None else self.tokens[slots]
            d = doc[m]
            value[m] = (self._doc_hits[d] + 1.0) * (self._doc_accu[d] + tokens[m]) / size[m]
            live = self.live[:n] if slots is None else self.live[slots]
            value[~live] = np.inf
        age = np.subtract(now_s, ref)
        np.maximum(age, MIN_AGE_S, out=age)
        return np.divide(value, age, out=age)

    def choose_victims(self, count: int, now_s: float, *, exclude: np.ndarray | None = None) -> np.ndarray:
        """Slots of the `count` live entries with the lowest LCS score at `now_s`, lowest first.

        `exclude` (slot array) is never chosen (e.g. the blocks of the request being served). Exact over
        all slots unless `max_scan_entries` is set and smaller than the index: then over a uniform
        random sample of that many slots (approximate, fixed cost).
        """
        live_n = len(self._slot_of)
        if count <= 0 or live_n == 0:
            return np.empty(0, dtype=np.int64)
        count = min(count, live_n)
        if self.max_scan_entries is not None and self._n > self.max_scan_entries and count < self.max_scan_entries:
            sample = self._rng.integers(0, self._n, size=self.max_scan_entries)
            sample = np.unique(sample)
            sc = self.scores(now_s, sample)
            if exclude is not None and len(exclude):
                sc[np.isin(sample, exclude)] = np.inf
            order = np.argpartition(sc, count - 1)[:count] if count < len(sc) else np.arange(len(sc))
            order = order[np.argsort(sc[order], kind="stable")]
            order = order[np.isfinite(sc[order])]
            return sample[order]
        sc = self.scores(now_s)
        if exclude is not None and len(exclude):
            sc[exclude] = np.inf
        if count == 1:
            best = int(np.argmin(sc))
            return np.array([best], dtype=np.int64) if np.isfinite(sc[best]) else np.empty(0, dtype=np.int64)
        part = np.argpartition(sc, count - 1)[:count] if count < len(sc) else np.arange(len(sc))
        part = part[np.argsort(sc[part], kind="stable")]
        return part[np.isfinite(sc[part])].astype(np.int64)

    def lowest(self, limit: int, now_s: float) -> list[EntryView]:
        """The `limit` entries with the lowest scores, lowest first."""
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

        `ttl_by_group_s[g]` is the TTL of group g; entries with no group use `default_ttl_s` (None: never).
        """
        n = self._n
        groups = self.group[:n]
        ttl = np.full(n, np.inf if default_ttl_s is None else default_ttl_s, dtype=np.float64)
        known = groups != _NO_GROUP
        if len(ttl_by_group_s):
            g = groups[known].astype(np.int64)
            inside = g < len(ttl_by_group_s)
            vals = np.full(len(g), np.inf if default_ttl_s is None else default_ttl_s)
            vals[inside] = ttl_by_group_s[g[inside]]
            ttl[known] = vals
        idle = now_s - self.last_access_s[:n]
        return np.flatnonzero(self.live[:n] & (idle > ttl))

    # ----- memory and persistence ----------------------------------------------------------------
    def array_bytes_per_slot(self) -> int:
        """Bytes of numpy storage per slot (fixed by the dtypes)."""
        arrays = (self.key_hash, self.tokens, self.hits, self.hit_tokens, self.size_bytes, self.stored_s,
                  self.last_access_s, self.turn, self.doc, self.group, self.live, self.value)
        return int(sum(a.itemsize for a in arrays))

    _ARRAYS = ("key_hash", "tokens", "hits", "hit_tokens", "size_bytes", "stored_s", "last_access_s",
               "turn", "doc", "group", "live", "value")

    def save(self, path: Path) -> None:
        """Write a snapshot (numpy .npz, atomically replaced) that `load` restores exactly."""
        path.parent.mkdir(parents=True, exist_ok=True)
        n = self._n
        keys = np.array([k if k is not None else "" for k in self._keys[:n]], dtype=object)
        docs = np.array(sorted(self._doc_slot_of, key=self._doc_slot_of.__getitem__), dtype=object)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez(
                fh, **{name: getattr(self, name)[:n] for name in self._ARRAYS},
                keys=keys.astype(str) if n else np.array([], dtype=str),
                docs=docs.astype(str) if len(docs) else np.array([], dtype=str),
                doc_hits=self._doc_hits[: len(docs)], doc_accu=self._doc_accu[: len(docs)],
                meta=np.array([self.age_basis, self.token_term]),
            )
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path, **kwargs: object) -> CacheIndex:
        """Restore a snapshot written by `save`."""
        with np.load(path, allow_pickle=False) as data:
            age_basis, token_term = (str(x) for x in data["meta"][:2])
            n = len(data["key_hash"])
            index = cls(age_basis=age_basis, token_term=token_term, initial_capacity=max(16, n),
                        **kwargs)  # type: ignore[arg-type]
            for name in cls._ARRAYS:
                getattr(index, name)[:n] = data[name]
            keys = [str(k) for k in data["keys"]]
            docs = [str(d) for d in data["docs"]]
            index._doc_slot_of = {d: i for i, d in enumerate(docs)}
            if docs:
                index._doc_hits = np.concatenate([data["doc_hits"], np.zeros(16)])
                index._doc_accu = np.concatenate([data["doc_accu"], np.zeros(16)])
        index._n = n
        for s in range(n):
            if index.live[s]:
                index._slot_of[int(index.key_hash[s])] = s
                index._keys[s] = keys[s]
                index._bytes_live += int(index.size_bytes[s])
                if index.doc[s] >= 0:
                    index._n_doc_entries += 1
            else:
                index._free.append(s)
        return index
