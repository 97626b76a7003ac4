"""The fields of `CacheIndex` that its parts (keys, scores, eviction choice, snapshot) read and write.

`CacheIndex.__init__` and `CacheIndex._alloc` set them; this base class only declares their types, so each
part, a mixin of its own module, is checked against the same fields. The methods one part calls on another are
declared here too, for the type checker only: at run time they resolve through `CacheIndex`'s bases as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import numpy.typing as npt


class IndexFields:
    """Per-slot arrays (one element per slot), the key table, the document table, the candidate pool and the
    scoring settings of one `CacheIndex`."""

    #: names of the per-slot arrays (saved by `save`, sized by `_alloc`)
    _ARRAYS: ClassVar[tuple[str, ...]]

    # ----- per-slot arrays ---------------------------------------------------------------------------
    key_hash: npt.NDArray[np.uint64]  # 0: free slot; 1: keyless live entry
    key_raw: npt.NDArray[np.uint8]  # (capacity, 32): the hex head of the key as bytes
    key_len: npt.NDArray[np.uint8]
    key_meta: npt.NDArray[np.uint16]  # index into `_metas` (the key's suffix)
    tokens: npt.NDArray[np.uint32]
    hits: npt.NDArray[np.uint32]
    hit_tokens: npt.NDArray[np.float64]
    size_bytes: npt.NDArray[np.float64]
    stored_s: npt.NDArray[np.float64]
    last_access_s: npt.NDArray[np.float64]
    turn: npt.NDArray[np.uint32]
    doc: npt.NDArray[np.int32]  # slot in the document table, -1: none
    group: npt.NDArray[np.uint16]  # TTL group id
    parent: npt.NDArray[np.int32]  # slot of the prefix parent, -1: none
    nchild: npt.NDArray[np.uint32]  # cached children
    value: npt.NDArray[np.float64]  # score numerator / size; +inf for dead slots
    _scratch: npt.NDArray[np.bool_]
    _cap: int
    _n: int  # slots used (high-water mark)
    _live: int
    _bytes_live: int
    _free: list[int]

    # ----- keys --------------------------------------------------------------------------------------
    _table: npt.NDArray[np.int32]
    _table_used: int
    _metas: list[str]
    _meta_id: dict[str, int]
    _long_keys: dict[int, str]
    group_names: list[str]
    _group_of: dict[str, int]

    # ----- documents ---------------------------------------------------------------------------------
    _doc_slot_of: dict[str, int]
    _doc_limit: int
    _doc_hits: npt.NDArray[np.float64]
    _doc_accu: npt.NDArray[np.float64]
    _n_doc_entries: int

    # ----- scores ------------------------------------------------------------------------------------
    age_basis: str
    token_term: str
    truncation_reset: bool
    hit_decay: str | float
    order: str
    tau_s: float
    _gap_hist: npt.NDArray[np.int64]
    _gap_ghost: dict[int, float]

    # ----- eviction choice ---------------------------------------------------------------------------
    _pool: npt.NDArray[np.int64]
    _pool_t0: float
    _pool_h: float
    _pool_hcur: float
    _pool_theta: npt.NDArray[np.float64]
    _pool_size: int
    _pool_uses: int
    _pool_valid: bool
    _dirty: npt.NDArray[np.int64]
    _dirty_n: int
    refreshes: int
    journal_id: int

    if TYPE_CHECKING:
        def __init__(self, *, age_basis: str = "access", token_term: str = "entry", truncation_reset: bool = False,
                     hit_decay: str | float = "online", initial_capacity: int = 1024) -> None: ...

        # index.CacheIndex
        def _scores_inlinable(self) -> bool: ...

        # index_keys.KeyTable
        def _table_resize(self, live_capacity: int) -> None: ...
        def key_of(self, s: int) -> str: ...

        # lcs_scores.LcsScores
        def _truncated_score(self, s: int, now_s: float) -> float: ...
        def _ref_times(self) -> np.ndarray: ...
        def _value_of(self, slots: np.ndarray) -> np.ndarray: ...
        def _base_value(self, slots: np.ndarray, value: np.ndarray) -> np.ndarray: ...
        def _score_parts(self, base: np.ndarray, extra: np.ndarray, age: np.ndarray) -> np.ndarray: ...
        def scores(self, now_s: float, slots: np.ndarray | None = None) -> np.ndarray: ...
        def estimated_tau_s(self) -> float: ...
