"""Baselines that need no estimation: seasonal naive and the mean daily profile of recent days."""

from __future__ import annotations

import copy

import numpy as np

from greenserve.forecaster.forecast_models.base import HOURLY_PERIOD, Model, fill_gaps


def residual_sd(z: np.ndarray, lag: int, steps: int) -> np.ndarray:
    """Spread of the lag-``lag`` changes in history, as the standard deviation of every forecast step."""
    diffs = z[lag:] - z[:-lag] if len(z) > lag else np.array([0.0])
    diffs = diffs[np.isfinite(diffs)]
    sd = float(np.std(diffs)) if len(diffs) > 1 else 0.0
    return np.full(steps, max(sd, 1e-6))


class SeasonalNaive(Model):
    """The previous period repeated: f[t+h] = y[t+h-24] (the baseline every backtest reports)."""

    family = "seasonal_naive"

    def _fit(self) -> None:
        pass

    def _update(self, new_z: np.ndarray) -> None:
        pass

    def _predict_z(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        p = self.period
        last = fill_gaps(self.z[-2 * p:] if len(self.z) >= 2 * p else self.z, p)[-p:]
        reps = int(np.ceil(steps / p))
        return np.tile(last, reps)[:steps], residual_sd(self.z, p, steps)

    def _refiltered(self, z_history: np.ndarray) -> Model:
        clone = copy.copy(self)
        clone.z = z_history
        return clone


class DailyProfile(Model):
    """Mean (log space) of the last ``days`` periods at each hour of the day; with ``decay`` < 1 the days are
    weighted ``decay ** age`` (yesterday 1, the day before ``decay``, ...), so recent days count more."""

    family = "daily_profile"

    def __init__(self, period: int = HOURLY_PERIOD, days: int = 7, decay: float = 1.0) -> None:
        super().__init__(period)
        self.days = days
        self.decay = decay

    @property
    def name(self) -> str:
        return f"daily_profile({self.days}d)" if self.decay == 1.0 else f"daily_profile({self.days}d,ew{self.decay:g})"

    def _fit(self) -> None:
        pass

    def _update(self, new_z: np.ndarray) -> None:
        pass

    def _predict_z(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        p = self.period
        k = max(1, min(self.days, len(self.z) // p))
        block = fill_gaps(self.z[-k * p:], p).reshape(k, p)
        weights = self.decay ** np.arange(k - 1, -1, -1, dtype=np.float64)
        profile = (block * weights[:, None]).sum(axis=0) / weights.sum()
        reps = int(np.ceil(steps / p))
        return np.tile(profile, reps)[:steps], residual_sd(self.z, p, steps)

    def _refiltered(self, z_history: np.ndarray) -> Model:
        clone = copy.copy(self)
        clone.z = z_history
        return clone


#: Decay factors tried when :class:`DampedNaive` fits ``phi`` on its history.
PHI_GRID = (0.0, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)


class DampedNaive(Model):
    """Seasonal naive plus the last hour's change over a day, decaying over the horizon (log space):
    f[t+h] = z[t+h-24] + (z[t] - z[t-24]) * phi**h. The first hours of a day follow the last hours of the
    previous one (weather persists); later hours fall back to the plain seasonal naive.

    ``phi=None``: phi is fitted on the history, the value of :data:`PHI_GRID` with the least mean absolute log
    error of day-ahead forecasts from each of the last ``fit_days`` day boundaries before the history's end."""

    family = "damped_naive"

    def __init__(self, period: int = HOURLY_PERIOD, phi: float | None = 0.8, fit_days: int = 12) -> None:
        super().__init__(period)
        self.fit_phi = phi is None
        self.phi = 0.8 if phi is None else phi
        self.fit_days = fit_days

    @property
    def name(self) -> str:
        return f"damped_naive(phi{self.phi:g}{',fitted' if self.fit_phi else ''})"

    def _fit(self) -> None:
        if not self.fit_phi:
            return
        p, n = self.period, len(self.z)
        days = max(0, min(self.fit_days, n // p - 2))
        if days == 0:
            return
        z = fill_gaps(self.z, p)
        h = np.arange(1, p + 1)
        errors = np.zeros(len(PHI_GRID))
        for o in range(n - days * p, n, p):
            base = z[o - p:o]
            change = z[o - 1] - z[o - 1 - p]
            truth = self.z[o:o + p]
            ok = np.isfinite(truth)
            for k, phi in enumerate(PHI_GRID):
                errors[k] += np.abs(base + change * phi**h - truth)[ok].sum()
        self.phi = float(PHI_GRID[int(np.argmin(errors))])

    def _update(self, new_z: np.ndarray) -> None:
        pass

    def _predict_z(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        p = self.period
        z = fill_gaps(self.z[-2 * p - 1:] if len(self.z) > 2 * p else self.z, p)
        last = z[-p:]
        change = float(z[-1] - z[-1 - p]) if len(z) > p else 0.0
        h = np.arange(1, steps + 1)
        reps = int(np.ceil(steps / p))
        return np.tile(last, reps)[:steps] + change * self.phi ** h, residual_sd(self.z, p, steps)

    def _refiltered(self, z_history: np.ndarray) -> Model:
        clone = copy.copy(self)
        clone.z = z_history
        return clone


class DriftNaive(SeasonalNaive):
    """Seasonal naive plus the recent trend of the daily level (log space): f[t+h] = z[t+h-24] + d, d the mean
    day-over-day change of the daily mean log level over the last ``days`` whole periods. A level that has been
    rising (or falling) for days keeps doing so for one more day: a holiday ramp, a cold spell building up, a
    service gaining users. The combination weighs it by its in-history backtest like every member, so where
    levels only wander (most days of most grids) it gets little weight."""

    family = "drift_naive"

    def __init__(self, period: int = HOURLY_PERIOD, days: int = 3) -> None:
        super().__init__(period)
        self.days = days

    @property
    def name(self) -> str:
        return f"drift_naive({self.days}d)"

    def _predict_z(self, steps: int) -> tuple[np.ndarray, np.ndarray]:  # fit, update, refilter: SeasonalNaive's
        p = self.period
        k = min(self.days, len(self.z) // p - 1)
        z = fill_gaps(self.z[-(max(k, 0) + 1) * p:], p)
        drift = float(np.mean(np.diff(z[-(k + 1) * p:].reshape(k + 1, p).mean(axis=1)))) if k >= 1 else 0.0
        reps = int(np.ceil(steps / p))
        return np.tile(z[-p:], reps)[:steps] + drift, residual_sd(self.z, p, steps)


class RecentLevel(SeasonalNaive):
    """The current level held flat: f[t+h] = median of the last ``hours`` steps (log space), no daily shape.

    For load whose level moves in steps (a large client switching on or off, a regime that lasts for hours) and
    that has little daily pattern, yesterday's shape (seasonal naive) carries yesterday's steps and dips into a day
    that will not have them; the level of the last hours is the better guess. The median keeps a single odd hour
    from setting it (a missing hour takes the value a day earlier, as in seasonal naive). Where the series has a
    clear daily pattern its in-history backtest is poor and the combination gives it little weight.

    With ``hours`` = one period (``auto``'s second instance, ``recent_level(24h)``) it is the day's level without its
    shape (the "average method" over the last day): where the hourly shape does not repeat from day to day (load
    that wanders between levels, ServeGen m-mid) seasonal naive carries yesterday's hour-to-hour noise into today,
    doubling its error variance, while the flat level of the last day does not."""

    family = "recent_level"

    def __init__(self, period: int = HOURLY_PERIOD, hours: int = 3) -> None:
        super().__init__(period)
        if hours < 1:
            raise ValueError(f"hours must be >= 1, got {hours}")
        self.hours = hours

    @property
    def name(self) -> str:
        return f"recent_level({self.hours}h)"

    def _predict_z(self, steps: int) -> tuple[np.ndarray, np.ndarray]:  # fit, update, refilter: SeasonalNaive's
        p = self.period
        z = fill_gaps(self.z[-2 * p:] if len(self.z) >= 2 * p else self.z, p)
        return np.full(steps, float(np.median(z[-self.hours:]))), residual_sd(self.z, p, steps)
