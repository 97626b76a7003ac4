"""`evaluate --hours N` on a CI file that ends inside the day: the forecasts and plans come from the history alone,
so only the N hours replayed need actual values; it used to refuse the file for the hours it would not replay. The
oracle forecast plans on the actual values of the whole day and still needs them all."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from greenserve.evaluation import grids, run, scenario

DAY_S = int(datetime(2023, 6, 20, tzinfo=UTC).timestamp())


def _grid(hours_into_day: int) -> grids.GridSeries:
    """Three days of history and the first ``hours_into_day`` hours of the day."""
    start = DAY_S - 3 * 86400
    return grids.GridSeries("X", start, tuple(300.0 + 10 * (h % 24) for h in range(3 * 24 + hours_into_day)))


def test_a_file_ending_inside_the_day_evaluates_its_hours() -> None:
    result = run.evaluate({"X": _grid(2)}, day_start_s=DAY_S, strategies=["base_full_cache"],
                          scenario=scenario.Scenario(), forecast_model="seasonal_naive", window_s=60.0, hours=2,
                          workers=1, fidelity=False)
    hours = result["grids"]["X"]["base_full_cache"]["hours"]
    assert [h["ci_actual_g_per_kwh"] for h in hours] == [300.0, 310.0]
    assert [h["ci_forecast_g_per_kwh"] for h in hours] == pytest.approx([300.0, 310.0])  # seasonal naive: yesterday


def test_the_hours_replayed_must_be_there_and_the_oracle_needs_the_whole_day() -> None:
    with pytest.raises(grids.GridDataError, match="no CI for 3 h from 2023-06-20"):
        run.jobs_for({"X": _grid(2)}, day_start_s=DAY_S, strategies=["base_full_cache"],
                     scenario=scenario.Scenario(), forecast_model="seasonal_naive", window_s=60.0, hours=3)
    with pytest.raises(grids.GridDataError, match="no CI for 24 h from 2023-06-20"):
        run.jobs_for({"X": _grid(2)}, day_start_s=DAY_S, strategies=["base_full_cache"],
                     scenario=scenario.Scenario(), forecast_model="oracle", window_s=60.0, hours=2)
    (job,) = run.jobs_for({"X": _grid(24)}, day_start_s=DAY_S, strategies=["base_full_cache"],
                          scenario=scenario.Scenario(), forecast_model="oracle", window_s=60.0, hours=2)
    assert len(job.ci_actual) == 24
    fc = run.day.forecast_day(np.zeros(48), DAY_S - 2 * 86400, np.array(job.ci_actual), "oracle")
    assert len(fc.mean) == 24 and fc.mean[1] == 310.0
    with pytest.raises(ValueError, match="oracle forecast needs the actual values of 24 h, got 2"):
        run.day.forecast_day(np.zeros(48), DAY_S - 2 * 86400, np.array(job.ci_actual[:2]), "oracle")
