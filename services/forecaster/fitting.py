"""Model fits in worker processes, so that no RPC ever waits on an estimation.

A :class:`FitPool` wraps a ``ProcessPoolExecutor`` (spawned workers, one BLAS thread each); ``submit`` returns
an awaitable :class:`FitOutcome` holding the pickled fitted model. The servicer keeps serving forecasts from the
previous fit until the new one arrives. Pickles carry :data:`FORMAT_VERSION`; a stored blob of another version
is ignored (and the series refitted) instead of being unpickled into the wrong layout.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from greenserve.common.parent_death import exit_with_parent
from greenserve.forecaster.backtest import BacktestResult, limit_native_threads, run_backtest
from greenserve.forecaster.csv_sources import RegularSeries
from greenserve.forecaster.forecast_models import Model, make_model
from greenserve.forecaster.forecast_models.holiday_calendar import Holidays

#: Layout of pickled models: bump when a model class changes its attributes (or `auto` its members: 7 added
#: analog days and the log offset of often-idle series, 8 the day-level member, 9 the SARIMA members' fixed scale and
#: lean filter output; stored fits are redone on restart).
FORMAT_VERSION = 9


@dataclass
class FitOutcome:
    """A finished fit: the pickled model, its full name and how long estimation took."""

    blob: bytes
    model_name: str
    fit_s: float


def fit_blob(model: str, values: np.ndarray, period: int, start_s: int | None = None,
             holidays: Holidays | None = None) -> FitOutcome:
    """Fit ``model`` on ``values`` (NaN = missing; ``values[0]`` at Unix time ``start_s``; ``holidays``: the
    region's public holidays) and pickle it. Runs in a worker process."""
    t0 = time.perf_counter()
    fitted = make_model(model, period).fit(values, start_s=start_s, holidays=holidays)
    fitted.predict(period)  # a fit that cannot forecast fails here, in the worker
    return FitOutcome(pickle.dumps(fitted, protocol=pickle.HIGHEST_PROTOCOL), fitted.name, time.perf_counter() - t0)


def load_blob(blob: bytes) -> Model:
    return pickle.loads(blob)  # blobs are written by this service only


def _worker_init(parent_pid: int) -> None:
    exit_with_parent(parent_pid)  # a forecaster killed with -9 takes its fit workers with it
    limit_native_threads(1)


def _backtest(series: RegularSeries, history_hours: int, horizon_hours: int, days: int, model: str,
              holidays: Holidays | None) -> BacktestResult:
    return run_backtest(series, history_hours=history_hours, horizon_hours=horizon_hours, days=days, model=model,
                        holidays=holidays)


class FitPool:
    """Worker processes for fits and backtests."""

    def __init__(self, workers: int = 1) -> None:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process running gRPC threads
        # workers are started by submit(), from the event loop's thread: it lives as long as the service
        self._executor = ProcessPoolExecutor(max_workers=max(1, workers), mp_context=ctx, initializer=_worker_init,
                                             initargs=(os.getpid(),))

    async def fit(self, model: str, values: np.ndarray, period: int, start_s: int | None = None,
                  holidays: Holidays | None = None) -> FitOutcome:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fit_blob, model, values, period, start_s, holidays)

    async def backtest(self, series: RegularSeries, history_hours: int, horizon_hours: int, days: int,
                       model: str, holidays: Holidays | None = None) -> BacktestResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, _backtest, series, history_hours, horizon_hours, days,
                                          model, holidays)

    def shutdown(self, kill_after_s: float = 1.0) -> None:
        """Stop now, whatever the workers are doing: queued work is cancelled and running fits and backtests are
        ended (SIGTERM, SIGKILL after ``kill_after_s``); their awaiters get ``BrokenProcessPool`` (a fit cut so is
        not stored). Blocks up to about ``kill_after_s`` + 1 s: call it off the event loop.

        ``ProcessPoolExecutor.shutdown(wait=False)`` alone let a running work item finish: the executor's
        manager thread, joined at interpreter exit, waited for it, so a forecaster stopped with SIGTERM during a
        fit ran on with its workers for as long as the fit took. Python 3.14 has
        ``terminate_workers()``; before it the executor's process table is the only handle on its workers."""
        processes = list((getattr(self._executor, "_processes", None) or {}).values())
        self._executor.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + kill_after_s
        for proc in processes:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
