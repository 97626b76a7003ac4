"""Forecasting models: intervals, online update, persistence by pickle, names that say what produced a forecast."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from greenserve.forecaster.forecast_models import MODELS, make_model

from .conftest import daily_series


@pytest.mark.parametrize("name", ["sarima", "sarima_fourier", "ets", "seasonal_naive", "daily_profile"])
def test_fit_predict_interval_pickle_update(name: str) -> None:
    y = daily_series(5, noise=2.0, seed=1)
    model = make_model(name).fit(y[:-24])
    pred = model.predict(24, 0.9)
    assert pred.model == model.name and pred.model.startswith(name.split("_")[0])
    assert np.all(pred.lower <= pred.mean) and np.all(pred.mean <= pred.upper)
    assert np.all(pred.upper - pred.lower > 0)
    narrow = model.predict(24, 0.5)
    assert np.all(narrow.upper - narrow.lower <= pred.upper - pred.lower + 1e-9)
    restored = pickle.loads(pickle.dumps(model))
    assert np.allclose(restored.predict(24).mean, pred.mean, rtol=1e-6)
    restored.update(y[-24:-12])  # 12 new hours: the forecast now starts 12 h later
    moved = restored.predict(12).mean
    assert np.mean(np.abs(moved - y[-12:]) / y[-12:]) < 0.1


def test_fourier_sarima_recovers_from_an_estimate_on_the_stationarity_boundary(data_dir) -> None:
    # A real window (CISO 2022 life-cycle, the 336 h before 2022-12-22, the fixture's first 336 rows): from
    # statsmodels' default start L-BFGS stopped at AR roots of modulus 1 and a constant of 5e6, and the forecasts
    # alternated between inf and 0.
    from greenserve.forecaster.csv_sources import read_csv_series, to_grid

    grid = to_grid(read_csv_series(data_dir / "US-CAL-CISO_2022_hourly.csv", signal="lifecycle"))
    assert grid.start_s == 1_670_457_600  # 2022-12-08T00:00Z
    history = grid.values[:336]
    model = make_model("sarima_fourier").fit(history)
    mean = model.predict(24).mean
    assert np.all(np.isfinite(mean))
    assert np.nanmin(history) / 2 < mean.min() and mean.max() < np.nanmax(history) * 2
    assert np.all(np.isfinite(model.forecast_z_from(model.z[:48], 24)))  # the combination's validation too


def test_a_sarima_estimate_that_stays_diverged_is_refused(monkeypatch) -> None:
    from greenserve.forecaster.forecast_models import sarima

    monkeypatch.setattr(sarima._StateSpaceModel, "_diverged", lambda self, results, endog, n: True)
    with pytest.raises(ValueError, match="diverged"):
        make_model("sarima_fourier").fit(daily_series(5, noise=2.0, seed=3))
    combined = make_model("auto").fit(daily_series(5, noise=2.0, seed=3))  # the combination leaves it out
    assert "sarima" not in combined.name and np.all(np.isfinite(combined.predict(24).mean))


def test_an_often_idle_series_gets_an_interval_on_its_own_scale() -> None:
    # 90 % of hours idle (0 req/s), bursts otherwise: the median is 0, yet the log offset must stay on the data's
    # scale and the interval must cover the zeros, not put its upper end millions of times above the bursts
    rng = np.random.default_rng(0)
    y = np.where(rng.random(360) < 0.9, 0.0, rng.exponential(1.0, 360))
    model = make_model("auto").fit(y[:336], start_s=0)
    assert model.transform.offset >= 0.1 * y[:336].mean()
    pred = model.predict(24)
    assert np.all(np.isfinite(pred.upper)) and pred.upper.max() < 10 * y[:336].max()
    assert np.all(pred.lower >= 0) and np.mean((y[336:] >= pred.lower) & (y[336:] <= pred.upper)) >= 0.75


def test_sarima_update_uses_new_observations() -> None:
    y = daily_series(5, noise=2.0, seed=2)
    model = make_model("sarima").fit(y[:-24])
    before = model.predict(1).mean[0]
    model.update(np.array([y[-24] * 1.5]))  # a surprise: the next step must react
    after = model.predict(1).mean[0]
    assert after != pytest.approx(before)


def test_combination_names_its_members_and_keeps_sarima_in_the_family() -> None:
    y = daily_series(6, noise=3.0, seed=4)
    model = make_model("auto").fit(y)
    pred = model.predict(24)
    assert pred.model.startswith("weighted[") and pred.model == model.name
    assert any("sarima" in name for name in model.validation_mape_percent)
    assert np.all(pred.lower <= pred.mean) and np.all(pred.mean <= pred.upper)
    clone = pickle.loads(pickle.dumps(model))
    assert clone.name == model.name and np.allclose(clone.predict(24).mean, pred.mean, rtol=1e-6)


def test_missing_values_in_history_are_tolerated() -> None:
    y = daily_series(5, noise=1.0)
    y[30:36] = np.nan
    for name in MODELS:
        if name == "auto_arima":
            continue  # slow order search; covered by the benchmark option
        pred = make_model(name).fit(y).predict(24)
        assert np.isfinite(pred.mean).all(), name


def test_unknown_model_is_refused() -> None:
    with pytest.raises(KeyError, match="unknown model"):
        make_model("prophet")


def test_damped_naive_starts_from_the_last_hour_and_decays_to_seasonal_naive() -> None:
    y = daily_series(4)
    y[-1] *= 1.2  # the last hour is 20 % above the day before
    pred = make_model("damped_naive").fit(y).predict(48).mean
    naive = np.tile(y[-24:], 2)
    assert pred[0] == pytest.approx(naive[0] * 1.2 ** 0.8, rel=1e-9)
    assert pred[-1] == pytest.approx(naive[-1], rel=1e-3)
    assert np.all(np.abs(np.log(pred / naive))[1:] <= np.abs(np.log(pred / naive))[:-1] + 1e-12)


def test_decayed_profile_weighs_recent_days_more() -> None:
    from greenserve.forecaster.forecast_models.simple import DailyProfile

    y = np.concatenate([np.full(24 * 3, 100.0), np.full(24, 200.0)])
    flat = DailyProfile(days=4).fit(y).predict(24).mean
    recent = DailyProfile(days=4, decay=0.5).fit(y).predict(24).mean
    assert np.all(recent > flat) and np.all(recent < 200.0)
    # weights 1, 0.5, 0.25, 0.125 in log space
    expected = np.exp((np.log(200.0) + (0.5 + 0.25 + 0.125) * np.log(100.0)) / 1.875)
    assert recent[0] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("name", ["damped_naive", "auto"])
def test_new_members_never_see_values_after_their_history(name: str) -> None:
    # forecasts from a history must not change when values after it change: each member scores its
    # validation days only from the data before them, and the target day is never passed in
    rng = np.random.default_rng(7)
    y = daily_series(16, noise=4.0, seed=7)
    a = make_model(name).fit(y[:-24]).predict(24).mean
    y2 = y.copy()
    y2[-24:] = rng.uniform(1, 1000, 24)
    b = make_model(name).fit(y2[:-24]).predict(24).mean
    assert np.array_equal(a, b)
    if name == "damped_naive":  # its in-history validation forecast equals a fit on the prefix alone
        model = make_model(name).fit(y)
        origin = len(model.z) - 48
        assert np.allclose(model.forecast_z_from(model.z[:origin], 24),
                           make_model(name).fit(y[:origin])._predict_z(24)[0])


def test_weighted_combination_weights_sum_to_one_and_shift_down() -> None:
    from functools import partial

    from greenserve.forecaster.forecast_models.combination import Combination
    from greenserve.forecaster.forecast_models.simple import DailyProfile, SeasonalNaive

    y = daily_series(10, noise=6.0, seed=5)
    model = make_model("auto").fit(y)
    assert model.weights is not None and model.weights.sum() == pytest.approx(1.0)
    assert len(model.weights) == len(model.chosen) == len(model.members)
    assert model.log_shift == 0.0  # auto: no MAPE shift
    members = [partial(SeasonalNaive), partial(DailyProfile, days=3)]
    plain = Combination(members, validation_days=5, weighting="inverse_mape", shift_scale=0.0).fit(y)
    shifted = Combination(members, validation_days=5, weighting="inverse_mape", shift_scale=1.0).fit(y)
    assert shifted.log_shift < 0.0  # the MAPE-optimal point of a log-normal lies below its median
    assert np.allclose(shifted.predict(24).mean, plain.predict(24).mean * np.exp(shifted.log_shift))
    best = min(model.validation_mape_percent, key=model.validation_mape_percent.get)
    top = max(range(len(model.chosen)), key=lambda i: model.weights[i])
    assert model.members[model.chosen[top]].name == best
    assert model.name.startswith("weighted[") and "sarima" in model.name
