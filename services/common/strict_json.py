"""JSON that strict parsers accept: the standard has no NaN or Infinity (Python's ``json`` writes them by default,
and jq, Go or JavaScript then refuse the whole line). Undefined figures (a ratio to a naive MAPE of 0) become null."""

from __future__ import annotations

import json
import math
from typing import Any


def finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, recursively through dicts, lists and tuples."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """One line of standard JSON (non-finite floats as null)."""
    return json.dumps(finite_or_none(value), allow_nan=False)
