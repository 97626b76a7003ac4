"""Day-ahead backtest with fixed windows, so results compare across runs and tools.

For each of the last ``days`` whole UTC days of a series, the model is fitted on the ``history_hours`` hours
before that day's 00:00 and forecasts ``horizon_hours`` hours from 00:00. It sees nothing else. The scores:

* ``mape``: mean of |f - y| / |y| x 100 over all scored points (missing or zero truths are not scored);
* ``naive_mape``: the same for the seasonal-naive forecast, the last 24 h of the history repeated;
* ``fit_seconds_median``: median wall time of fit + predict per day;
* ``interval_coverage_fraction``: the share of scored points inside the forecast's 90 % prediction interval (a
  calibrated interval covers about 0.9; much less means the interval is too narrow to plan against).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from greenserve.forecaster.csv_sources import HOUR_S, RegularSeries
from greenserve.forecaster.forecast_models import DEFAULT_MODEL, make_model
from greenserve.forecaster.forecast_models.base import DEFAULT_COVERAGE_FRACTION, fill_gaps
from greenserve.forecaster.forecast_models.holiday_calendar import Holidays

DAY_S = 86_400
MAX_HISTORY_HOURS = 720
MAX_HORIZON_HOURS = 48
MAX_DAYS = 366


def limit_native_threads(count: int = 1) -> None:
    """One BLAS/OpenMP thread: statsmodels' small matrices get slower with more, and workers share cores."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                "NUMEXPR_NUM_THREADS"):
        os.environ[var] = str(count)
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(count)
    except Exception:  # noqa: BLE001 - threadpoolctl missing or no pool loaded yet: the env vars cover new loads
        pass


@dataclass
class DayResult:
    day_s: int
    mape_percent: float
    naive_mape_percent: float
    fit_s: float
    points: int
    model: str
    #: share of that day's scored truths inside the forecast's interval
    interval_coverage_fraction: float = float("nan")


@dataclass
class BacktestResult:
    series: str
    mape: float
    naive_mape: float
    points: int
    fit_seconds_median: float
    model: str
    days: list[DayResult] = field(default_factory=list)
    history_hours: int = 0
    horizon_hours: int = 0
    models_used: dict[str, int] = field(default_factory=dict)
    #: share of all scored truths inside the forecasts' ``interval_nominal_fraction`` interval (0.9 asks 90 %)
    interval_coverage_fraction: float = float("nan")
    interval_nominal_fraction: float = DEFAULT_COVERAGE_FRACTION

    @property
    def ratio(self) -> float:
        return self.mape / self.naive_mape if self.naive_mape > 0 else float("nan")

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        out["ratio_to_naive"] = self.ratio
        return out


def check_windows(history_hours: int, horizon_hours: int, days: int) -> None:
    """Raise ``ValueError`` naming the bad parameter."""
    if not 24 <= history_hours <= MAX_HISTORY_HOURS:
        raise ValueError(f"history_hours must be in 24..{MAX_HISTORY_HOURS}, got {history_hours}")
    if not 1 <= horizon_hours <= MAX_HORIZON_HOURS:
        raise ValueError(f"horizon_hours must be in 1..{MAX_HORIZON_HOURS}, got {horizon_hours}")
    if not 1 <= days <= MAX_DAYS:
        raise ValueError(f"days must be in 1..{MAX_DAYS}, got {days}")


def backtest_span_hours(history_hours: int, horizon_hours: int, days: int) -> int:
    """Hours before a series' last point that hold every window :func:`backtest_days` can pick (the last
    ``days`` days, each with its history and horizon, and a day of alignment): a backtest reads no more
    than this, however long the series (a sparse series spread over years made a dense grid of 1.7 GB)."""
    return 24 * days + history_hours + max(horizon_hours, 24) + 24


def backtest_days(series: RegularSeries, history_hours: int, horizon_hours: int, days: int) -> list[int]:
    """Start indices (into ``series.values``) of the last ``days`` whole UTC days whose full history and
    forecast window lie inside the series, oldest first. Raises ``ValueError`` when there is none."""
    if series.step_s != HOUR_S:
        raise ValueError(f"backtests run on hourly series, got a step of {series.step_s}s")
    n = len(series.values)
    first_midnight = -(-series.start_s // DAY_S) * DAY_S
    idx = (first_midnight - series.start_s) // HOUR_S
    starts = []
    while idx + horizon_hours <= n:
        if idx - history_hours >= 0 and idx + 24 <= n:
            starts.append(int(idx))
        idx += 24
    if not starts:
        raise ValueError(
            f"{series.name}: no whole day with {history_hours} h of history and {horizon_hours} h to forecast "
            f"({n} hourly points)"
        )
    return starts[-days:]


def naive_forecast(history: np.ndarray, horizon_hours: int) -> np.ndarray:
    """Seasonal naive: the last 24 h of history repeated (a missing hour takes the value a day earlier)."""
    last = fill_gaps(history[-48:] if len(history) >= 48 else history, 24)[-24:]
    return np.tile(last, -(-horizon_hours // 24))[:horizon_hours]


def _scored(truth: np.ndarray) -> np.ndarray:
    """The truths a backtest scores: finite and non-zero (MAPE divides by them)."""
    return np.isfinite(truth) & (truth != 0)


def _inside(lower: np.ndarray, upper: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per scored truth: inside [lower, upper]?"""
    ok = _scored(truth)
    return (truth[ok] >= lower[ok]) & (truth[ok] <= upper[ok])


def _ape(forecast: np.ndarray, truth: np.ndarray) -> np.ndarray:
    ok = _scored(truth)
    return np.abs(forecast[ok] - truth[ok]) / np.abs(truth[ok]) * 100.0


def run_backtest(series: RegularSeries, *, history_hours: int = 72, horizon_hours: int = 24, days: int = 7,
                 model: str = DEFAULT_MODEL, holidays: Holidays | None = None) -> BacktestResult:
    """Backtest ``model`` on ``series`` with the issue's windows (``holidays``: the region's public holidays, off
    days for the calendar-aware members; known in advance, so no peeking)."""
    check_windows(history_hours, horizon_hours, days)
    make_model(model)  # unknown name -> KeyError before any work
    starts = backtest_days(series, history_hours, horizon_hours, days)
    values = series.values
    all_ape: list[np.ndarray] = []
    all_naive: list[np.ndarray] = []
    all_inside: list[np.ndarray] = []
    day_results: list[DayResult] = []
    used: dict[str, int] = {}
    for start in starts:
        history = values[start - history_hours:start]
        truth = values[start:start + horizon_hours]
        t0 = time.perf_counter()
        history_start_s = series.start_s + (start - history_hours) * HOUR_S  # the calendar, not the values
        fitted = make_model(model).fit(history, start_s=history_start_s, holidays=holidays)
        prediction = fitted.predict(horizon_hours, DEFAULT_COVERAGE_FRACTION)
        fit_s = time.perf_counter() - t0
        ape = _ape(prediction.mean, truth)
        naive_ape = _ape(naive_forecast(history, horizon_hours), truth)
        all_ape.append(ape)
        all_naive.append(naive_ape)
        inside = _inside(prediction.lower, prediction.upper, truth)
        all_inside.append(inside)
        used[prediction.model] = used.get(prediction.model, 0) + 1
        day_results.append(DayResult(
            day_s=series.start_s + start * HOUR_S,
            mape_percent=float(ape.mean()) if len(ape) else float("nan"),
            naive_mape_percent=float(naive_ape.mean()) if len(naive_ape) else float("nan"),
            fit_s=fit_s, points=len(ape), model=prediction.model,
            interval_coverage_fraction=float(inside.mean()) if len(inside) else float("nan"),
        ))
    ape_all = np.concatenate(all_ape)
    naive_all = np.concatenate(all_naive)
    if len(ape_all) == 0:
        raise ValueError(f"{series.name}: no scorable point (every truth missing or zero)")
    model_label = max(used, key=lambda k: used[k]) if model != DEFAULT_MODEL else f"{model}"
    return BacktestResult(
        series=series.name, mape=float(ape_all.mean()), naive_mape=float(naive_all.mean()), points=len(ape_all),
        fit_seconds_median=float(statistics.median(d.fit_s for d in day_results)), model=model_label,
        days=day_results, history_hours=history_hours, horizon_hours=horizon_hours, models_used=used,
        interval_coverage_fraction=float(np.concatenate(all_inside).mean()),
    )
