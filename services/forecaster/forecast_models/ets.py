"""Additive Holt-Winters (ETS(A,N,A)) on the log series: level + daily season, no trend.

statsmodels estimates the smoothing parameters and initial states; ``update`` runs the same recursions
(Hyndman & Athanasopoulos, fpp3 §8.3) forward with fixed parameters, so an online step costs O(1).
"""

from __future__ import annotations

import copy
import warnings

import numpy as np

from greenserve.forecaster.forecast_models.base import HOURLY_PERIOD, Model, fill_gaps


class Ets(Model):
    """ETS(A,N,A) on log values."""

    family = "ets"

    def __init__(self, period: int = HOURLY_PERIOD, max_fit_steps: int = 336) -> None:
        super().__init__(period)
        self.max_fit_steps = max_fit_steps

    @property
    def name(self) -> str:
        return f"ets(A,N,A)[{self.period}]"

    def _fit(self) -> None:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        p = self.period
        z = fill_gaps(self.z[-self.max_fit_steps:], p)
        if len(z) < 2 * p:
            raise ValueError(f"ets needs at least {2 * p} steps, got {len(z)}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = ExponentialSmoothing(z, seasonal="add", seasonal_periods=p, trend=None,
                                       initialization_method="estimated").fit()
        self.alpha = float(res.params["smoothing_level"])
        self.gamma = float(res.params["smoothing_seasonal"])
        self.fit_start = len(self.z) - len(z)
        self.initial_level = float(res.params["initial_level"])
        self.initial_season = np.asarray(res.params["initial_seasons"], dtype=np.float64).copy()
        self.level = float(res.level[-1])
        # season[i] is the seasonal state for position (n - p + i) mod p, i.e. the next p steps in order
        self.season = np.asarray(res.season[-p:], dtype=np.float64).copy()
        resid = z - np.asarray(res.fittedvalues)
        self.sigma = float(np.std(resid[p:])) if len(resid) > p + 1 else 0.05

    def _run(self, level: float, season: np.ndarray, values: np.ndarray) -> tuple[float, np.ndarray]:
        """The ETS(A,N,A) recursions over ``values`` (NaN: state carried forward unchanged)."""
        states = season.tolist()
        a, g = self.alpha, self.gamma
        for value in values.tolist():
            s = states.pop(0)
            if value == value:  # finite
                new_level = a * (value - s) + (1 - a) * level
                s = g * (value - level) + (1 - g) * s
                level = new_level
            states.append(s)
        return level, np.asarray(states)

    def _update(self, new_z: np.ndarray) -> None:
        self.level, self.season = self._run(self.level, self.season, new_z)

    def _predict_z(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        p = self.period
        reps = int(np.ceil(steps / p))
        mean = self.level + np.tile(self.season, reps)[:steps]
        h = np.arange(steps)
        sd = self.sigma * np.sqrt(1.0 + (h // p) * self.gamma**2 + h * self.alpha**2)
        return mean, sd

    def _refiltered(self, z_history: np.ndarray) -> Model:
        """Same parameters and initial states, recursions run over the prefix only (no re-estimation)."""
        clone = copy.copy(self)
        clone.z = z_history
        if len(z_history) - self.fit_start >= self.period:
            values = fill_gaps(z_history[self.fit_start:], self.period)
            clone.level, clone.season = self._run(self.initial_level, self.initial_season, values)
        else:
            clone._fit()
        return clone
