"""The analog-days member: tomorrow as the days that followed the moments most like today's last hours."""

from __future__ import annotations

import numpy as np
import pytest

from greenserve.forecaster.forecast_models import make_model
from greenserve.forecaster.forecast_models.analog import AnalogDays

HOURS = np.arange(24)
#: three day shapes that repeat A, B, C, A, ... : a solar dip of three depths, each day's evening its own
SHAPES = [200 - depth * np.exp(-((HOURS - 12) / 3.0) ** 2) + evening * (HOURS >= 12) * (HOURS - 12)
          for depth, evening in ((40, 2.0), (120, -3.0), (80, 0.5))]


def _cycle(days: int) -> np.ndarray:
    return np.concatenate([SHAPES[d % 3] for d in range(days)])


def test_the_day_after_a_matching_evening_is_forecast_not_yesterday() -> None:
    history = _cycle(11)  # ends with a B day (day 10: 10 % 3 == 1), so tomorrow is a C day
    forecast = AnalogDays(window_steps=12, analogs=3).fit(history).predict(24).mean
    assert np.allclose(forecast, SHAPES[2], rtol=1e-9)
    naive = make_model("seasonal_naive").fit(history).predict(24).mean
    assert np.allclose(naive, SHAPES[1])  # what seasonal naive says: B again, 40 g/kWh off at noon


def test_the_followers_are_moved_to_todays_level() -> None:
    history = _cycle(11)
    history[-24:] *= 1.5  # today is the B shape at 1.5x the level: the matches are the same, their days move up
    forecast = AnalogDays(window_steps=12, analogs=3).fit(history).predict(48).mean
    assert np.allclose(forecast[:24], SHAPES[2] * 1.5, rtol=1e-9)
    assert np.allclose(forecast[24:], forecast[:24])  # beyond one period the day repeats


def test_with_no_candidate_it_is_seasonal_naive() -> None:
    history = _cycle(1)  # 24 h: no period plus window before the end
    assert np.allclose(AnalogDays(window_steps=12).fit(history).predict(24).mean, history)


@pytest.mark.parametrize("kwargs", [{"window_steps": 0}, {"window_steps": 25}, {"analogs": 0}])
def test_bad_parameters_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        AnalogDays(**kwargs)


def test_auto_offers_the_analog_member_and_names_it() -> None:
    rng = np.random.default_rng(4)
    history = _cycle(14) * rng.lognormal(0.0, 0.02, 14 * 24)
    model = make_model("auto").fit(history, start_s=0)
    assert "analog_days(w12,k4)" in model.name
    assert np.all(np.isfinite(model.predict(24).mean))
    assert make_model("analog_days").fit(history).predict(24).model == "analog_days(w12,k4)"
