"""The forecaster's fitted model of each series: in memory, persisted, fed online, re-fitted on a schedule.

The gRPC loop never fits. Fits run in a process pool (:mod:`fitting`); the latest fitted model of each series
lives in memory (and pickled in the ``fitted_models`` table, so a restart keeps it) and every new point is fed to
it with ``update()`` (GreenCache's hourly online step). A scheduler re-fits (re-tunes) each series every
``refit_interval_s``. An update feeds the model at most ``fit_history_hours`` steps (more, e.g. points after a long
gap or a backlog replayed on restart, and the series is refitted on its last window instead of replaying them).

``FittedSeries`` is a part of ``ForecasterServicer`` (service.py), which sets the attributes it declares.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np
from sqlalchemy import select

from greenserve.common.errors import NotFound
from greenserve.common.persistence import Database
from greenserve.forecaster import fitting, ingest
from greenserve.forecaster.forecast_models import Model, Prediction
from greenserve.forecaster.forecast_models.holiday_calendar import Holidays, holidays_for_region
from greenserve.forecaster.models import FittedModel, Series
from greenserve.forecaster.settings import ForecasterSettings
from greenserve.forecaster.stream_load import LoadAccumulator

log = logging.getLogger("greenserve.forecaster")

#: Points a series needs before it is fitted (two days of hourly data: one to learn, one to check).
MIN_FIT_POINTS = 48


@dataclass
class SeriesState:
    """What the servicer holds in memory for one series."""

    series_id: int
    key: ingest.SeriesKey
    resolution_s: int
    model: Model | None = None
    model_name: str = ""
    fit_version: int = 0
    history_end_s: int = 0  # last step the model has seen
    fitted_at_s: float = 0.0
    updates: int = 0
    fitting: bool = False
    stale: bool = False  # points arrived that the model cannot take with update() (older, or after a gap)
    cache: dict[tuple[int, int, int, float], Prediction] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)  # model.update vs model.predict


class FittedSeries:
    """The servicer's series and their models: restore at start, online updates, refits and their schedule."""

    settings: ForecasterSettings
    db: Database
    pool: fitting.FitPool
    states: dict[int, SeriesState]
    by_key: dict[ingest.SeriesKey, int]
    load: LoadAccumulator
    _tasks: set[asyncio.Task[None]]
    _lock: asyncio.Lock
    load_holidays: Holidays | None

    def holidays_of(self, key: ingest.SeriesKey) -> Holidays | None:
        """Public holidays of a series: its region's for CI, the configured ones for load (pool names say
        nothing of where the users are)."""
        return holidays_for_region(key.key) if key.kind == "ci" else self.load_holidays

    # ---------------------------------------------------------------- state and persistence
    def restore(self) -> None:
        """Load series and their persisted fits (startup); replay points stored after each fit."""
        with self.db.session(readonly=True) as s:
            series = s.scalars(select(Series)).all()
            fits = {f.series_id: f for f in s.scalars(select(FittedModel)).all()}
            rows = [(x.id, ingest.SeriesKey(x.kind, x.key, x.signal, x.unit), x.resolution_s) for x in series]
            self.load.restore(s)
            fit_rows = {k: (f.format_version, f.blob, f.model_name, ingest.to_s(f.history_end), f.fitted_at,
                            f.requested_model) for k, f in fits.items()}
        for series_id, key, resolution_s in rows:
            state = SeriesState(series_id, key, resolution_s)
            self.states[series_id] = state
            self.by_key[key] = series_id
            row = fit_rows.get(series_id)
            if row is None:
                continue
            version, blob, name, history_end_s, fitted_at, requested = row
            if version != fitting.FORMAT_VERSION or requested != self.settings.forecast_model:
                log.info("series %s: stored fit ignored (format %s, model %s)", key, version, requested)
                continue
            try:
                state.model = fitting.load_blob(blob)
            except Exception as exc:  # noqa: BLE001 - corrupt or from an incompatible build: refit instead
                log.warning("series %s: stored fit unreadable (%s); will refit", key, exc)
                continue
            state.model_name, state.history_end_s = name, history_end_s
            state.fitted_at_s = fitted_at.timestamp()
            state.fit_version = 1
            self._replay_after_fit(state)

    def _replay_after_fit(self, state: SeriesState) -> None:
        """Feed the model the points stored after its fit, or mark it stale (refit on the last window) when
        they span more than the window: the model never takes more than ``fit_history_hours`` steps at once."""
        last = self._last_time(state.series_id)
        if last is None or state.model is None or last <= state.history_end_s:
            return
        steps = (last - state.history_end_s) // state.resolution_s
        if steps > self.settings.fit_history_hours:
            state.stale = True
            return
        self._feed(state, last)

    def _feed(self, state: SeriesState, end_s: int) -> None:
        """Update the model with the steps after ``history_end_s`` up to ``end_s`` (NaN where missing); the
        caller has bounded the count."""
        res = state.resolution_s
        steps = (end_s - state.history_end_s) // res
        start = state.history_end_s + res
        first, grid = ingest.load_grid(self.db, state.series_id, res, start, end_s + res)
        values = np.full(steps, np.nan)
        if len(grid):
            offset = (first - start) // res
            values[offset:offset + len(grid)] = grid
        assert state.model is not None
        state.model.update(values)
        state.history_end_s = end_s
        state.updates += steps
        state.cache.clear()

    def _state_for(self, key: ingest.SeriesKey) -> SeriesState:
        series_id = self.by_key.get(key)
        if series_id is None:
            raise NotFound(f"no series {key.kind}/{key.key}/{key.signal}", field="series")
        return self.states[series_id]

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def refit(self, state: SeriesState) -> None:
        """Fit the series' model in a worker, then swap it in and persist it. Never raises."""
        if state.fitting:
            return
        state.fitting = True
        try:
            hours = self.settings.fit_history_hours
            res = state.resolution_s
            last = await asyncio.to_thread(self._last_time, state.series_id)
            if last is None:
                return
            first, grid = await asyncio.to_thread(ingest.load_grid, self.db, state.series_id, res,
                                                  last - (hours - 1) * res, None)
            if np.isfinite(grid).sum() < MIN_FIT_POINTS:
                return
            period = max(1, 86_400 // res)
            outcome = await self.pool.fit(self.settings.forecast_model, grid, period, first,
                                          self.holidays_of(state.key))
            model = await asyncio.to_thread(fitting.load_blob, outcome.blob)  # unpickling re-runs a filter
            history_end = first + (len(grid) - 1) * res
            # Stored first, outside the ingest lock: a write that waits for the database (another writer holding
            # SQLite's lock, up to the busy timeout) must not hold up the ingests behind it, which then waited for
            # their own busy timeout after this one's (twice the timeout). Points ingested meanwhile are after
            # history_end: the swap below replays them, and a restart restoring this fit replays them too.
            await asyncio.to_thread(self._persist_fit, state, outcome, history_end)
            async with self._lock:  # no ingest between the swap and the replay of points that came meanwhile
                await asyncio.to_thread(self._swap_in, state, model, outcome.model_name, history_end)
            log.info("series %s/%s: fitted %s in %.2fs", state.key.key, state.key.signal, outcome.model_name,
                     outcome.fit_s)
        except Exception:
            log.exception("series %s: fit failed; serving the previous fit", state.key)
        finally:
            state.fitting = False

    def _swap_in(self, state: SeriesState, model: Model, model_name: str, history_end_s: int) -> None:
        """Serve a new fit, then feed it the points stored since its history (a worker thread: the replay reads
        the database and filters)."""
        with state.lock:
            state.model, state.model_name = model, model_name
            state.history_end_s, state.fitted_at_s = history_end_s, time.time()
            state.fit_version += 1
            state.updates, state.stale = 0, False
            state.cache.clear()
            self._replay_after_fit(state)

    def _last_time(self, series_id: int) -> int | None:
        from sqlalchemy import func

        from greenserve.forecaster.models import Point

        with self.db.session(readonly=True) as s:
            ts = s.scalar(select(func.max(Point.ts)).where(Point.series_id == series_id))
        return None if ts is None else ingest.to_s(ts)

    def _persist_fit(self, state: SeriesState, outcome: fitting.FitOutcome, history_end_s: int) -> None:
        with self.db.session() as s:
            row = s.get(FittedModel, state.series_id)
            if row is None:
                row = FittedModel(series_id=state.series_id)
                s.add(row)
            row.requested_model = self.settings.forecast_model
            row.model_name = outcome.model_name[:512]
            row.format_version = fitting.FORMAT_VERSION
            row.fitted_at = datetime.now(timezone.utc)
            row.history_end = ingest.to_dt(history_end_s)
            row.fit_s = outcome.fit_s
            row.blob = outcome.blob

    def after_ingest(self, state: SeriesState, new_times_s: np.ndarray) -> bool:
        """Feed new points to the model (online update); True when the series needs a fit now: it has none, or
        the new points lie more than ``fit_history_hours`` steps after the model's last one (a refit on the last
        window replaces an update that long)."""
        if state.model is None:
            return not state.fitting
        if len(new_times_s) == 0:
            return False
        res = state.resolution_s
        if new_times_s.min() <= state.history_end_s:
            state.stale = True  # a hole in the past was filled: the next refit takes it
        after = new_times_s[new_times_s > state.history_end_s]
        if len(after):
            end = int(after.max())
            if (end - state.history_end_s) // res > self.settings.fit_history_hours:
                state.stale = True
                return not state.fitting
            with state.lock:
                self._feed(state, end)
        return False

    async def scheduler(self) -> None:
        """Re-tune every series on the schedule, and fit new ones."""
        while True:
            now = time.time()
            for state in list(self.states.values()):
                due = state.model is None or state.stale or now - state.fitted_at_s >= self.settings.refit_interval_s
                if due and not state.fitting:
                    await self.refit(state)
            await asyncio.sleep(min(60.0, self.settings.refit_interval_s / 4))
