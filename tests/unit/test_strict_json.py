"""Standard JSON out of the CLIs and benches: no NaN or Infinity tokens, which strict parsers refuse."""

from __future__ import annotations

import json
import math

from greenserve.common.strict_json import dumps, finite_or_none


def test_non_finite_floats_become_null_at_any_depth() -> None:
    value = {"ratio": math.nan, "rows": [{"p99": math.inf}, (1.5, -math.inf)], "name": "x", "n": 3}
    assert finite_or_none(value) == {"ratio": None, "rows": [{"p99": None}, [1.5, None]], "name": "x", "n": 3}
    line = dumps(value)
    assert "NaN" not in line and "Infinity" not in line
    assert json.loads(line, parse_constant=lambda token: (_ for _ in ()).throw(ValueError(token)))["ratio"] is None
