"""SARIMA family on statsmodels' SARIMAX (the estimator pmdarima wraps), in log space.

* :class:`SarimaFourier`: ARMA(p,q) errors around a constant plus K Fourier pairs of the daily period
  (regression with SARIMA errors, the "Fourier-term SARIMA" of Hyndman's fpp §12.1); fast to fit because the
  state stays small.
* :class:`Sarima`: seasonal SARIMA (p,d,q)(P,D,Q)[24], fixed small orders (default (1,0,0)(0,1,1)[24]).
* :class:`AutoSarima`: pmdarima ``auto_arima`` with m=24 (GreenCache §5.3), the order chosen by AIC, stepwise.

All take ``max_fit_steps``: only the most recent steps are used to estimate (and to filter), which bounds fit
time. ``update`` extends the Kalman filter with new observations without re-estimating, as GreenCache's hourly
online step does.

Memory: statsmodels keeps the filter's output for every step it filtered (a k_states x k_states
covariance per step and array: about 20 KB per step and array for the seasonal SARIMA, whose state has 49
entries). A model that serves forecasts therefore keeps the output of one short filter pass only: updates (and
the filter pass after loading a pickle) run in chunks of at most :data:`UPDATE_CHUNK_STEPS` steps, each started
from the last chunk's predicted state, and without the filtered, gain and smoother arrays (:func:`lean_memory`);
only the last chunk's output is held. The scale (innovation variance) is the fit's, held fixed: re-estimating it
from the few steps of an update gave NaN intervals after a one-step update.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np

from greenserve.forecaster.forecast_models.base import HOURLY_PERIOD, Model

#: Longest seasonal period :class:`Sarima` takes (hourly data: 24). Its state holds about period + 2 entries and
#: the filter a covariance of that squared per step: a 15-minute series (period 96) took 94 s and 870 MB to fit,
#: a minute series (period 1440) would hold gigabytes. Sub-hourly series are left to the Fourier-term SARIMA,
#: whose state does not grow with the period (`auto` leaves the seasonal SARIMA out of their combination).
MAX_SEASONAL_PERIOD = 24
#: Most steps one Kalman filter extension covers: the filter output held by a serving model is bounded by it.
UPDATE_CHUNK_STEPS = 24


def lean_memory() -> int:
    """statsmodels' ``conserve_memory`` flags of a serving model's filter passes: no filtered states, gains,
    smoother output or standardized forecast errors (predicted states and forecasts are kept: enough to go on
    filtering and to forecast). Imported when used: statsmodels' state-space modules pull in scipy.stats, whose
    import cost the service start seconds."""
    from statsmodels.tsa.statespace.kalman_filter import (
        MEMORY_NO_FILTERED,
        MEMORY_NO_GAIN,
        MEMORY_NO_SMOOTHING,
        MEMORY_NO_STD_FORECAST,
    )

    return MEMORY_NO_FILTERED | MEMORY_NO_GAIN | MEMORY_NO_SMOOTHING | MEMORY_NO_STD_FORECAST


def fourier_terms(start: int, steps: int, period: int, harmonics: int) -> np.ndarray:
    """sin/cos pairs of the first ``harmonics`` harmonics of ``period``, for positions start..start+steps-1."""
    t = np.arange(start, start + steps, dtype=np.float64)
    cols = []
    for k in range(1, harmonics + 1):
        angle = 2.0 * np.pi * k * t / period
        cols.append(np.sin(angle))
        cols.append(np.cos(angle))
    return np.column_stack(cols)


class _StateSpaceModel(Model):
    """Common plumbing of the SARIMAX-based models: windowed fit, extend on update, refilter."""

    def __init__(self, period: int = HOURLY_PERIOD, max_fit_steps: int = 336, maxiter: int = 50) -> None:
        super().__init__(period)
        self.max_fit_steps = max_fit_steps
        self.maxiter = maxiter
        self.results: Any = None
        self.params: np.ndarray | None = None
        #: innovation variance of the fit (the models are estimated with it concentrated out of the likelihood)
        self.scale: float = float("nan")
        #: True once ``results`` holds a lean filter pass (after update() or unpickling), not the fit's own output
        self.lean = False

    # exog of positions [start, start+steps)
    def _exog(self, start: int, steps: int) -> np.ndarray | None:
        return None

    def _build(self, endog: np.ndarray, exog: np.ndarray | None, **kwargs: Any) -> Any:
        """The statsmodels model of ``endog`` (``kwargs``: extra SARIMAX/Kalman filter options)."""
        raise NotImplementedError

    def _window(self, n: int) -> int:
        return max(0, n - self.max_fit_steps)

    def _fit(self) -> None:
        n = len(self.z)
        start = self._window(n)
        endog = self.z[start:]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = self._build(endog, self._exog(start, len(endog)))
            self.results = self._estimate(model)
            if self._diverged(self.results, endog, n):
                # statsmodels' default start puts every ARMA coefficient at 0; from there L-BFGS can run onto the
                # stationarity boundary (AR roots of modulus 1, a constant in the millions) and stop with a zero
                # gradient: its forecasts explode. Once more from a mildly persistent AR(1) start.
                self.results = self._estimate(model, self._persistent_start(model))
                if self._diverged(self.results, endog, n):
                    raise ValueError(f"{self.name}: estimation diverged (forecasts leave the history's range)")
        self.params = np.asarray(self.results.params)
        self.scale = float(self.results.scale)
        self.lean = False
        self.n = n
        self.fit_start = start

    def _estimate(self, model: Any, start_params: np.ndarray | None = None) -> Any:
        try:
            return model.fit(start_params=start_params, disp=False, method="lbfgs", maxiter=self.maxiter)
        except np.linalg.LinAlgError as exc:  # a constant or too short history: no covariance to factor
            raise ValueError(f"{self.name}: cannot be estimated on this history ({exc})") from exc

    def _diverged(self, results: Any, endog: np.ndarray, next_position: int) -> bool:
        """A failed estimate: parameters not finite, or a one-period forecast (from ``next_position``, the step
        after ``endog``) outside the history's (log) range widened by that range on each side (a stationary or
        seasonally differenced model stays near it)."""
        if not np.isfinite(results.params).all():
            return True
        finite = endog[np.isfinite(endog)]
        span = max(float(finite.max() - finite.min()), 1e-3)
        forecast = np.asarray(results.get_forecast(self.period, exog=self._exog(next_position, self.period))
                              .predicted_mean, dtype=np.float64)
        return not (np.isfinite(forecast).all() and forecast.min() >= finite.min() - span
                    and forecast.max() <= finite.max() + span)

    @staticmethod
    def _persistent_start(model: Any) -> np.ndarray:
        """statsmodels' start parameters with the ARMA part reset to AR(1) = 0.5 (other AR/MA terms 0)."""
        start = np.asarray(model.start_params, dtype=np.float64).copy()
        for i, name in enumerate(model.param_names):
            if name.startswith(("ar.", "ma.")):
                start[i] = 0.5 if name == "ar.L1" else 0.0
        return start

    def forecast_z_from(self, z_history: np.ndarray, steps: int) -> np.ndarray:
        """From the fit's own filter pass when ``z_history`` is a prefix of the fitted data: a dynamic
        prediction from that point uses only the observations before it (one filter pass serves every origin,
        instead of one re-filter per origin)."""
        o = len(z_history)
        res = self.results
        fresh = res is not None and not self.lean and getattr(self, "fit_start", None) is not None and \
            res.nobs == self.n - self.fit_start
        lo, hi = o - self.fit_start if fresh else -1, o - (self.fit_start or 0) + steps - 1
        if fresh and 1 <= lo and hi < res.nobs:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pred = res.get_prediction(start=lo, end=hi, dynamic=True)
            return np.asarray(pred.predicted_mean, dtype=np.float64)
        return super().forecast_z_from(z_history, steps)

    def _full_params(self) -> np.ndarray:
        """Estimated parameters with the fit's scale (sigma2) appended: the order of a SARIMAX whose scale is
        not concentrated out."""
        assert self.params is not None
        return np.r_[self.params, self.scale]

    def _extend(self, prev: Any, new_z: np.ndarray, position: int) -> Any:
        """A lean filter pass over ``new_z`` (positions ``position``...) started from ``prev``'s last predicted
        state, with the fit's parameters and scale (what ``SARIMAXResults.extend`` does, minus the per-step
        arrays nothing reads and the scale re-estimated from the new steps alone)."""
        from statsmodels.tsa.statespace.initialization import Initialization

        cov = np.asarray(prev.predicted_state_cov[..., -1])
        if getattr(prev.model, "concentrate_scale", False):  # the fit's own pass: covariances in units of scale
            cov = cov * prev.scale
        # as SARIMAXResults.extend: the trend goes on counting, and the constant-exog check is not re-run on
        # the new steps alone (one step of Fourier terms looks constant)
        mod = prev.model.clone(new_z, exog=self._exog(position, len(new_z)), concentrate_scale=False,
                               conserve_memory=lean_memory(), trend_offset=prev.model.trend_offset + prev.nobs,
                               validate_exog=False)
        mod.ssm.initialization = Initialization(mod.k_states, "known", constant=prev.predicted_state[..., -1],
                                                stationary_cov=cov)
        return mod.filter(self._full_params(), cov_type="none")

    def _extend_chunks(self, res: Any, new_z: np.ndarray, position: int) -> Any:
        for i in range(0, len(new_z), UPDATE_CHUNK_STEPS):
            res = self._extend(res, new_z[i:i + UPDATE_CHUNK_STEPS], position + i)
        return res

    def _update(self, new_z: np.ndarray) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.results = self._extend_chunks(self.results, new_z, self.n)
        self.lean = True
        self.n += len(new_z)

    def _predict_z(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fc = self.results.get_forecast(steps, exog=self._exog(self.n, steps))
            mean = np.asarray(fc.predicted_mean, dtype=np.float64)
            sd = np.sqrt(np.maximum(np.asarray(fc.var_pred_mean, dtype=np.float64), 1e-12))
        return mean, sd

    def _refiltered(self, z_history: np.ndarray) -> Model:
        n = len(z_history)
        start = self._window(n)
        endog = z_history[start:]
        clone = copy.copy(self)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = self._build(endog, self._exog(start, len(endog)))
            clone.results = model.filter(self.params)
        clone.n = n
        clone.z = z_history
        return clone

    def __getstate__(self) -> dict[str, Any]:
        # Pickle the estimated parameters and the recent window, not the filter output (megabytes for a
        # seasonal state); __setstate__ re-runs the Kalman filter on that window, which is cheap.
        state = self.__dict__.copy()
        state["results"] = None
        state["z"] = self.z[-self.max_fit_steps:]
        if state.get("start_s") is not None:  # z[0] moved: so does its time
            state["start_s"] += (len(self.z) - len(state["z"])) * self.step_s
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.params is not None and len(self.z):
            # the window in two passes: all but the last chunk (its output is dropped), then the last chunk,
            # whose lean output is what this model keeps
            endog = self.z
            start = self.n - len(endog)
            head = max(1, len(endog) - UPDATE_CHUNK_STEPS)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = self._build(endog[:head], self._exog(start, head), concentrate_scale=False,
                                  conserve_memory=lean_memory()).filter(self._full_params(), cov_type="none")
                self.results = self._extend_chunks(res, endog[head:], start + head)
            self.lean = True


class SarimaFourier(_StateSpaceModel):
    """Regression on K daily Fourier pairs with ARMA(p,q) errors and a constant (log space)."""

    family = "sarima_fourier"

    def __init__(self, period: int = HOURLY_PERIOD, order: tuple[int, int, int] = (2, 0, 1), harmonics: int = 4,
                 max_fit_steps: int = 336, maxiter: int = 50) -> None:
        super().__init__(period, max_fit_steps, maxiter)
        self.order = order
        self.harmonics = harmonics

    @property
    def name(self) -> str:
        p, d, q = self.order
        return f"sarima_fourier({p},{d},{q})K{self.harmonics}[{self.period}]"

    def _exog(self, start: int, steps: int) -> np.ndarray | None:
        return fourier_terms(start, steps, self.period, self.harmonics)

    def _build(self, endog: np.ndarray, exog: np.ndarray | None, **kwargs: Any) -> Any:
        from statsmodels.tsa.statespace.sarimax import SARIMAX

        return SARIMAX(endog, exog=exog, order=self.order, trend="c" if self.order[1] == 0 else "n",
                       **{"concentrate_scale": True, **kwargs})


class Sarima(_StateSpaceModel):
    """Seasonal SARIMA with fixed orders (log space)."""

    family = "sarima"

    def __init__(self, period: int = HOURLY_PERIOD, order: tuple[int, int, int] = (1, 0, 0),
                 seasonal_order: tuple[int, int, int] = (0, 1, 1), max_fit_steps: int = 168,
                 maxiter: int = 50) -> None:
        super().__init__(period, max_fit_steps, maxiter)
        self.order = order
        self.seasonal_order = seasonal_order

    @property
    def name(self) -> str:
        p, d, q = self.order
        sp, sd, sq = self.seasonal_order
        return f"sarima({p},{d},{q})({sp},{sd},{sq})[{self.period}]"

    def _check_period(self) -> None:
        if self.period > MAX_SEASONAL_PERIOD:
            raise ValueError(f"{self.name}: a seasonal period of {self.period} steps is above "
                             f"{MAX_SEASONAL_PERIOD} (its state grows with the period squared); use sarima_fourier")

    def _fit(self) -> None:
        self._check_period()
        super()._fit()

    def _build(self, endog: np.ndarray, exog: np.ndarray | None, **kwargs: Any) -> Any:
        from statsmodels.tsa.statespace.sarimax import SARIMAX

        return SARIMAX(endog, order=self.order, seasonal_order=(*self.seasonal_order, self.period),
                       **{"concentrate_scale": True, **kwargs})


class AutoSarima(Sarima):
    """pmdarima ``auto_arima`` (m=period, stepwise, AIC) picks the orders; then it behaves like :class:`Sarima`."""

    family = "auto_arima"

    def __init__(self, period: int = HOURLY_PERIOD, max_fit_steps: int = 72, maxiter: int = 50) -> None:
        super().__init__(period, max_fit_steps=max_fit_steps, maxiter=maxiter)

    @property
    def name(self) -> str:
        return "auto_arima:" + super().name

    def _fit(self) -> None:
        self._check_period()
        import pmdarima

        endog = self.z[self._window(len(self.z)):]
        filled = np.where(np.isfinite(endog), endog, np.nanmean(endog))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            chosen = pmdarima.auto_arima(
                filled, m=self.period, seasonal=True, stepwise=True, suppress_warnings=True, error_action="ignore",
                max_p=2, max_q=2, max_P=1, max_Q=1, information_criterion="aic",
            )
        self.order = tuple(int(x) for x in chosen.order)  # type: ignore[assignment]
        self.seasonal_order = tuple(int(x) for x in chosen.seasonal_order[:3])  # type: ignore[assignment]
        super()._fit()
