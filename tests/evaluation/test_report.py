"""The operator's report (issue 35): its first section is what an operator decides on (per strategy: carbon, energy,
the worst hour's SLO attainment, cache and engine changes, one picture of the day); the method's checks are an
appendix; and every plot is readable for any number of hours (a one-hour run drew a single dot on an x axis from
-0.04 to 0.04)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from greenserve.evaluation import operator_table, report, run
from greenserve.evaluation.plots import plotted_axes, plotted_series

GIB = 1 << 30


def _hour(h: int, strategy: str) -> dict[str, Any]:
    joint = strategy == "joint"
    return {"hour": h, "ci_actual_g_per_kwh": 200.0 + 10 * h, "ci_forecast_g_per_kwh": 205.0 + 10 * h,
            "load_actual_requests_per_s": 4.0, "load_forecast_requests_per_s": 4.2,
            "operational_g": 80.0 if joint else 240.0, "embodied_compute_g": 2.0, "embodied_storage_g": 1.0,
            "total_g": 83.0 if joint else 243.0, "energy_kwh": 0.37 if joint else 1.1,
            "attainment_fraction": 0.85 if joint and h == 2 else 0.97, "ttft_attainment_fraction": 0.98,
            "tpot_attainment_fraction": 0.98, "plan_changed": False,
            "cache_bytes": {"chat": (8 if joint and h % 6 == 5 else 64) * GIB},
            "engines_weighted": {"chat": 2 if joint and h >= 12 else 4}, "serving_modes": {"chat": "Standalone"},
            "mig_layout": {}, "accuracy_loss_fraction": 0.0}


def _result(hours: int, headlines: bool = True) -> dict[str, Any]:
    grids = {"ES": {}}
    for strategy in ("base_full_cache", "joint"):
        records = [_hour(h, strategy) for h in range(hours)]
        grids["ES"][strategy] = {"hours": records, "totals": run.totals(records)}
    return {"day": "2022-07-06", "hours": hours, "forecast_model": "oracle", "window_s": 600.0,
            "strategies": list(grids["ES"]), "strategy_descriptions": {s: f"{s} described" for s in grids["ES"]},
            "scenario": [{"attainment_fraction": 0.9}], "grids": grids,
            "summary": {"ES": {s: {"total_g": b["totals"]["total_g"]} for s, b in grids["ES"].items()}},
            "simplifications": "the replay's simplifications",
            "headlines": [{"name": "greencache", "status": "missing", "error": "not landed"}] if headlines else [],
            "fidelity": []}


def test_operator_rows_count_the_changes_and_the_worst_hour() -> None:
    base, joint = operator_table.rows(_result(24)["grids"]["ES"])
    assert base["cache_changes"] == 0 and base["engine_changes"] == 0 and base["saved_fraction"] == 0
    # the cache shrinks at 05, 11, 17, 23 and grows back the hour after (three times within the day); two engines
    # stop being weighted at 12:00
    assert joint["cache_changes"] == 7 and joint["engine_changes"] == 1
    assert (joint["worst_attainment_fraction"], joint["worst_hour"]) == (0.85, 2)
    assert joint["carbon_kg"] == pytest.approx(24 * 0.083) and joint["energy_kwh"] == pytest.approx(24 * 0.37)
    assert joint["saved_fraction"] == pytest.approx(1 - 83 / 243)


@pytest.mark.parametrize("hours", [1, 24])
def test_the_report_opens_with_the_operators_table_and_reads_for_any_hours(hours: int, tmp_path: Path) -> None:
    index = report.write(_result(hours), tmp_path)
    page = index.read_text()
    sections = re.findall(r"<section id=['\"](\w+)['\"]", page)
    assert sections == ["operator", "hours", "strategies", "appendix"]
    first = page.split("<section", 2)[1]
    assert "<table>" in first and "ES_day.png" in first
    assert all(s in first for s in ("base_full_cache", "joint", "kgCO2e", "kWh", "SLO attainment, worst hour",
                                    "cache changes", "engine changes"))
    appendix = page.split("<section id=\"appendix\">")[1]
    assert "how we checked the method" in page.split("<section id=\"appendix\">")[1].split("</h2>")[0]
    assert "headlines, reproduced in their own settings" in appendix and "reproduced" not in first
    assert plotted_series(tmp_path / "ES_day.png")["grid CI"] == [200.0 + 10 * h for h in range(hours)]
    for png in sorted(tmp_path.glob("*.png")):
        axes, series = plotted_axes(png), plotted_series(png)
        values = [v for label, vs in series.items() if label != "grid CI" for v in vs]  # the CI: a right axis
        assert axes["kind"] == ("bars" if hours == 1 else "lines"), png.name
        assert axes["xlim"][1] - axes["xlim"][0] >= hours, png.name  # every hour shown, not a dot in +-0.04
        lo, hi = axes["ylim"]
        assert 0 <= lo < min(values) and hi > max(values), (png.name, axes)
        if not png.name.endswith("_attainment.png"):
            assert lo == 0, (png.name, axes)  # amounts from zero


def test_without_the_checks_the_appendix_says_how_to_run_them(tmp_path: Path) -> None:
    page = report.write(_result(1, headlines=False), tmp_path).read_text()
    assert "--headlines quick" in page.split("<section id=\"appendix\">")[1]
