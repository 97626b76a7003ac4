"""Keys of the cache index: entry key -> slot table and the compact key storage (mixin of `CacheIndex`).

Entry keys are `HEX[@suffix]` strings (LMCache objects: `chunk_hash_hex@model@kv_rank@salt[@group]`).
The hex part (<= 64 hex digits) is stored as raw bytes in a fixed 32-byte field and the suffix as an index
into an interned table; other keys are kept as Python strings on the side. The key -> slot map is an
open-addressing table of int32 slots keyed by a 64-bit blake2b hash of the key (load <= 1/2).
"""

from __future__ import annotations

import hashlib

import numpy as np
from greenserve.common.cache_index.index_fields import IndexFields

_EMPTY, _TOMB = -1, -2
_KEY_BYTES = 32
_LONG_KEY = 255  # key_len marker: the key is kept in `_long_keys`


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


class KeyTable(IndexFields):
    """Key table and key storage of `CacheIndex` (uses its arrays `key_hash`, `key_raw`, `key_len`,
    `key_meta` and its `_table`, `_metas`, `_long_keys`)."""

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
