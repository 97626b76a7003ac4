"""Calendar awareness: weekdays of the history, the day-type members, the combination's weekend adjustment,
and the damped naive whose decay is fitted on the history."""

from __future__ import annotations

import pickle

import numpy as np
from greenserve.forecaster.forecast_models import make_model
from greenserve.forecaster.forecast_models.base import MAX_KEPT_STEPS
from greenserve.forecaster.forecast_models.holiday_calendar import weekday_of
from greenserve.forecaster.forecast_models.day_type import DayTypeNaive, DayTypeShift
from greenserve.forecaster.forecast_models.simple import (
    PHI_GRID,
    DampedNaive,
    SeasonalNaive,
)

FRIDAY_S = 1_715_299_200  # 2024-05-10T00:00:00Z, a Friday (the Azure LLM 2024 week starts there)


def office_load(days: int, start_s: int = FRIDAY_S, weekday_level: float = 30.0, weekend_level: float = 11.0,
                noise: float = 0.02, seed: int = 0) -> np.ndarray:
    """Hourly load with a daily cycle, ~3x lower on Saturdays and Sundays (UTC), multiplicative noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(days * 24)
    weekend = weekday_of(start_s + 3600 * t) >= 5
    level = np.where(weekend, weekend_level, weekday_level)
    return level * (1.0 + 0.4 * np.sin(2 * np.pi * (t - 6) / 24)) * np.exp(rng.normal(0, noise, len(t)))


def test_weekday_of_known_dates() -> None:
    assert weekday_of(np.array([FRIDAY_S, FRIDAY_S + 86_400, FRIDAY_S + 3 * 86_400 - 1, 0])).tolist() == [4, 5, 6, 3]


def test_day_type_naive_takes_friday_for_monday_and_is_seasonal_naive_without_calendar() -> None:
    y = office_load(4)  # Fri, Sat, Sun history; Monday to forecast
    history, monday = y[:72], y[72:]
    with_calendar = DayTypeNaive().fit(history, start_s=FRIDAY_S).predict(24).mean
    assert np.allclose(with_calendar, history[:24])  # Friday, the last day of the same type
    assert np.mean(np.abs(with_calendar - monday) / monday) < 0.1
    blind = DayTypeNaive().fit(history).predict(24).mean
    assert np.allclose(blind, SeasonalNaive().fit(history).predict(24).mean)
    # a Saturday after weekdays only: no weekend day in the history, so yesterday unchanged
    weekdays = office_load(4, start_s=FRIDAY_S - 3 * 86_400)[:72]  # Tue, Wed, Thu
    sat = DayTypeNaive().fit(weekdays, start_s=FRIDAY_S - 3 * 86_400).predict(48).mean  # Fri and Sat
    assert np.allclose(sat[:24], weekdays[-24:]) and np.allclose(sat[24:], weekdays[-24:])


def test_day_type_shift_scales_sunday_to_the_weekday_level_for_monday() -> None:
    y = office_load(4, noise=0.0)
    pred = DayTypeShift().fit(y[:72], start_s=FRIDAY_S).predict(24).mean
    assert np.allclose(pred, y[72:], rtol=1e-6)  # exact when the only difference is the day type
    same_type = DayTypeShift().fit(y[24:72], start_s=FRIDAY_S + 86_400).predict(24).mean  # Sat, Sun -> Mon
    assert np.allclose(same_type, y[48:72])  # no weekday in history: nothing to scale by


def test_auto_with_calendar_forecasts_monday_after_a_weekend() -> None:
    y = office_load(4, seed=3)
    history, monday = y[:72], y[72:]
    calendar = make_model("auto").fit(history, start_s=FRIDAY_S)
    blind = make_model("auto").fit(history)
    cal_mape = np.mean(np.abs(calendar.predict(24).mean - monday) / monday)
    blind_mape = np.mean(np.abs(blind.predict(24).mean - monday) / monday)
    assert cal_mape < 0.1 < blind_mape
    assert calendar.name.endswith("+weekend_offset") and not blind.name.endswith("+weekend_offset")
    pred = calendar.predict(24, 0.9)
    assert np.all(pred.lower <= pred.mean) and np.all(pred.mean <= pred.upper)
    clone = pickle.loads(pickle.dumps(calendar))
    assert np.allclose(clone.predict(24).mean, pred.mean)
    # online: Monday's first 12 hours arrive; the rest of Monday keeps the weekday level
    clone.update(monday[:12])
    rest = clone.predict(12).mean
    assert np.mean(np.abs(rest - monday[12:]) / monday[12:]) < 0.1


def test_calendar_adjustment_skips_histories_without_a_clear_weekend_effect() -> None:
    flat = office_load(4, weekend_level=30.0, noise=0.05, seed=4)  # no weekend effect at all
    assert make_model("auto").fit(flat[:72], start_s=FRIDAY_S).weekend_offset is None
    long = office_load(14, seed=5)  # two weeks: the members' 12-day validation covers day-type switches
    assert make_model("auto").fit(long[:13 * 24], start_s=FRIDAY_S).weekend_offset is None


def test_start_time_moves_with_the_kept_window() -> None:
    model = DayTypeNaive().fit(office_load(MAX_KEPT_STEPS // 24), start_s=FRIDAY_S)
    model.update(np.full(48, 20.0))
    times = model.times_of(0, len(model.z))
    assert len(model.z) == MAX_KEPT_STEPS and times is not None
    assert times[-1] == FRIDAY_S + (MAX_KEPT_STEPS + 48 - 1) * 3600


def test_damped_naive_fits_its_decay_on_the_history() -> None:
    rng = np.random.default_rng(11)
    days = 14
    # a level that wanders hour by hour (a random walk): the last hour's change over a day persists
    level = np.cumsum(rng.normal(0, 0.05, days * 24))
    y = 100 * np.exp(level + 0.3 * np.sin(2 * np.pi * np.arange(days * 24) / 24))
    fitted = DampedNaive(phi=None).fit(y)
    assert fitted.phi in PHI_GRID and fitted.phi >= 0.9
    assert "fitted" in fitted.name
    # iid day-to-day noise around a fixed cycle: the last hour's change says nothing, phi shrinks
    noisy = 100 * np.exp(0.3 * np.sin(2 * np.pi * np.arange(days * 24) / 24) + rng.normal(0, 0.2, days * 24))
    assert DampedNaive(phi=None).fit(noisy).phi <= 0.5
    assert DampedNaive(phi=0.8).fit(noisy).phi == 0.8  # a fixed phi stays fixed


def test_worker_fit_keeps_the_calendar() -> None:
    from greenserve.forecaster.fitting import fit_blob, load_blob

    y = office_load(4, seed=6)
    model = load_blob(fit_blob("auto", y[:72], 24, FRIDAY_S).blob)
    assert model.start_s == FRIDAY_S and model.weekend_offset is not None
    assert all(member.start_s == FRIDAY_S for member in model.members)
