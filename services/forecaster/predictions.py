"""Forecasts of a series: from its fitted model (cached per fit, points seen, horizon and coverage) or, when the
model has none yet or forecasts a non-finite mean, seasonal naive over the stored history; always finite (clipped
to ``[0, MAX_POINT_VALUE]``).

``Predictions`` is a part of ``ForecasterServicer`` (service.py).
"""

from __future__ import annotations

import logging

import numpy as np

from greenserve.common.errors import FailedPrecondition
from greenserve.forecaster import ingest
from greenserve.forecaster.forecast_models import Prediction
from greenserve.forecaster.forecast_models.simple import SeasonalNaive
from greenserve.forecaster.series_state import FittedSeries, SeriesState

log = logging.getLogger("greenserve.forecaster")


class Predictions(FittedSeries):
    """The servicer's forecasts of one series (GetForecast, GetCurrentCarbonIntensity)."""

    def _prediction(self, state: SeriesState, steps: int, coverage: float) -> Prediction:
        assert state.model is not None
        cache_key = (state.fit_version, state.updates, steps, coverage)
        cached = state.cache.get(cache_key)
        if cached is None:
            with state.lock:
                cached = finite_prediction(state.model.predict(steps, coverage))
                if cached is None:
                    log.warning("series %s: %s forecast a non-finite mean; serving seasonal naive", state.key,
                                state.model_name)
                    cached, _ = self._naive_prediction(state, steps, coverage, end_s=state.history_end_s)
                if len(state.cache) > 64:
                    state.cache.clear()
                state.cache[cache_key] = cached
        return cached

    def _naive_prediction(self, state: SeriesState, steps: int, coverage: float,
                          end_s: int | None = None) -> tuple[Prediction, int]:
        """Seasonal naive from the last 4 periods stored up to ``end_s`` (default: the last point)."""
        period = max(1, 86_400 // state.resolution_s)
        last = self._last_time(state.series_id) if end_s is None else end_s
        if last is None:
            raise FailedPrecondition("series has no points")
        first, grid = ingest.load_grid(self.db, state.series_id, state.resolution_s,
                                       last - (4 * period - 1) * state.resolution_s, last + state.resolution_s)
        if np.isfinite(grid).sum() < period:
            raise FailedPrecondition(f"series has {int(np.isfinite(grid).sum())} points; a forecast needs {period}")
        if first + (len(grid) - 1) * state.resolution_s < last:  # missing steps at the end stay missing
            grid = np.concatenate([grid, np.full((last - first) // state.resolution_s + 1 - len(grid), np.nan)])
        pred = finite_prediction(SeasonalNaive(period).fit(grid, start_s=first).predict(steps, coverage))
        if pred is None:
            raise FailedPrecondition("the stored history gives no finite forecast")
        return pred, last


def finite_prediction(pred: Prediction) -> Prediction | None:
    """``pred`` with every value finite and in ``[0, MAX_POINT_VALUE]`` (an interval end that overflowed is
    clipped to the bound; lower <= mean <= upper); None when the mean itself is not finite."""
    if not np.isfinite(pred.mean).all():
        return None
    bound = ingest.MAX_POINT_VALUE
    mean = np.clip(pred.mean, 0.0, bound)
    lower = np.minimum(np.clip(np.nan_to_num(pred.lower, nan=0.0, posinf=bound, neginf=0.0), 0.0, bound), mean)
    upper = np.maximum(np.clip(np.nan_to_num(pred.upper, nan=bound, posinf=bound, neginf=0.0), 0.0, bound), mean)
    return Prediction(mean, lower, upper, pred.model, pred.coverage_fraction)
