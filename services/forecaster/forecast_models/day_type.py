"""Calendar-aware baselines: weekdays and weekends behave differently (request load above all: office and
coding traffic drops on Saturday and Sunday; grid CI follows demand, lower at weekends).

Both members need the history's calendar (``fit(y, start_s=...)``); without it they are the seasonal naive.
A step's day type is that of its UTC date: an off day (Saturday, Sunday and, when fitted with
``holidays=``, the region's public holidays: Christmas on a Tuesday is a Sunday for the grid) or a working day.
The target day's type is known before the day starts, so using it peeks at nothing.

* :class:`DayTypeNaive`: each forecast step takes the value of the most recent history step at the same hour
  whose day has the same type (Monday after a weekend takes Friday); when the history holds no day of that type
  (a Saturday after 72 h of weekdays) it takes yesterday's value unchanged.
* :class:`DayTypeShift`: yesterday's value at the same hour plus the difference of the mean (log) daily profiles
  of the two day types in the history, for steps whose type differs from yesterday's (the weekday/weekend factor
  of that hour). No difference when the history lacks one of the types.
"""

from __future__ import annotations

import copy

import numpy as np
from greenserve.forecaster.forecast_models.base import Model, fill_gaps
from greenserve.forecaster.forecast_models.simple import SeasonalNaive, residual_sd


class DayTypeNaive(SeasonalNaive):
    """Value of the most recent same-day-type step at the same hour (else yesterday's)."""

    family = "day_type_naive"
    day_type_aware = True

    def _predict_z(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        p, n = self.period, len(self.z)
        times = self.times_of(0, n + steps)
        if times is None or n < p:
            return super()._predict_z(steps)
        weekend = self.off_day(times)
        z = fill_gaps(self.z, p)
        out = np.empty(steps)
        for h in range(steps):
            t = n + h
            lags = np.arange(t - p, -1, -p)  # same hour, 1, 2, ... days back
            lags = lags[lags < n]  # inside the history (steps beyond a day use the forecast's own first day)
            same = lags[weekend[lags] == weekend[t]]
            out[h] = z[same[0]] if len(same) else z[lags[0]]
        return out, residual_sd(self.z, p, steps)


class DayTypeShift(SeasonalNaive):
    """Yesterday's value + (mean profile of the step's day type - mean profile of yesterday's day type)."""

    family = "day_type_shift"
    day_type_aware = True

    def _predict_z(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        p, n = self.period, len(self.z)
        base, sd = super()._predict_z(steps)
        times = self.times_of(0, n + steps)
        if times is None or n < p:
            return base, sd
        weekend = self.off_day(times)
        z = fill_gaps(self.z, p)
        hour = np.arange(n + steps) % p
        profiles: dict[bool, np.ndarray] = {}
        for kind in (False, True):
            rows = np.flatnonzero(weekend[:n] == kind)
            if len(rows) == 0:
                return base, sd
            sums = np.bincount(hour[rows], weights=z[rows], minlength=p)
            counts = np.bincount(hour[rows], minlength=p)
            if (counts == 0).any():
                return base, sd
            profiles[kind] = sums / counts
        out = base.copy()
        for h in range(steps):
            t = n + h
            src = t - p * (1 + h // p)  # the step seasonal naive copies
            if weekend[t] != weekend[src]:
                out[h] += profiles[bool(weekend[t])][hour[t]] - profiles[bool(weekend[src])][hour[t]]
        return out, sd

    def _refiltered(self, z_history: np.ndarray) -> Model:
        clone = copy.copy(self)
        clone.z = z_history
        return clone
