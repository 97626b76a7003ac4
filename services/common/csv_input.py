"""What the CSV readers of user data share (the evaluation's grid reader, evaluation/grids.py, and the forecaster's
series reader, forecaster/csv_sources.py): how a column name as the user typed it finds the header's column, the
rows' native step, and how much of a resampled bin its rows must cover."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import numpy as np

MIN_BIN_COVERAGE_FRACTION = 0.5
"""A bin (an hour) of finer rows has a value when at least this fraction of its native steps have one: a mostly
empty bin would be a guess."""


def _typed(name: str) -> str:
    """A column name as a user types it: NFKC ("₂" is "2"), case and runs of spaces ignored."""
    return " ".join(unicodedata.normalize("NFKC", name).casefold().split())


def header_column(columns: Sequence[str], wanted: str) -> str | None:
    """The header's column ``wanted`` names: itself, else the one column equal to it once folded as typed
    (Electricity Maps' "gCO₂eq/kWh" typed as "gCO2eq/kWh": the two look alike in a refusal's list of columns).
    None when none does, or when two columns fold alike (none is guessed)."""
    if wanted in columns:
        return wanted
    folded = [c for c in columns if _typed(c) == _typed(wanted)]
    return folded[0] if len(folded) == 1 else None


def infer_step_s(times_s: Sequence[int] | np.ndarray, default_s: int = 3600) -> int:
    """The rows' native step: the most common positive difference between consecutive distinct times (the smallest
    of equally common ones); ``default_s`` when there are fewer than two distinct times."""
    diffs = np.diff(np.unique(np.asarray(times_s, dtype=np.int64)))
    if len(diffs) == 0:
        return default_s
    values, counts = np.unique(diffs, return_counts=True)
    return int(values[np.argmax(counts)])
