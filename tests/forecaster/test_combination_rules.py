"""The drift member and the evidence rule of ``auto``: sharper weights and a trimmed mean once the in-history
backtest has enough days, plain 1/MAPE^2 weights on short histories."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from greenserve.forecaster.forecast_models import make_model
from greenserve.forecaster.forecast_models.combination import Combination, weighted_trimmed_mean
from greenserve.forecaster.forecast_models.simple import DailyProfile, DriftNaive, SeasonalNaive

from .conftest import DAY0_S, daily_series


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
    assert (short.power_used, short.trim_used) == (2.0, 0.0)
    assert "trim" not in short.name
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
