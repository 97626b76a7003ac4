"""The demo's report opens with what an operator decides on and one picture of the day, and its plots read for a
one-hour demo as for a whole day (issue 35)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from greenserve_client.demo_report import summary, write_report

from greenserve.evaluation.plots import plotted_axes, plotted_series


def _hours(n: int) -> list[dict[str, Any]]:
    return [{"hour": h, "ci_actual_g_per_kwh": 120.0 + h, "plan_version": 1 + h // 2, "trigger": "schedule",
             "fleet_matches_plan": h != 1, "expected_total_g": 400.0, "enforcement": {"router/r": "APPLIED"},
             "cache_dram_bytes": (1 if h < 3 else 2) << 30, "requests_ok": 100, "requests_failed": h % 2,
             "latency_p50_s": 0.5, "latency_p99_s": 1.0 + (h == 3), "load_target_requests_per_s": 1.0}
            for h in range(n)]


def test_summary_counts_what_changed_and_the_worst_hour() -> None:
    s = summary(_hours(24))
    assert s["expected_carbon_kg"] == pytest.approx(24 * 0.4)
    assert (s["requests_ok"], s["requests_failed"]) == (2400, 12)
    assert (s["worst_p99_latency_s"], s["worst_p99_hour"]) == (2.0, 3)
    assert (s["plan_changes"], s["cache_changes"], s["hours_fleet_matched"]) == (11, 1, 23)


@pytest.mark.parametrize("n", [1, 24])
def test_the_demo_report_opens_with_the_operators_table(n: int, tmp_path: Path) -> None:
    page = write_report({"grid": "ES", "day": "2022-07-06", "minutes": 20.0, "speed": 72.0, "hours": _hours(n)},
                        tmp_path).read_text()
    assert re.findall(r"<section id='(\w+)'", page) == ["operator", "hours"]
    first = page.split("<section", 2)[1]
    assert "<table>" in first and "day.png" in first and "kgCO2e the plans expected" in first
    assert plotted_series(tmp_path / "day.png")["grid CI"] == [120.0 + h for h in range(n)]
    for png in tmp_path.glob("*.png"):
        axes = plotted_axes(png)
        assert axes["kind"] == ("bars" if n == 1 else "lines") and axes["xlim"][1] - axes["xlim"][0] >= n, png.name
        assert axes["ylim"][0] == 0 and axes["ylim"][1] > 0, png.name
