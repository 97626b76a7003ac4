"""Checkpoints of the cache index on disk: two generations per pool, written atomically, checked on load.

Layout under `<data_dir>/cache_index/`: `<pool>.npz` (the current checkpoint), `previous/<pool>.npz` (the one
before it) and `corrupt/` (snapshots that failed to load, moved aside with a warning, never deleted). Each
snapshot holds the id of the last journal event it includes (`CacheIndex.journal_id`), so a pool is restored
as "this snapshot + the journal after its id" (journal.py). Pool names are checked names (no '/', no
leading '.'), so they are safe as file names; files whose stem is not a name are ignored with a warning.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from greenserve.common.cache_index.index import CacheIndex, fsync_dir
from greenserve.common.names import is_name

log = logging.getLogger("greenserve.cache_manager.snapshots")


class SnapshotStore:
    """The checkpoint files of every pool in one folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.previous_folder = folder / "previous"
        self.corrupt_folder = folder / "corrupt"

    def current(self, pool: str) -> Path:
        return self.folder / f"{pool}.npz"

    def previous(self, pool: str) -> Path:
        return self.previous_folder / f"{pool}.npz"

    def pools(self) -> list[str]:
        """Pools with a checkpoint of either generation (temporary files a killed writer left are removed)."""
        names: set[str] = set()
        for folder in (self.folder, self.previous_folder):
            if not folder.is_dir():
                continue
            for pattern in (".*.tmp", "*.npz.tmp"):  # ours, and the one shared name of earlier versions
                for tmp in folder.glob(pattern):
                    tmp.unlink(missing_ok=True)
            for path in folder.glob("*.npz"):
                if is_name(path.stem):
                    names.add(path.stem)
                else:
                    log.warning("ignoring cache index file %r: %r is not a valid pool name", str(path), path.stem)
        return sorted(names)

    def _move_aside(self, path: Path, exc: BaseException) -> None:
        self.corrupt_folder.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = self.corrupt_folder / f"{path.stem}.{path.parent.name}.{stamp}.{os.getpid()}.npz"
        os.replace(path, target)
        log.warning("cache index snapshot %s is unreadable (%s: %s); moved aside to %s", path, type(exc).__name__,
                    str(exc)[:200], target)

    def load(self, pool: str) -> tuple[CacheIndex | None, int | None, int | None]:
        """(index, id of the current checkpoint, id of the previous one) of a pool.

        The current checkpoint is loaded; when it is missing or unreadable (moved aside with a warning) the
        previous one is; when neither loads the index is None (the caller rebuilds it from the journal).
        """
        found: list[tuple[CacheIndex, int]] = []
        for path in (self.current(pool), self.previous(pool)):
            if not path.exists():
                found.append(None)  # type: ignore[arg-type]
                continue
            try:
                index = CacheIndex.load(path)
            except Exception as exc:  # noqa: BLE001 - unreadable: BadZipFile, KeyError, ValueError, OSError...
                self._move_aside(path, exc)
                found.append(None)  # type: ignore[arg-type]
                continue
            found.append((index, index.journal_id))
        cur, prev = found
        if cur is not None:
            return cur[0], cur[1], prev[1] if prev is not None else None
        if prev is not None:
            # The previous checkpoint becomes the only one: written back as current on the next checkpoint.
            return prev[0], None, prev[1]
        return None, None, None

    def save(self, pool: str, index: CacheIndex) -> None:
        """A new current checkpoint; the old current becomes the previous one (each step atomic: a crash in
        between leaves the previous one, which the journal completes)."""
        cur = self.current(pool)
        if cur.exists():
            self.previous_folder.mkdir(parents=True, exist_ok=True)
            os.replace(cur, self.previous(pool))
            fsync_dir(self.previous_folder)
        index.save(cur)

    def copy_current_to_previous(self, pool: str) -> None:
        """Make the previous checkpoint equal to the current one (atomically, durably)."""
        self.previous_folder.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=self.previous_folder, prefix=f".{pool}.", suffix=".tmp")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out, open(self.current(pool), "rb") as src:
                shutil.copyfileobj(src, out)
                out.flush()
                os.fsync(out.fileno())
            tmp.replace(self.previous(pool))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(self.previous_folder)
