"""What every forecasting model offers: fit on a history, predict with intervals, update online.

Models work on a regular series (one value per step, NaN = missing) and forecast the steps that follow its
last value. Most work in log space (carbon intensity and load are positive and their daily swings are
multiplicative); :class:`LogTransform` holds the offset that keeps zeros finite.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from greenserve.forecaster.forecast_models.holiday_calendar import Holidays, off_days

#: Daily seasonality of hourly data (GreenCache section 5.3: SARIMA with m=24).
HOURLY_PERIOD = 24

#: Most recent steps a fitted model keeps in memory (30 days hourly); older ones are only in the database.
MAX_KEPT_STEPS = 720


@dataclass
class Prediction:
    """A forecast: point values and a prediction interval per step, in the series' own unit."""

    mean: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    model: str
    coverage_fraction: float


class LogTransform:
    """z = log(y + offset); the offset is 0 for strictly positive data, else the larger of 1 % of the median and
    10 % of the mean level. The mean keeps it on the data's scale when most values are 0 (a pool idle most hours:
    the median is 0, and an offset of 1e-6 would put an idle hour 14 log units below a busy one, blowing every
    log-space interval up to millions of times the data)."""

    def __init__(self, y: np.ndarray) -> None:
        finite = y[np.isfinite(y)]
        if len(finite) == 0:
            raise ValueError("history has no finite value")
        if finite.min() > 0:
            self.offset = 0.0
        else:
            level = np.abs(finite)
            self.offset = max(1e-9, 0.01 * float(np.median(level)), 0.1 * float(level.mean())) or 1e-6

    def forward(self, y: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.log(np.maximum(y + self.offset, 1e-12))

    def inverse(self, z: np.ndarray) -> np.ndarray:
        return np.maximum(np.exp(z) - self.offset, 0.0)


def fill_gaps(z: np.ndarray, period: int = HOURLY_PERIOD) -> np.ndarray:
    """A gap-free copy for models that cannot skip NaN: a missing value takes the value one period
    earlier when known, else linear interpolation. Only used inside a model's fit, never stored."""
    out = np.array(z, dtype=np.float64, copy=True)
    nan = np.isnan(out)
    if not nan.any():
        return out
    for i in np.flatnonzero(nan):
        if i >= period and np.isfinite(out[i - period]):
            out[i] = out[i - period]
    nan = np.isnan(out)
    if nan.any():
        ok = np.flatnonzero(~nan)
        out[nan] = np.interp(np.flatnonzero(nan), ok, out[ok])
    return out


def z_of(coverage_fraction: float) -> float:
    """Standard normal quantile of a central interval (the stdlib's: importing scipy.stats cost the service
    start about a second)."""
    return NormalDist().inv_cdf(0.5 + coverage_fraction / 2.0)


#: Coverage of the prediction interval when the caller asks for none (GetForecast, the backtest).
DEFAULT_COVERAGE_FRACTION = 0.9


class Model(abc.ABC):
    """A forecasting model. ``fit`` then any number of ``predict``/``update`` calls; picklable."""

    #: Short family name used in the registry (``seasonal_naive``, ``sarima``, ...).
    family: str = ""

    #: True for members whose forecast differs from seasonal naive only where the day type (weekday/weekend)
    #: changes: a combination can rank them only on validation days that include such a change.
    day_type_aware: bool = False

    #: Unix time of ``z[0]`` when the caller gave the history's calendar (``fit(y, start_s=...)``), else None.
    #: Calendar-aware members read weekdays from it; the others ignore it.
    start_s: int | None = None

    #: Public holidays of the series' region (``fit(y, start_s=..., holidays=...)``): calendar-aware members
    #: treat them as off days like Saturdays and Sundays. None: weekends only.
    holidays: Holidays | None = None

    def __init__(self, period: int = HOURLY_PERIOD) -> None:
        self.period = period
        self.z: np.ndarray = np.empty(0)
        self.transform: LogTransform | None = None
        self.start_s = None
        self.holidays = None

    @property
    def step_s(self) -> int:
        """Seconds per step (the period is one day)."""
        return 86_400 // self.period

    def times_of(self, first: int, count: int) -> np.ndarray | None:
        """Unix times of positions ``first .. first+count-1`` (0 = ``z[0]``; positions past the history are the
        forecast steps), or None when the calendar is unknown."""
        if self.start_s is None:
            return None
        return self.start_s + self.step_s * np.arange(first, first + count, dtype=np.int64)

    def off_day(self, times_s: np.ndarray) -> np.ndarray:
        """Per Unix time: a Saturday, Sunday or (with a holiday calendar) public holiday?"""
        return off_days(times_s, self.holidays)

    def _append_z(self, new_z: np.ndarray) -> None:
        """Append to the kept history, dropping the oldest steps past :data:`MAX_KEPT_STEPS` (and moving
        ``start_s`` with them)."""
        z = np.concatenate([self.z, new_z])
        dropped = max(0, len(z) - MAX_KEPT_STEPS)
        if dropped and self.start_s is not None:
            self.start_s += dropped * self.step_s
        self.z = z[dropped:]

    @property
    def name(self) -> str:
        """Full description of the fitted model (orders, members), reported with every forecast."""
        return self.family

    def fit(self, y: np.ndarray, start_s: int | None = None, holidays: Holidays | None = None) -> Model:
        """Estimate on ``y`` (NaN = missing). ``start_s``: Unix time of ``y[0]`` (the calendar of the history;
        the weekday of the days to forecast follows from it, which is known in advance, not peeked).
        ``holidays``: the region's public holidays, off days for the calendar-aware members."""
        y = np.asarray(y, dtype=np.float64)
        self.start_s = None if start_s is None else int(start_s)
        self.holidays = holidays
        self.transform = LogTransform(y)
        self.z = self.transform.forward(y)
        self._fit()
        return self

    def update(self, new_values: np.ndarray) -> None:
        """Append new observations (the steps right after the history) without re-estimating."""
        assert self.transform is not None
        new_z = self.transform.forward(np.asarray(new_values, dtype=np.float64))
        if len(new_z) == 0:
            return
        self._append_z(new_z)
        self._update(new_z)

    def predict(self, steps: int, coverage_fraction: float = DEFAULT_COVERAGE_FRACTION) -> Prediction:
        assert self.transform is not None
        mean_z, sd_z = self._predict_z(steps)
        q = z_of(coverage_fraction)
        inv = self.transform.inverse
        return Prediction(inv(mean_z), inv(mean_z - q * sd_z), inv(mean_z + q * sd_z), self.name, coverage_fraction)

    def forecast_z_from(self, z_history: np.ndarray, steps: int) -> np.ndarray:
        """Point forecast (log space) from another history with this model's estimated parameters: used to
        score the model on days inside its own history (no re-estimation, no look at later values)."""
        clone = self._refiltered(z_history)
        return clone._predict_z(steps)[0]

    # ---- to implement ------------------------------------------------------------------------------
    @abc.abstractmethod
    def _fit(self) -> None: ...

    @abc.abstractmethod
    def _update(self, new_z: np.ndarray) -> None: ...

    @abc.abstractmethod
    def _predict_z(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation per step, log space."""

    @abc.abstractmethod
    def _refiltered(self, z_history: np.ndarray) -> Model: ...
