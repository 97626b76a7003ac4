"""Analog days: tomorrow as the days that followed the past moments most like today's last hours.

The analog-ensemble idea of weather and energy forecasting (Delle Monache et al. 2013, "Probabilistic weather
prediction with an analog ensemble", Mon. Wea. Rev. 141:3498; for electricity, pattern-sequence forecasting,
Martinez-Alvarez et al. 2011, IEEE TKDE 23:1230): find, in the history, the moments at the same hour of the day
whose preceding hours look most like the hours just before the forecast origin, and forecast what followed them.
On a grid whose carbon intensity swings with the weather (a solar grid after a cloudy or a clear spell), the day
that followed a similar evening is a better guess than yesterday repeated, which is all that seasonal naive knows.
"""

from __future__ import annotations

import numpy as np

from greenserve.forecaster.forecast_models.base import HOURLY_PERIOD, fill_gaps
from greenserve.forecaster.forecast_models.simple import SeasonalNaive, residual_sd


class AnalogDays(SeasonalNaive):
    """Mean (log space) of the periods that followed the ``analogs`` best matches of the last ``window_steps``.

    Candidates end a whole number of periods before the history's end (so their next period covers the same hours
    of the day as the forecast) and have a full window before them and a full period after. A candidate's distance
    is the variance of its window's difference to the last window: the shape must match, the level need not; the
    level gap is added back to what followed it. With no candidate (a history under a period plus the window)
    it is seasonal naive."""

    family = "analog_days"

    def __init__(self, period: int = HOURLY_PERIOD, window_steps: int = 12, analogs: int = 4) -> None:
        super().__init__(period)
        if not 1 <= window_steps <= period:
            raise ValueError(f"window_steps must be in 1..{period}, got {window_steps}")
        if analogs < 1:
            raise ValueError(f"analogs must be >= 1, got {analogs}")
        self.window_steps = window_steps
        self.analogs = analogs

    @property
    def name(self) -> str:
        return f"analog_days(w{self.window_steps},k{self.analogs})"

    def _predict_z(self, steps: int) -> tuple[np.ndarray, np.ndarray]:  # fit, update, refilter: SeasonalNaive's
        p, w = self.period, self.window_steps
        z = fill_gaps(self.z, p)
        n = len(z)
        ends = np.arange(n - p, w - 1, -p)  # candidate origins: 1, 2, ... periods back
        if len(ends) == 0:
            return super()._predict_z(steps)
        query = z[n - w:]
        windows = np.stack([z[e - w:e] for e in ends])
        gaps = query.mean() - windows.mean(axis=1)  # level of today minus level of the candidate
        distance = (windows - query).var(axis=1)
        best = np.argsort(distance, kind="stable")[:self.analogs]
        followers = np.stack([z[ends[i]:ends[i] + p] + gaps[i] for i in best])
        profile = followers.mean(axis=0)
        reps = int(np.ceil(steps / p))
        return np.tile(profile, reps)[:steps], residual_sd(self.z, p, steps)
