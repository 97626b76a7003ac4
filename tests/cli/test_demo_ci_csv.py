"""`greenserve demo --ci-csv`: the demo replays a user's own grid, read as `evaluate --ci-csv` reads it, before any
service starts; a CSV that cannot serve the day is refused naming why (exit 2), and the forecaster gets only the
known hours of the 21 days before the day however long the file is."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
from greenserve_client import demo
from greenserve_client.cli import main

DAY = "2023-03-20"


def _csv(path: Path, days_before: int, *, gap_hour: int | None = None, step_min: int = 60) -> Path:
    """Half-hourly or hourly CI from ``days_before`` days before DAY to its end; CI = hour of the day + 100."""
    start = int(datetime.fromisoformat(DAY).replace(tzinfo=UTC).timestamp()) - days_before * 86400
    rows = ["when,ci_g"]
    for i in range((days_before + 1) * 24 * 60 // step_min):
        t = start + i * step_min * 60
        value = "" if gap_hour is not None and (t - start) // 3600 == gap_hour else f"{100 + (t // 3600) % 24}"
        rows.append(f"{datetime.fromtimestamp(t, UTC).isoformat()},{value}")
    path.write_text("\n".join(rows) + "\n")
    return path


def _run(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict[str, object]]:
    seen: dict[str, object] = {}

    def started(options: demo.DemoOptions, **kwargs: object) -> int:  # no fleet here: what run() was given
        seen.update(options=options, **kwargs)
        return 0

    monkeypatch.setattr(demo, "run", started)
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, seen


def test_the_demo_replays_a_users_csv_named_after_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _csv(tmp_path / "DE-LU_2023.csv", 30, gap_hour=24, step_min=30)  # sub-hourly, a hole in the history
    code, seen = _run(["demo", "--ci-csv", str(path), "--time-column", "when", "--value-column", "ci_g",
                       "--day", DAY, "--hours", "2"], monkeypatch)
    assert code == 0
    options, series = seen["options"], seen["series"]
    assert options.grid == "DE-LU_2023" and series.region == "DE-LU_2023"
    assert series.window(options.day_start_s, 2) == (100.0, 101.0)
    # the forecaster's CI history: the 21 days before the day, known hours only, not the file's 30 days
    ci, _, _ = demo.histories(options, series, options.day_start_s)
    assert len(ci) == 21 * 24 and ci[0][0] == options.day_start_s - 21 * 86400
    assert all(math.isfinite(v) for _, v in ci)


def test_region_names_the_series(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _csv(tmp_path / "export.csv", 3)
    code, seen = _run(["demo", "--ci-csv", str(path), "--time-column", "when", "--value-column", "ci_g",
                       "--region", "PL", "--day", DAY], monkeypatch)
    assert code == 0 and seen["options"].grid == "PL" and seen["series"].region == "PL"


@pytest.mark.parametrize("extra,expected", [
    ([], "--ci-csv needs --time-column and --value-column"),
    (["--time-column", "when", "--value-column", "nope"], "nope"),
    (["--time-column", "when", "--value-column", "ci_g", "--day", "2023-03-25"], "no CI for 24 h"),
])
def test_a_csv_that_cannot_serve_the_day_exits_2_before_any_service(
        extra: list[str], expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = _csv(tmp_path / "grid.csv", 3)
    argv = ["demo", "--ci-csv", str(path), *extra]
    if "--day" not in extra:
        argv += ["--day", DAY]
    code, seen = _run(argv, monkeypatch)
    err = capsys.readouterr().err
    assert code == 2 and not seen, err
    assert expected in err and "Traceback" not in err, err


def test_a_gap_inside_the_day_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = _csv(tmp_path / "grid.csv", 3, gap_hour=3 * 24 + 5)  # 05:00 of the day has no value
    code, seen = _run(["demo", "--ci-csv", str(path), "--time-column", "when", "--value-column", "ci_g",
                       "--day", DAY], monkeypatch)
    err = capsys.readouterr().err
    assert code == 2 and not seen and "05:00" in err, err


def test_a_file_name_that_is_no_region_name_asks_for_region(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The region becomes the pools' region and the CI series' key, which SetFleet checks as a name: a file named
    'my grid (2023).csv' failed only once the services were up."""
    path = _csv(tmp_path / "my grid (2023).csv", 3)
    argv = ["demo", "--ci-csv", str(path), "--time-column", "when", "--value-column", "ci_g", "--day", DAY]
    code, seen = _run(argv, monkeypatch)
    err = capsys.readouterr().err
    assert code == 2 and not seen and "--region" in err and "my grid (2023)" in err, err
    code, seen = _run([*argv, "--region", "my-grid"], monkeypatch)
    assert code == 0 and seen["series"].region == "my-grid"
