"""The drift and recent-level members and the evidence rules of ``auto``: sharper weights and a trimmed mean once
the in-history backtest has enough days; flat 1/MAPE weights, and no untested calendar members, on short
histories."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from greenserve.forecaster.forecast_models import make_model
from greenserve.forecaster.forecast_models.combination import Combination, conformal_bounds, weighted_trimmed_mean
from greenserve.forecaster.forecast_models.simple import DailyProfile, DriftNaive, RecentLevel, SeasonalNaive

from .conftest import DAY0_S, daily_series
from .test_calendar import FRIDAY_S, office_load


def test_drift_naive_recovers_a_steady_level_trend() -> None:
    # every day 5 % above the day before: seasonal naive is 5 % low, drift naive carries the trend one day further
    days = 6
    y = daily_series(days + 1) * np.repeat(1.05 ** np.arange(days + 1), 24)
    pred = make_model("drift_naive").fit(y[:-24]).predict(24).mean
    assert np.allclose(pred, y[-24:], rtol=1e-9)
    naive = make_model("seasonal_naive").fit(y[:-24]).predict(24).mean
    assert np.allclose(naive, y[-24:] / 1.05, rtol=1e-9)


def test_drift_naive_is_seasonal_naive_on_a_flat_level_and_on_one_day() -> None:
    y = daily_series(5)
    assert np.allclose(DriftNaive().fit(y).predict(24).mean, y[-24:])
    assert np.allclose(DriftNaive().fit(y[-24:]).predict(24).mean, y[-24:])  # no whole earlier day: no drift


def test_weighted_trimmed_mean_cuts_a_low_weight_outlier() -> None:
    values = np.array([[1.0, 2.0], [1.2, 2.2], [9.0, -5.0]])
    weights = np.array([0.45, 0.45, 0.10])
    plain = weighted_trimmed_mean(values, weights, 0.0)
    assert np.allclose(plain, (weights[:, None] * values).sum(axis=0))
    trimmed = weighted_trimmed_mean(values, weights, 0.2)
    # the outlier's 10 % of mass lies entirely in the cut tail, on either side
    assert np.all(trimmed >= values[:2].min(axis=0)) and np.all(trimmed <= values[:2].max(axis=0))
    assert trimmed[0] == pytest.approx((0.45 - 0.2) * 1.0 / 0.6 + 0.35 * 1.2 / 0.6)
    near_median = weighted_trimmed_mean(np.array([[1.0], [2.0], [30.0]]), np.ones(3), 0.49)
    assert near_median[0] == pytest.approx(2.0)


def test_evidence_rule_sharpens_and_trims_only_with_enough_validation_days() -> None:
    members = [partial(SeasonalNaive), partial(DailyProfile, days=3), partial(DriftNaive)]
    y = daily_series(16, noise=6.0, seed=3)
    long = Combination(members, validation_days=12, weighting="inverse_mape", shift_scale=0.0, power=None,
                       trim_fraction=0.2).fit(y)
    assert (long.power_used, long.trim_used) == (3.0, 0.2)
    assert "~p3~trim0.2" in long.name
    mapes = np.array([long.validation_mape_percent[long.members[i].name] for i in long.chosen])
    assert np.allclose(long.weights, mapes**-3 / np.sum(mapes**-3))
    short = Combination(members, validation_days=12, weighting="inverse_mape", shift_scale=0.0, power=None,
                        trim_fraction=0.2).fit(y[-72:])  # 72 h: one validation day
    assert (short.power_used, short.trim_used) == (1.0, 0.0)
    assert "trim" not in short.name and "~p1" in short.name
    mapes = np.array([short.validation_mape_percent[short.members[i].name] for i in short.chosen])
    assert np.allclose(short.weights, mapes**-1 / np.sum(mapes**-1))
    with pytest.raises(ValueError, match="trim_fraction"):
        Combination(members, trim_fraction=0.5)


def test_auto_on_two_weeks_uses_the_drift_member_and_the_trimmed_combination() -> None:
    y = daily_series(14, noise=5.0, seed=11) * np.repeat(1.03 ** np.arange(14), 24)
    model = make_model("auto").fit(y, start_s=DAY0_S)
    assert any(m.name.startswith("drift_naive") for m in model.members)
    assert model.trim_used == pytest.approx(0.2) and model.power_used == 3.0
    pred = model.predict(24)
    assert np.all(pred.lower <= pred.mean) and np.all(pred.mean <= pred.upper)
    # the steady 3 %/day rise: the drift member is among the best scored in the history
    ranked = sorted(model.validation_mape_percent, key=model.validation_mape_percent.get)
    assert "drift_naive(3d)" in ranked[:3]


def test_recent_level_holds_the_median_of_the_last_hours() -> None:
    y = daily_series(3)
    y[-3:] = [500.0, 520.0, 5000.0]  # a step up in the last hours, and one odd hour
    pred = make_model("recent_level").fit(y).predict(24)
    assert pred.model == "recent_level(3h)"
    assert np.allclose(pred.mean, 520.0)  # the median: the odd hour does not set the level
    assert np.all(pred.lower <= pred.mean) and np.all(pred.mean <= pred.upper)
    y[-1] = np.nan  # a missing last hour takes the value a day earlier, as in seasonal naive
    assert np.allclose(RecentLevel(hours=3).fit(y).predict(5).mean, np.median([500.0, 520.0, y[-25]]))
    assert np.allclose(RecentLevel(hours=1).fit(y[:-1]).predict(2).mean, 520.0)
    with pytest.raises(ValueError, match="hours"):
        RecentLevel(hours=0)


def day_type_members_weighted(model: Combination) -> list[str]:
    return [model.members[i].name for i in model.chosen if model.members[i].day_type_aware]


def test_short_history_without_a_weekend_effect_leaves_the_calendar_members_out() -> None:
    # Fri, Sat, Sun with the same level every day (a trace without a weekly cycle, e.g. made-up dates): the one
    # validation day (Sun after Sat) never crosses a day-type change, so nothing ranks the calendar members, and
    # they would carry Friday into Monday at seasonal naive's weight
    flat = office_load(4, weekend_level=30.0, noise=0.05, seed=4)
    short = make_model("auto").fit(flat[:72], start_s=FRIDAY_S)
    assert short.weekend_offset is None
    assert day_type_members_weighted(short) == []
    assert any(m.day_type_aware for m in short.members)  # fitted, only not weighted
    assert "day_type" not in short.name
    # a clear weekend effect in the same 72 h: they stay, with the weekend adjustment
    office = make_model("auto").fit(office_load(4, seed=3)[:72], start_s=FRIDAY_S)
    assert office.weekend_offset is not None and len(day_type_members_weighted(office)) == 2
    # two weeks: the 12 validation days cross day-type changes and rank them
    long = make_model("auto").fit(office_load(14, weekend_level=30.0, seed=5)[:13 * 24], start_s=FRIDAY_S)
    assert len(day_type_members_weighted(long)) == 2


def test_auto_follows_a_level_step_that_persists() -> None:
    # flat load with no daily pattern whose level doubled six hours before the end of the history and stays:
    # seasonal naive repeats yesterday (half the level most of the day), the recent level does not
    rng = np.random.default_rng(2)
    y = 1000.0 * np.exp(rng.normal(0, 0.03, 96))
    y[66:] *= 2.0
    history, truth = y[:72], y[72:]
    model = make_model("auto").fit(history, start_s=DAY0_S)
    assert any(model.members[i].name == "recent_level(3h)" for i in model.chosen)
    ape = np.mean(np.abs(model.predict(24).mean - truth) / truth)
    naive_ape = np.mean(np.abs(make_model("seasonal_naive").fit(history).predict(24).mean - truth) / truth)
    assert ape < 0.8 * naive_ape


def test_day_level_member_for_load_without_a_daily_shape() -> None:
    # load that wanders around a level with no daily pattern: yesterday's hourly shape is noise, and seasonal
    # naive carries it into today (error variance 2 s^2); the median of the last 24 h held flat does not
    def ape(forecast: np.ndarray, truth: np.ndarray) -> np.ndarray:
        return np.abs(forecast - truth) / truth

    naive, day_level, auto = [], [], []
    for seed in range(12):  # one day of noise decides little: pool the errors of 12 series
        y = 1500.0 * np.exp(np.random.default_rng(seed).normal(0, 0.25, 96))
        history, truth = y[:72], y[72:]
        flat = RecentLevel(hours=24).fit(history).predict(24)
        assert flat.model == "recent_level(24h)"
        assert np.allclose(flat.mean, np.exp(np.median(np.log(history[-24:]))))  # the median in log space
        model = make_model("auto").fit(history, start_s=DAY0_S)
        assert "recent_level(24h)" in [model.members[i].name for i in model.chosen]
        naive.append(ape(SeasonalNaive().fit(history).predict(24).mean, truth))
        day_level.append(ape(flat.mean, truth))
        auto.append(ape(model.predict(24).mean, truth))
    naive_mape = np.concatenate(naive).mean()
    assert np.concatenate(day_level).mean() < 0.85 * naive_mape
    assert np.concatenate(auto).mean() < 0.9 * naive_mape


def test_conformal_bounds_use_order_statistics_that_cover_on_small_samples() -> None:
    errors = np.arange(1.0, 25.0)  # 24 errors: one validation day
    assert conformal_bounds(errors, 0.9) == (1.0, 24.0)  # ranks floor(25 x 0.05) = 1 and min(24, ceil(25 x 0.95))
    assert np.quantile(errors, 0.95) < 24.0  # what interpolation gave: inside the sample's tail
    many = np.arange(1.0, 289.0)  # 12 days
    assert conformal_bounds(many, 0.9) == (14.0, 275.0)
    assert conformal_bounds(many, 0.5) == (72.0, 217.0)
    # the combination's interval on one validation day spans the extreme validation errors
    model = make_model("auto").fit(daily_series(3, noise=5.0, seed=2), start_s=DAY0_S)
    pred = model.predict(24, 0.9)
    z = np.log(pred.mean)
    assert model.log_error_quantiles is not None
    assert np.all(np.log(pred.upper) >= z + model.log_error_quantiles[-1] - 1e-9)
    assert np.all(np.log(pred.lower) <= z + model.log_error_quantiles[0] + 1e-9)
