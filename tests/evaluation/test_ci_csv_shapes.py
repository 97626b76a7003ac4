"""`greenserve evaluate --ci-csv` on the CI files a platform engineer actually has, not only a clean hourly UTC column:
rows every 15 min, times with an offset, a missing hour or an empty cell away from the evaluated day, the same row
twice, and the local-time column whose DST change repeats an hour (refused: the whole series would be shifted).
Each file is written here, a few days of a synthetic daily CI curve."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from greenserve.evaluation import grids, run
from greenserve.evaluation.scenario import Scenario

DAY = datetime(2023, 6, 20, tzinfo=UTC)
FIRST = DAY - timedelta(days=3)


def _ci(at: datetime) -> float:
    """A daily curve (low at 13:00 UTC, like a solar grid), gCO2e/kWh."""
    hours = at.hour + at.minute / 60
    return round(300 + 120 * math.cos(2 * math.pi * (hours - 1) / 24), 3)


def _hourly_rows(days: int = 4) -> list[tuple[datetime, float]]:
    return [(FIRST + timedelta(hours=h), _ci(FIRST + timedelta(hours=h))) for h in range(days * 24)]


def _write(tmp_path: Path, rows: list[tuple[str, str]], header: str = "ts,ci") -> Path:
    path = tmp_path / "grid.csv"
    path.write_text(header + "\n" + "".join(f"{t},{v}\n" for t, v in rows))
    return path


def _read(path: Path, time_column: str = "ts", value_column: str = "ci") -> grids.GridSeries:
    return grids.read_csv(path, time_column=time_column, value_column=value_column, region="X")["X"]


def _jobs(series: grids.GridSeries) -> list[run.Job]:
    return run.jobs_for({"X": series}, day_start_s=int(DAY.timestamp()), strategies=["base_full_cache"],
                        scenario=Scenario(), forecast_model="seasonal_naive", window_s=120, hours=24)


def test_rows_every_15_min_are_averaged_per_utc_hour(tmp_path: Path) -> None:
    """Sub-hourly rows (Let's-Wait-Awhile, grid operators' 15-min feeds) were refused as 'hour ... is repeated' at
    the second row: each UTC hour is now the mean of its rows."""
    start = FIRST
    rows = [(start + timedelta(minutes=15 * q), float(q % 4)) for q in range(4 * 24 * 4)]
    series = _read(_write(tmp_path, [(t.strftime("%Y-%m-%d %H:%M:%S"), str(v)) for t, v in rows]))
    assert series.start_s == int(FIRST.timestamp()) and len(series.values) == 96
    assert set(series.values) == {1.5}  # (0 + 1 + 2 + 3) / 4
    assert len(_jobs(series)) == 1


def test_an_hour_with_too_few_sub_hourly_rows_is_missing_naming_its_row(tmp_path: Path) -> None:
    rows = [(FIRST + timedelta(minutes=15 * q), "10") for q in range(4 * 24 * 4)]
    in_day = 4 * 24 * 3 + 4 * 5  # 05:00 of the evaluated day: three of its four rows empty
    rows = [(t, "" if in_day + 1 <= q < in_day + 4 else v) for q, (t, v) in enumerate(rows)]
    series = _read(_write(tmp_path, [(t.isoformat(), v) for t, v in rows]))
    assert math.isnan(series.values[3 * 24 + 5]) and sum(math.isnan(v) for v in series.values) == 1
    with pytest.raises(grids.GridDataError, match=r"grid.csv: row \d+: 1 of the hour's 4 rows have a value .*"
                                                  r"no CI for 2023-06-20T05:00:00\+00:00"):
        _jobs(series)


def test_times_with_an_offset_are_the_instants_they_name(tmp_path: Path) -> None:
    plus_one = timezone(timedelta(hours=1))
    rows = [(t.astimezone(plus_one).isoformat(), str(v)) for t, v in _hourly_rows()]
    assert rows[0][0].endswith("+01:00")
    series = _read(_write(tmp_path, rows))
    assert series.start_s == int(FIRST.timestamp())
    assert series.window(int(DAY.timestamp()), 24) == tuple(_ci(DAY + timedelta(hours=h)) for h in range(24))


def test_a_gap_or_an_empty_cell_before_the_day_does_not_block_it(tmp_path: Path) -> None:
    """A missing hour or an empty value anywhere in the file refused the whole file (a year's file with one hole in
    March could not evaluate a day in June): the history may now miss hours (NaN, which the forecaster's models
    skip); the evaluated day may not."""
    rows = [(t.strftime("%Y-%m-%dT%H:%MZ"), str(v)) for t, v in _hourly_rows()]
    del rows[10]  # a gap in the history
    rows[30] = (rows[30][0], "")  # an empty cell in the history
    series = _read(_write(tmp_path, rows))
    assert sum(math.isnan(v) for v in series.values) == 2
    (job,) = _jobs(series)
    assert sum(math.isnan(v) for v in job.ci_history) == 2
    assert not any(math.isnan(v) for v in job.ci_actual)
    forecast = run._forecast(run.ForecastJob("X", job.ci_history, job.ci_history_start_s, job.ci_actual,
                                             "seasonal_naive"))[1]
    assert all(math.isfinite(v) and v > 0 for v in forecast.mean)


@pytest.mark.parametrize(("hole", "message"), [
    ("gap", r"grid.csv: gap before row 78: no CI for 2023-06-20T04:00:00\+00:00 \(1 h of X missing"),
    ("empty", r"grid.csv: row 78: empty value: no CI for 2023-06-20T04:00:00\+00:00"),
])
def test_a_hole_in_the_evaluated_day_is_refused_naming_the_row(tmp_path: Path, hole: str, message: str) -> None:
    rows = [(t.strftime("%Y-%m-%dT%H:%MZ"), str(v)) for t, v in _hourly_rows()]
    if hole == "gap":
        del rows[3 * 24 + 4]
    else:
        rows[3 * 24 + 4] = (rows[3 * 24 + 4][0], "")
    with pytest.raises(grids.GridDataError, match=message):
        _jobs(_read(_write(tmp_path, rows)))


def test_the_same_row_twice_is_kept_once_but_a_dst_repeated_hour_is_refused(tmp_path: Path) -> None:
    rows = [(t.strftime("%Y-%m-%d %H:%M:%S"), str(v)) for t, v in _hourly_rows()]
    twice = rows[:20] + [rows[19]] + rows[20:]  # a file concatenated with an overlap
    assert _read(_write(tmp_path, twice)).values == _read(_write(tmp_path, rows)).values
    dst = rows[:20] + [(rows[19][0], "999")] + rows[20:]  # 02:00 local twice, with two values
    with pytest.raises(grids.GridDataError, match=r"row 22: .* is repeated with another value \(row 21\): a "
                                                  r"local-time column without an offset"):
        _read(_write(tmp_path, dst))


@pytest.mark.parametrize(("rows", "message"), [
    ([("2023-06-17T00:00Z", "1"), ("2023-06-17T02:00Z", "1"), ("2023-06-17T04:00Z", "1")], "7200 s apart"),
    ([(f"2023-06-17T0{h}:00Z", "1") for h in range(5)] + [("2023-06-17T05:30Z", "1"), ("2023-06-17T06:00Z", "1")],
     "row 7: time 2023-06-17T05:30:00+00:00 of X is not on the hour"),
    ([("2023-06-17T00:00Z", ""), ("2023-06-17T01:00Z", "")], "no value for region X"),
])
def test_rows_the_evaluation_cannot_make_hourly_are_refused(tmp_path: Path, rows: list[tuple[str, str]],
                                                            message: str) -> None:
    with pytest.raises(grids.GridDataError, match=message.replace("+", r"\+").replace("(", r"\(")):
        _read(_write(tmp_path, rows))


def test_a_column_typed_with_a_plain_2_finds_the_subscript_header(tmp_path: Path) -> None:
    """Electricity Maps' header says 'gCO₂eq/kWh'; a user types 'gCO2eq/kWh' and was refused with a list of
    columns in which the two look the same. A column equal once folded (NFKC, case, spaces) is taken when it is the
    only one."""
    header = "Datetime (UTC),Carbon Intensity gCO₂eq/kWh (direct),Carbon Intensity gCO₂eq/kWh (LCA)"
    rows = [(t.strftime("%Y-%m-%d %H:%M:%S"), f"{v},{v + 50}") for t, v in _hourly_rows()]
    path = _write(tmp_path, rows, header=header)
    series = _read(path, "datetime (utc)", "Carbon Intensity gCO2eq/kWh (LCA)")
    assert series.values[0] == _ci(FIRST) + 50
    with pytest.raises(grids.GridDataError, match=r"column 'Carbon Intensity gCO2eq/kWh' \(--value-column\) not "
                                                  r"found; columns: Datetime \(UTC\), Carbon"):
        _read(path, "Datetime (UTC)", "Carbon Intensity gCO2eq/kWh")
    (tmp_path / "twice.csv").write_text("t,CI,ci\n2023-06-17T00:00Z,1,2\n")
    with pytest.raises(grids.GridDataError, match=r"column 'Ci' \(--value-column\) not found"):
        _read(tmp_path / "twice.csv", "t", "Ci")  # two columns fold to it: neither is guessed


def test_several_regions_in_one_file_are_named_in_the_repeat_refusal(tmp_path: Path) -> None:
    rows = [(t.strftime("%Y-%m-%dT%H:%MZ"), str(v + zone)) for t, v in _hourly_rows(1) for zone in (0, 100)]
    with pytest.raises(grids.GridDataError, match=r"row 3: .* repeated .* several regions repeats every hour"):
        _read(_write(tmp_path, rows))


def test_a_header_without_rows_is_refused(tmp_path: Path) -> None:
    """A CI CSV with its header only evaluated no grid and exited 0 with an empty summary."""
    (tmp_path / "grid.csv").write_text("ts,ci\n")
    with pytest.raises(grids.GridDataError, match="grid.csv: no data rows under the header"):
        _read(tmp_path / "grid.csv")
