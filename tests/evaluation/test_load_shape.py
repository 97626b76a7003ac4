"""A scenario's own load trace (``load_shape``): `greenserve evaluate` replayed only the shipped Azure 2024
conversation trace, so a platform engineer could not evaluate the product on their own traffic (ServeGen, WorldCup,
their router's counts). The trace is read like a CI CSV (hourly or finer rows), cut to whole UTC days; the last day
with every hour is replayed, a missing hour before it is history the load forecast skips."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from greenserve.evaluation import grids, run, scenario

FIRST = datetime(2025, 1, 6, tzinfo=UTC)  # a trace of 10-min rates, 5 days from here
DAY = datetime(2023, 6, 20, tzinfo=UTC)  # the evaluated CI day


def _rate(at: datetime) -> float:
    """Requests/s: a daily curve, peak 1000 at 14:00 UTC, plus the day index (to tell the days apart)."""
    hours = at.hour + at.minute / 60
    return round(600 + 400 * math.cos(2 * math.pi * (hours - 14) / 24) + (at - FIRST).days, 3)


def _trace(tmp_path: Path, *, days: int = 5, holes: tuple[datetime, ...] = ()) -> Path:
    rows = []
    for q in range(days * 144):
        at = FIRST + timedelta(minutes=10 * q)
        rows.append(f"{at.strftime('%Y-%m-%dT%H:%M:%SZ')},{'' if at.replace(minute=0) in holes else _rate(at)}\n")
    path = tmp_path / "servegen_like.csv"
    path.write_text("time,rate_rps\n" + "".join(rows))
    return path


def _scenario(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text("pools:\n  - name: chat\n    peak_requests_per_s: 10\n" + body)
    return path


SHAPE = "load_shape:\n  csv: servegen_like.csv\n  time_column: time\n  value_column: rate_rps\n"


def test_the_scenario_trace_is_replayed_its_last_complete_day_as_the_day(tmp_path: Path) -> None:
    # a hole in the history (day 2) and one in the last day (day 5): day 4 is replayed, days 1-3 are its history
    _trace(tmp_path, holes=(FIRST + timedelta(days=1, hours=7), FIRST + timedelta(days=4, hours=2)))
    chosen = scenario.load(_scenario(tmp_path, SHAPE))
    shape = chosen.load_shape
    assert shape is not None and shape.start_s == int(FIRST.timestamp()) and len(shape.values) == 4 * 24
    day, history, history_start_s = run._load_split(int(DAY.timestamp()), shape)
    assert day[14] == pytest.approx(np.mean([_rate(FIRST + timedelta(days=3, hours=14, minutes=m))
                                             for m in range(0, 60, 10)]))
    assert np.isnan(history).sum() == 1 and history_start_s == int(DAY.timestamp()) - 3 * 86400

    ci = grids.GridSeries("X", int(DAY.timestamp()) - 3 * 86400, tuple(300.0 + (h % 24) for h in range(4 * 24)))
    result = run.evaluate({"X": ci}, day_start_s=int(DAY.timestamp()), strategies=["base_full_cache"],
                          scenario=chosen, forecast_model="seasonal_naive", window_s=60.0, hours=1, workers=1,
                          fidelity=False)
    peak = max(np.nanmax(history), day.max())
    (hour,) = result["grids"]["X"]["base_full_cache"]["hours"]
    assert hour["load_actual_requests_per_s"] == pytest.approx(day[0] * 10 / peak)
    assert math.isfinite(hour["load_forecast_requests_per_s"]) and hour["load_forecast_requests_per_s"] > 0
    assert result["load_shape"] == {"name": "servegen_like", "replayed_day": "2025-01-09"}


@pytest.mark.parametrize(("body", "days", "message"), [
    ("load_shap:\n  csv: x.csv\n", 5, "s.yaml: unknown key 'load_shap' (known: pools, load_shape)"),
    (SHAPE + "  unit: rps\n", 5, "s.yaml: load_shape: unknown key 'unit'"),
    (SHAPE.replace("  value_column: rate_rps\n", ""), 5, "s.yaml: load_shape.value_column: required"),
    (SHAPE.replace("servegen_like", "absent"), 5, "s.yaml: load_shape: absent.csv: cannot read"),
    (SHAPE.replace("rate_rps", "rps"), 5,
     "load_shape: servegen_like.csv: column 'rps' (load_shape.value_column) not found"),
    (SHAPE, 2, "servegen_like.csv holds 2 whole UTC day(s) up to its last day with every hour; the evaluation "
               "needs 3"),
])
def test_a_bad_load_shape_is_refused_naming_the_key(tmp_path: Path, body: str, days: int, message: str) -> None:
    _trace(tmp_path, days=days)
    with pytest.raises(scenario.ScenarioError) as refused:
        scenario.load(_scenario(tmp_path, body))
    assert message in str(refused.value)


def test_without_load_shape_the_shipped_trace_is_replayed() -> None:
    day, history, _ = run._load_split(int(DAY.timestamp()))
    assert np.array_equal(np.concatenate([history, day]), run.load_shape()[:len(history) + 24])
    assert scenario.Scenario().load_shape is None
