"""Backtest windows: which days, which history, and that the target day is never seen."""

from __future__ import annotations

import numpy as np
import pytest

from greenserve.forecaster.backtest import backtest_days, naive_forecast, run_backtest
from greenserve.forecaster.csv_sources import RegularSeries

from .conftest import DAY0_S, daily_series


def series(values: np.ndarray, start_s: int = DAY0_S) -> RegularSeries:
    return RegularSeries("synthetic", start_s, 3600, np.asarray(values, dtype=float))


def test_days_are_the_last_whole_utc_days_with_full_history() -> None:
    # starts at 05:00 and ends at 10:00 on day 9: day 9 is not whole; day 0 is not whole either
    values = daily_series(10)[5:24 * 9 + 10]
    s = series(values, DAY0_S + 5 * 3600)
    starts = backtest_days(s, 72, 24, 3)
    day_starts = [s.start_s + i * 3600 for i in starts]
    assert day_starts == [DAY0_S + d * 86400 for d in (6, 7, 8)]
    # with 7 days asked only those with 72 h before them exist: days 4..8 (day 3 lacks 5 hours of history)
    assert len(backtest_days(s, 72, 24, 7)) == 5
    with pytest.raises(ValueError, match="no whole day"):
        backtest_days(series(daily_series(3)), 72, 24, 1)


def test_clean_daily_cycle_scores_zero_for_naive_and_counts_points() -> None:
    result = run_backtest(series(daily_series(8)), history_hours=72, horizon_hours=24, days=3,
                          model="seasonal_naive")
    assert result.points == 72 and result.mape == pytest.approx(0.0, abs=1e-9)
    assert result.naive_mape == pytest.approx(0.0, abs=1e-9)
    assert [d.day_s for d in result.days] == [DAY0_S + d * 86400 for d in (5, 6, 7)]


def test_the_model_never_sees_the_day_it_forecasts() -> None:
    values = daily_series(8)
    values[-24:] *= 10.0  # the last day is 10x: a model that peeked would forecast it
    result = run_backtest(series(values), history_hours=72, horizon_hours=24, days=1, model="daily_profile")
    assert result.mape == pytest.approx(90.0, rel=1e-6)  # |y/10 - y| / y
    assert result.naive_mape == pytest.approx(90.0, rel=1e-6)
    assert result.interval_coverage_fraction == 0.0  # 10x is outside any interval the history gives


def test_interval_coverage_counts_scored_truths_inside_the_interval() -> None:
    values = daily_series(8)
    values[-24:-12] *= 3.0  # the first half of the last day far above anything in the history
    values[-3:] = np.nan  # not scored, so not counted either
    result = run_backtest(series(values), history_hours=72, horizon_hours=24, days=2, model="seasonal_naive")
    assert result.interval_nominal_fraction == 0.9
    first, last = result.days
    assert first.interval_coverage_fraction == 1.0  # the clean cycle repeats: every truth on the forecast
    assert last.points == 21 and last.interval_coverage_fraction == pytest.approx(9 / 21)  # 12 tripled outside
    assert result.interval_coverage_fraction == pytest.approx((24 + 9) / 45)


def test_history_window_is_exactly_history_hours() -> None:
    # a level shift 48 h before the target: a 2-day profile sees only the new level with 48 h history
    values = np.concatenate([np.full(24 * 5, 100.0), np.full(24 * 3, 200.0)])
    r48 = run_backtest(series(values), history_hours=48, horizon_hours=24, days=1, model="daily_profile")
    assert r48.mape == pytest.approx(0.0, abs=1e-9)
    r96 = run_backtest(series(values), history_hours=96, horizon_hours=24, days=1, model="daily_profile")
    assert r96.mape > 10.0  # the older, lower days are in a 96 h window


def test_missing_truth_is_not_scored_and_naive_fills_a_missing_hour() -> None:
    values = daily_series(6)
    values[-5:] = np.nan
    values[-30] = np.nan  # inside the last 24 h of history of the last day
    result = run_backtest(series(values), history_hours=72, horizon_hours=24, days=1, model="seasonal_naive")
    assert result.points == 19
    assert result.naive_mape == pytest.approx(0.0, abs=1e-9)
    history = values[-48:-24]
    assert np.isfinite(naive_forecast(values[:-24], 24)).all() and np.isnan(history).any()


def test_bad_windows_are_rejected_by_name() -> None:
    s = series(daily_series(8))
    with pytest.raises(ValueError, match="history_hours"):
        run_backtest(s, history_hours=800, days=1)
    with pytest.raises(ValueError, match="horizon_hours"):
        run_backtest(s, horizon_hours=0, days=1)
    with pytest.raises(KeyError):
        run_backtest(s, days=1, model="nope")


def test_default_model_beats_naive_on_a_noisy_cycle_with_level_drift() -> None:
    rng = np.random.default_rng(3)
    t = np.arange(24 * 12)
    level = 200 + np.cumsum(rng.normal(0, 2, len(t)))
    values = level + 50 * np.sin(2 * np.pi * t / 24) + rng.normal(0, 8, len(t))
    result = run_backtest(series(values), history_hours=168, horizon_hours=24, days=2)
    assert result.model == "auto" and all(name.startswith("weighted[") for name in result.models_used)
    assert result.mape < result.naive_mape
