"""`greenserve evaluate`: a short real run (one grid, two hours) whose report plots exactly the JSON's series, and the
refusals of bad CI files and scenarios (exit 2 naming the row, column or key)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from greenserve.evaluation import grids
from greenserve.evaluation.plots import plotted_series

CLI = [sys.executable, "-m", "greenserve_client.cli", "evaluate"]
SHORT = ["--grids", "FR", "--hours", "2", "--window-s", "120", "--forecast", "seasonal_naive", "--workers", "1",
         "--headlines", "none"]


def test_short_evaluation_report_plots_the_json(tmp_path: Path) -> None:
    out = tmp_path / "report"
    run = subprocess.run([*CLI, *SHORT, "--strategies", "base_full_cache,joint", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    last = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(last["summary"]["FR"]) == {"base_full_cache", "joint"}
    result = json.loads((out / "result.json").read_text())
    fr = result["grids"]["FR"]
    assert all(len(fr[s]["hours"]) == 2 for s in ("base_full_cache", "joint"))
    for strategy, body in fr.items():
        assert body["totals"]["total_g"] == pytest.approx(sum(h["total_g"] for h in body["hours"]))
        assert last["summary"]["FR"][strategy]["total_g"] == pytest.approx(body["totals"]["total_g"])
        for h in body["hours"]:
            assert h["total_g"] == pytest.approx(h["operational_g"] + h["embodied_compute_g"] + h["embodied_storage_g"])
            assert 0 <= h["attainment_fraction"] <= 1 and h["requests_measured"] > 0
    # The carbon plot shows each strategy's hourly totals; the CI plot the actual values of the grid's CSV.
    carbon = plotted_series(out / "FR_carbon.png")
    assert carbon == {s: [h["total_g"] for h in fr[s]["hours"]] for s in fr}
    ci = plotted_series(out / "FR_ci.png")
    assert ci["actual"] == list(grids.shipped()["FR"].window(1657065600, 2))
    assert set(plotted_series(out / "FR_attainment.png")) == set(fr)
    page = (out / "index.html").read_text()
    assert "FR_carbon.png" in page and "base_full_cache" in page and "How far to trust it" in page


@pytest.mark.parametrize(("content", "message"), [
    # a gap in the evaluated day (2022-07-06 05:00; one before the day is history the forecast skips)
    ("t,ci\n" + "".join(f"2022-07-0{3 + h // 24}T{h % 24:02d}:00Z,10\n" for h in range(96) if h != 77),
     "gap before row 79: no CI for 2022-07-06T05:00"),
    ("t,ci\n2022-07-01T00:00Z,10\n2022-07-01T01:00Z,-4\n", "row 3: column 'ci'"),
    ("t,ci\n2022-07-01T00:00Z,ten\n", "row 2: column 'ci'"),
    ("time,value\n2022-07-01T00:00Z,10\n", "column 't' (--time-column) not found"),
])
def test_bad_ci_csv_is_refused_naming_the_row_or_column(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "grid.csv"
    path.write_text(content)
    run = subprocess.run([*CLI, "--ci-csv", str(path), "--time-column", "t", "--value-column", "ci", "--out",
                          str(tmp_path / "r")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert message in run.stderr, run.stderr


def test_bad_scenario_and_flags_exit_2(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text("pools:\n  - name: chat\n    engins: 3\n")
    run = subprocess.run([*CLI, "--scenario", str(scenario)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "pools[0]: unknown key 'engins'" in run.stderr
    for flags, text in ((["--strategies", "magic"], "--strategies"), (["--grids", "XX"], "--grids"),
                        (["--forecast", "crystal"], "--forecast"), (["--hours", "30"], "--hours")):
        run = subprocess.run([*CLI, *flags], capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and text in run.stderr, (flags, run.stderr)


@pytest.mark.parametrize("flag", ["--ci-csv", "--scenario"])
def test_a_file_that_is_not_utf8_exits_2(tmp_path: Path, flag: str) -> None:
    """A CI CSV or scenario file that is not UTF-8 text ended in a UnicodeDecodeError traceback (exit 1): the
    readers turned only OSError into their clean refusal (found by an adversarial audit of the greenserve CLI)."""
    path = tmp_path / ("grid.csv" if flag == "--ci-csv" else "s.yaml")
    path.write_bytes(b"t,ci\n2022-07-01T00:00Z,\xff\xfe10\n" if flag == "--ci-csv" else b"pools: \xff\xfe\n")
    extra = ["--time-column", "t", "--value-column", "ci"] if flag == "--ci-csv" else []
    run = subprocess.run([*CLI, flag, str(path), *extra, "--out", str(tmp_path / "r")], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"{path.name}: not UTF-8 text" in run.stderr and "Traceback" not in run.stderr, run.stderr
