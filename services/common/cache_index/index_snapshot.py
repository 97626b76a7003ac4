"""Snapshot of the cache index: atomic save to a numpy .npz and exact load (mixin of `CacheIndex`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO, Self

import numpy as np
from greenserve.common.cache_index.index_fields import IndexFields
from greenserve.common.cache_index.lcs_scores import HIT_DECAYS


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

class IndexSnapshot(IndexFields):
    """Memory figures, `save` and `load` of `CacheIndex`."""

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

    def _savez(self, fh: IO[bytes], n: int, docs: list[str], long_slots: np.ndarray) -> None:
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
    def load(cls, path: Path) -> Self:
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
            index._doc_limit = max(index._doc_limit, len(docs))  # an older, larger table compacts at once
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
