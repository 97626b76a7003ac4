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
    assert pred.model.startswith("combination[") and pred.model == model.name
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
