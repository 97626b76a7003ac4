"""Forecasting models by name. ``make_model(name)`` returns an unfitted model; every model has ``fit``,
``predict`` (with prediction intervals), ``update`` (online) and reports its full name with each forecast.

Names:

* ``auto`` (the service default): :class:`Combination` of seasonal naive, damped naive (decay fitted), drift
  naive (3-day level trend), the recent level (median of the last 3 h, flat), the day level (median of the last
  24 h, flat: the level without yesterday's hourly shape), the two calendar members (same day
  type, weekend shift), the 2- and 7-day profiles, a 14-day profile weighted toward recent days, analog days
  (the days that followed the 4 past moments most like the last 12 h), ETS,
  Fourier-term SARIMA and seasonal SARIMA, each weighted by 1/MAPE^p on a backtest over the last days of history
  (p = 1, or 3 with at least 7 validation days, where the log forecasts are also combined by a 20 % weighted
  trimmed mean); on short histories with a clear weekend effect, the weekend offset is taken out first, and
  without one the calendar members are left out (a 1-day validation cannot rank them).
* ``best_subset``: the same idea, the best subset of up to three members (plain mean) instead of weights.
* ``sarima``: seasonal SARIMA (1,0,0)(0,1,1)[24]; ``sarima_fourier``: ARMA(2,0,1) + 4 daily Fourier pairs;
  ``auto_arima``: pmdarima's order search with m=24 (GreenCache §5.3, slow); ``ets``; ``seasonal_naive``;
  ``daily_profile``; ``damped_naive``; ``drift_naive``; ``recent_level``; ``analog_days``; ``day_type_naive``,
  ``day_type_shift`` (calendar-aware).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from greenserve.forecaster.forecast_models.analog import AnalogDays
from greenserve.forecaster.forecast_models.base import HOURLY_PERIOD, Model, Prediction
from greenserve.forecaster.forecast_models.combination import Combination
from greenserve.forecaster.forecast_models.day_type import DayTypeNaive, DayTypeShift
from greenserve.forecaster.forecast_models.ets import Ets
from greenserve.forecaster.forecast_models.sarima import AutoSarima, Sarima, SarimaFourier
from greenserve.forecaster.forecast_models.simple import (
    DailyProfile,
    DampedNaive,
    DriftNaive,
    RecentLevel,
    SeasonalNaive,
)

DEFAULT_MODEL = "auto"


def _auto(period: int) -> Model:
    return Combination(
        members=[
            partial(SeasonalNaive, period),
            partial(DampedNaive, period, phi=None),
            partial(DriftNaive, period, days=3),
            partial(RecentLevel, period, hours=3),
            partial(RecentLevel, period, hours=period),
            partial(DayTypeNaive, period),
            partial(DayTypeShift, period),
            partial(DailyProfile, period, days=2),
            partial(DailyProfile, period, days=7),
            partial(DailyProfile, period, days=14, decay=0.6),
            partial(AnalogDays, period, window_steps=12, analogs=4),
            partial(Ets, period),
            partial(SarimaFourier, period),
            partial(Sarima, period),
        ],
        period=period,
        validation_days=12,
        weighting="inverse_mape",
        shift_scale=0.0,
        calendar_adjust=True,
        power=None,
        trim_fraction=0.2,
    )


def _best_subset(period: int) -> Model:
    """The previous default: the member subset (up to three, plain mean) that scored best in history."""
    return Combination(
        members=[
            partial(SeasonalNaive, period),
            partial(DailyProfile, period, days=2),
            partial(DailyProfile, period, days=7),
            partial(Ets, period),
            partial(SarimaFourier, period),
            partial(Sarima, period),
        ],
        period=period,
        validation_days=12,
        max_members=3,
    )


MODELS: dict[str, Callable[[int], Model]] = {
    "auto": _auto,
    "best_subset": _best_subset,
    "sarima": lambda period: Sarima(period),
    "sarima_fourier": lambda period: SarimaFourier(period),
    "auto_arima": lambda period: AutoSarima(period),
    "ets": lambda period: Ets(period),
    "seasonal_naive": lambda period: SeasonalNaive(period),
    "daily_profile": lambda period: DailyProfile(period),
    "damped_naive": lambda period: DampedNaive(period),
    "drift_naive": lambda period: DriftNaive(period),
    "recent_level": lambda period: RecentLevel(period),
    "analog_days": lambda period: AnalogDays(period),
    "day_type_naive": lambda period: DayTypeNaive(period),
    "day_type_shift": lambda period: DayTypeShift(period),
}


def make_model(name: str = DEFAULT_MODEL, period: int = HOURLY_PERIOD) -> Model:
    """An unfitted model; raises ``KeyError`` for an unknown name."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name](period)


__all__ = ["DEFAULT_MODEL", "MODELS", "Model", "Prediction", "make_model"]
