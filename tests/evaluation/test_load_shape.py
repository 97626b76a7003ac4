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
    (SHAPE.replace("servegen_like", "absent"), 5, "/absent.csv: cannot read"),
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


def _requests(tmp_path: Path, days: int = 4) -> tuple[Path, dict[datetime, int]]:
    """A per-request trace (Azure's layout: TIMESTAMP with 7 fractional digits, no offset), rows out of order: hour h
    of day d has 1 + (h + d) % 5 requests, except hour 03 of day 2, which has none (a real 0, not a gap)."""
    rows, expected = [], {}
    for d in range(days):
        for h in range(24):
            at = FIRST + timedelta(days=d, hours=h)
            n = 0 if (d, h) == (1, 3) else 1 + (h + d) % 5
            expected[at] = n
            rows += [f"{(at + timedelta(seconds=7 * k + 0.25)).strftime('%Y-%m-%d %H:%M:%S.%f')}0,374,44\n"
                     for k in range(n)]
    rows.reverse()
    path = tmp_path / "azure_like.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(rows))
    return path, expected


PER_REQUEST = "load_shape:\n  csv: azure_like.csv\n  time_column: timestamp\n  per_request: true\n"


def test_a_per_request_trace_is_counted_per_utc_hour(tmp_path: Path) -> None:
    _, expected = _requests(tmp_path)
    shape = scenario.load(_scenario(tmp_path, PER_REQUEST)).load_shape
    assert shape is not None and shape.start_s == int(FIRST.timestamp()) and len(shape.values) == 4 * 24
    assert list(shape.values) == [float(expected[FIRST + timedelta(hours=k)]) for k in range(4 * 24)]
    assert shape.values[24 + 3] == 0.0  # an hour without a request is a load of 0, not a missing hour


@pytest.mark.parametrize(("body", "message"), [
    (PER_REQUEST + "  value_column: ContextTokens\n", "load_shape: per_request counts rows; a value_column cannot"),
    (PER_REQUEST.replace("true", "yes please"), "load_shape.per_request: true or false"),
    (PER_REQUEST.replace("  per_request: true\n", ""),
     "load_shape.value_column: required, a non-empty string (or per_request: true"),
    (PER_REQUEST.replace("timestamp", "arrival"), "column 'arrival' (load_shape.time_column) not found"),
])
def test_a_bad_per_request_shape_is_refused_naming_the_key(tmp_path: Path, body: str, message: str) -> None:
    _requests(tmp_path)
    with pytest.raises(scenario.ScenarioError) as refused:
        scenario.load(_scenario(tmp_path, body))
    assert message in str(refused.value)


def test_a_bad_time_cell_or_a_span_of_centuries_is_refused_naming_the_row(tmp_path: Path) -> None:
    path, _ = _requests(tmp_path, days=1)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines[:5], "yesterday,1,1", *lines[5:]]) + "\n")
    with pytest.raises(grids.GridDataError, match=r"azure_like.csv: row 6: time 'yesterday' is not an ISO-8601"):
        grids.count_csv(path, time_column="TIMESTAMP")
    path.write_text("\n".join([*lines, "0001-01-01 00:00:00,1,1"]) + "\n")
    with pytest.raises(grids.GridDataError, match=r"span \d+ h \(row \d+ to row \d+\); at most 175680 h"):
        grids.count_csv(path, time_column="TIMESTAMP")
    path.write_text("TIMESTAMP,ContextTokens\n")
    with pytest.raises(grids.GridDataError, match="no data rows under the header"):
        grids.count_csv(path, time_column="TIMESTAMP")


def test_a_ci_file_spanning_centuries_is_refused_before_it_is_laid_out(tmp_path: Path) -> None:
    path = tmp_path / "ci.csv"
    hourly = "".join(f"{(DAY + timedelta(hours=h)).strftime('%Y-%m-%dT%H:%M:%SZ')},310\n" for h in range(48))
    path.write_text("time,ci\n0001-01-01T00:00:00Z,300\n" + hourly)  # a mistyped year: 17.7 million hours
    with pytest.raises(grids.GridDataError, match=r"ci.csv: rows of X span \d+ h \(row 2 to row 50\)"):
        grids.read_csv(path, time_column="time", value_column="ci", region="X")
