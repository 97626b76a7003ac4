"""ForecasterService: CI and load history, day-ahead forecasts with intervals, backtests.

Concurrency model: the gRPC loop never fits. Fits and backtests run in a process pool (:mod:`fitting`); the
latest fitted model of each series lives in memory (and pickled in the ``fitted_models`` table, so a restart
keeps it) and every new point is fed to it with ``update()`` (GreenCache's hourly online step). A scheduler
re-fits (re-tunes) each series every ``refit_interval_s``. Forecasts are computed from the in-memory model
and cached per (fit, points seen, horizon, coverage), so repeated GetForecast calls cost a dictionary lookup.

Bounds: memory per series is bounded by the fit window, whatever arrives. An update feeds the model at
most ``fit_history_hours`` steps (more, e.g. points after a long gap or a backlog replayed on restart, and the
series is refitted on its last window instead of replaying them); no call builds a regular grid over more than a
bounded window (GetPoints returns the stored rows, a backtest reads the last days it scores); every numeric field
has a documented range, checked before anything is stored; forecasts are finite (clipped to
``[0, MAX_POINT_VALUE]``).

This module holds the servicer's RPCs and ``build``; the settings are in settings.py, the series' fitted models
(restore, online updates, refits) in series_state.py, the forecasts from them in predictions.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable

import grpc
import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import select

from greenserve.common import clock
from greenserve.common.app import ServiceContext
from greenserve.common.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from greenserve.common.server import Registration, registration
from greenserve.forecaster import fitting, ingest
from greenserve.forecaster.backtest import backtest_span_hours, check_windows
from greenserve.forecaster.csv_sources import HOUR_S, RegularSeries
from greenserve.forecaster.forecast_models import MODELS
from greenserve.forecaster.forecast_models.base import DEFAULT_COVERAGE_FRACTION
from greenserve.forecaster.forecast_models.holiday_calendar import Holidays
from greenserve.forecaster.models import Series
from greenserve.forecaster.predictions import Predictions
from greenserve.forecaster.series_state import SeriesState
from greenserve.forecaster.settings import ForecasterSettings
from greenserve.forecaster.stream_load import (
    MAX_SAMPLE_BYTES,
    MAX_SAMPLES_PER_CALL,
    QUANTITIES,
    LoadAccumulator,
    check_sample,
)
from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc

log = logging.getLogger("greenserve.forecaster")

MAX_HORIZON_STEPS = 168
DEFAULT_HORIZON_STEPS = 24
#: Longest a forecast waits for a series' first fit (``_first_fit``), and what it leaves of the call's deadline.
FIRST_FIT_WAIT_S = 20.0
DEADLINE_MARGIN_S = 0.5
#: Most points one GetPoints reply carries (about 4.4 MB; the default message limit is 16 MiB): a wider range is
#: refused with RESOURCE_EXHAUSTED, never built whole in memory.
MAX_POINTS_PER_REPLY = 200_000
#: Range of GetForecast's interval_coverage_fraction (0 means the default): the normal quantile of the widest is
#: about 7.1, of the narrowest about 1.3e-12; outside it the interval maths is no longer exact in float64.
MIN_COVERAGE = 1e-12
MAX_COVERAGE = 1 - 1e-12


def ts_proto(seconds: int) -> Timestamp:
    return Timestamp(seconds=int(seconds))


class ForecasterServicer(Predictions, forecaster_pb2_grpc.ForecasterServiceServicer):
    """greenserve.v1.ForecasterService."""

    def __init__(self, ctx: ServiceContext, pool: fitting.FitPool) -> None:
        self.ctx = ctx
        self.settings: ForecasterSettings = ctx.settings  # type: ignore[assignment]
        self.db = ctx.db
        self.pool = pool
        self.states: dict[int, SeriesState] = {}
        self.by_key: dict[ingest.SeriesKey, int] = {}
        self.load = LoadAccumulator(self.settings.stream_load_late_s)
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        # an unknown country fails the start here (ValueError naming it), before any series is touched
        self.load_holidays = Holidays.parse(self.settings.load_holidays) if self.settings.load_holidays else None

    # ---------------------------------------------------------------- ingestion RPCs
    def _held_series(self, pools: Iterable[str]) -> int:
        """Series held, counting those StreamLoad's open hours of ``pools`` will create (--max-series)."""
        return len(self.states) + sum(ingest.SeriesKey("load", pool, q, q) not in self.by_key
                                      for pool in pools for q in QUANTITIES)

    async def ingest_arrays(self, key: ingest.SeriesKey, resolution_s: int, times_s: np.ndarray,
                            values: np.ndarray) -> ingest.IngestResult:
        async with self._lock:  # one writer at a time keeps "validate, then write" atomic per series
            if key not in self.by_key and self._held_series(self.load.buckets) >= self.settings.max_series:
                raise ResourceExhausted(f"at most {self.settings.max_series} series (--max-series); refused new "
                                        f"series {key.kind}/{key.key}/{key.signal}", field="series")
            result = await asyncio.to_thread(ingest.ingest_points, self.db, key, resolution_s, times_s, values)
            await self._after_store(key, resolution_s, result)
        return result

    async def _after_store(self, key: ingest.SeriesKey, resolution_s: int, result: ingest.IngestResult) -> None:
        """In-memory state after a committed write (under ``self._lock``): the series, its model's update."""
        state = self.states.get(result.series_id)
        if state is None:
            state = SeriesState(result.series_id, key, resolution_s)
            self.states[result.series_id] = state
            self.by_key[key] = result.series_id
        if await asyncio.to_thread(self.after_ingest, state, result.new_times_s):
            self._spawn(self.refit(state))

    async def IngestPoints(self, request: forecaster_pb2.IngestPointsRequest,
                           context: grpc.aio.ServicerContext) -> forecaster_pb2.IngestPointsResponse:
        key = ingest.series_key(request.series)
        resolution_s = request.resolution_s or HOUR_S
        if resolution_s < 1 or resolution_s > 86_400:
            raise InvalidArgument("resolution_s", f"must be in 1..86400 (0 means 3600), got {resolution_s}")
        if len(request.points) > ingest.MAX_BATCH_POINTS:
            raise InvalidArgument("points", f"at most {ingest.MAX_BATCH_POINTS} points per call, "
                                            f"got {len(request.points)}")
        for i, p in enumerate(request.points):
            if not p.HasField("time"):
                raise InvalidArgument(f"points[{i}].time", "is required")
            _check_whole_second(f"points[{i}].time", p.time)
        times = np.array([p.time.seconds for p in request.points], dtype=np.int64)
        values = np.array([p.value for p in request.points], dtype=np.float64)
        result = await self.ingest_arrays(key, resolution_s, times, values)
        return forecaster_pb2.IngestPointsResponse(
            inserted_points=result.inserted, duplicate_points=result.duplicates,
            gaps=[forecaster_pb2.SeriesGap(start=ts_proto(t), missing_points=n)
                  for t, n in result.gaps[: ingest.MAX_REPORTED_GAPS]],
        )

    async def StreamLoad(self, request_iterator: AsyncIterator[forecaster_pb2.StreamLoadRequest],
                         context: grpc.aio.ServicerContext) -> forecaster_pb2.StreamLoadResponse:
        """All or nothing: every sample is read and checked, then the completed hours and the open ones are
        stored in one transaction; a refused call stores nothing and leaves the open hours as they were."""
        samples: list[forecaster_pb2.StreamLoadRequest] = []
        async for sample in request_iterator:
            if len(samples) >= MAX_SAMPLES_PER_CALL:
                raise InvalidArgument("samples", f"at most {MAX_SAMPLES_PER_CALL} samples per call")
            if sample.ByteSize() > MAX_SAMPLE_BYTES:
                raise InvalidArgument(f"samples[{len(samples)}]", f"at most {MAX_SAMPLE_BYTES} bytes per sample, got "
                                      f"{sample.ByteSize()}")
            samples.append(sample)
        now = clock.now_s()
        checked = [check_sample(x, i, now, self.settings.stream_load_max_age_s, self.settings.stream_load_max_ahead_s)
                   for i, x in enumerate(samples)]
        async with self._lock:  # the plan is made against the open hours no other call is changing
            plan = self.load.plan(checked)
            new_pools = [pool for pool in plan.buckets if pool not in self.load.buckets]
            if new_pools:
                held = self._held_series({*self.load.buckets, *plan.buckets})
                if held > self.settings.max_series and held > self._held_series(self.load.buckets):
                    index = next(x.index for x in checked if x.pool in new_pools)
                    raise ResourceExhausted(f"at most {self.settings.max_series} series (--max-series); a new pool "
                                            "makes three", field=f"samples[{index}].pool")
            batches = [ingest.Batch(key, HOUR_S, times, values, field_prefix=f"samples[{index}].hour")
                       for key, times, values, index in plan.emitted]
            # keep_stored: an hour the series already holds otherwise (IngestPoints wrote it) keeps its stored
            # value; refusing would leave the hour open and refuse every later call reaching its pool
            results = await asyncio.to_thread(ingest.ingest_batches, self.db, batches, gaps=False,
                                              before_commit=plan.persist, keep_stored=True)
            self.load.commit(plan)
            for batch, result in zip(batches, results, strict=True):
                if result.conflicts:
                    log.warning("StreamLoad: hour %s of %s/%s not stored: the series holds another value there or "
                                "is stored at another resolution (kept)", ingest.to_dt(int(batch.times_s[0])),
                                batch.key.key, batch.key.signal)
                await self._after_store(batch.key, HOUR_S, result)
        return forecaster_pb2.StreamLoadResponse(accepted_samples=len(samples))

    # ---------------------------------------------------------------- reads
    async def GetPoints(self, request: forecaster_pb2.GetPointsRequest,
                        context: grpc.aio.ServicerContext) -> forecaster_pb2.GetPointsResponse:
        key = ingest.series_key(request.series)
        start = _range_end(request, "start")
        end = _range_end(request, "end")
        if start is not None and end is not None and end <= start:
            raise InvalidArgument("end", "must be after start")
        state = self._state_for(key)
        # the stored rows, read and turned into messages off the event loop (never a grid over the span)
        return await asyncio.to_thread(self._points_reply, state, start, end)

    def _points_reply(self, state: SeriesState, start: int | None, end: int | None) -> forecaster_pb2.GetPointsResponse:
        times, values = ingest.load_points(self.db, state.series_id, start, end, limit=MAX_POINTS_PER_REPLY + 1)
        if len(times) > MAX_POINTS_PER_REPLY:
            raise ResourceExhausted(f"the range holds more than {MAX_POINTS_PER_REPLY} points, the most one GetPoints "
                                    f"reply carries: ask for a narrower start/end")
        points = [common_pb2.TimeSeriesPoint(time=ts_proto(t), value=v)
                  for t, v in zip(times.tolist(), values.tolist(), strict=True)]
        return forecaster_pb2.GetPointsResponse(points=points, resolution_s=state.resolution_s)

    async def ListSeries(self, request: forecaster_pb2.ListSeriesRequest,
                         context: grpc.aio.ServicerContext) -> forecaster_pb2.ListSeriesResponse:
        kinds = {common_pb2.SERIES_KIND_UNSPECIFIED: None, common_pb2.SERIES_KIND_CARBON_INTENSITY: "ci",
                 common_pb2.SERIES_KIND_LOAD: "load"}
        if request.kind not in kinds:
            raise InvalidArgument("kind", f"must be UNSPECIFIED, CARBON_INTENSITY or LOAD, got {request.kind}")
        kind = kinds[request.kind]
        infos = await asyncio.to_thread(self._series_infos, kind)
        return forecaster_pb2.ListSeriesResponse(series=infos)

    def _series_infos(self, kind: str | None) -> list[forecaster_pb2.SeriesInfo]:
        from sqlalchemy import func

        from greenserve.forecaster.models import Point

        out = []
        with self.db.session(readonly=True) as s:
            q = select(Series.id, func.min(Point.ts), func.max(Point.ts), func.count()).join(
                Point, Point.series_id == Series.id).group_by(Series.id)
            stats = {sid: (lo, hi, n) for sid, lo, hi, n in s.execute(q)}
        for state in sorted(self.states.values(), key=lambda x: (x.key.kind, x.key.key, x.key.signal)):
            if kind and state.key.kind != kind or state.series_id not in stats:
                continue
            lo, hi, n = stats[state.series_id]
            out.append(forecaster_pb2.SeriesInfo(
                series=state.key.to_proto(), resolution_s=state.resolution_s, first=ts_proto(ingest.to_s(lo)),
                last=ts_proto(ingest.to_s(hi)), point_count=n, model=state.model_name))
        return out

    async def GetCurrentCarbonIntensity(
        self, request: forecaster_pb2.GetCurrentCarbonIntensityRequest, context: grpc.aio.ServicerContext
    ) -> forecaster_pb2.GetCurrentCarbonIntensityResponse:
        region = request.region.strip()
        if not region:
            raise InvalidArgument("region", "must not be empty")
        signal = request.carbon_signal or common_pb2.CARBON_SIGNAL_DIRECT
        if signal not in ingest.SIGNAL_NAMES:
            raise InvalidArgument("carbon_signal", "must be DIRECT or LIFECYCLE")
        key = ingest.SeriesKey("ci", region, ingest.SIGNAL_NAMES[signal], "g_per_kwh")
        state = self._state_for(key)
        now = int(clock.now_s())
        step_now = now - now % state.resolution_s
        last = await asyncio.to_thread(self._last_time, state.series_id)
        if last is None:
            raise NotFound(f"series {region}/{key.signal} has no points", field="region")
        if last < step_now:
            await self._first_fit(state, context)
        naive = None
        if last < step_now and state.model is None and (step_now - last) // state.resolution_s <= MAX_HORIZON_STEPS:
            # No fit: the hour as GetForecast answers it (seasonal naive), so that a receipt and a plan agree.
            with contextlib.suppress(FailedPrecondition):  # too short a history: the latest measurement
                naive, _ = await asyncio.to_thread(self._naive_prediction, state,
                                                   int((step_now - last) // state.resolution_s),
                                                   DEFAULT_COVERAGE_FRACTION)
        if naive is not None:
            value, at, forecast = float(naive.mean[-1]), step_now, True
        elif last >= step_now or state.model is None:
            _, grid = await asyncio.to_thread(ingest.load_grid, self.db, state.series_id, state.resolution_s,
                                              last, last + 1)
            value, at, forecast = float(grid[-1]), last, False
        else:
            steps = (step_now - state.history_end_s) // state.resolution_s
            if steps > MAX_HORIZON_STEPS:
                raise FailedPrecondition(f"latest point of {region} is {steps} steps old; nothing current to give")
            pred = await asyncio.to_thread(self._prediction, state, int(steps), DEFAULT_COVERAGE_FRACTION)
            value, at, forecast = float(pred.mean[-1]), step_now, True
        return forecaster_pb2.GetCurrentCarbonIntensityResponse(carbon_intensity=common_pb2.CarbonIntensity(
            region=region, carbon_signal=signal, ci_g_per_kwh=value, time=ts_proto(at), forecast=forecast))

    # ---------------------------------------------------------------- forecasts
    async def _first_fit(self, state: SeriesState, context: grpc.aio.ServicerContext) -> None:
        """A series without a fitted model: start its first fit if none runs, and wait for it, within
        ``FIRST_FIT_WAIT_S`` and the call's deadline. The fit starts with the first ingest and takes seconds; a
        forecast asked meanwhile (the optimizer's first plan, right after `greenserve up` seeded the history) was
        seasonal naive, while every later call (``forecast get``, the router's receipts) answered from the fit: two
        CIs for one hour. Past the wait the caller answers seasonal naive (and names it as the model)."""
        if state.model is not None:
            return
        if not state.fitting:
            self._spawn(self.refit(state))
            await asyncio.sleep(0)  # the refit marks the series as fitting before its first await
        remaining = context.time_remaining()
        budget = FIRST_FIT_WAIT_S if remaining is None else min(FIRST_FIT_WAIT_S, remaining - DEADLINE_MARGIN_S)
        deadline = asyncio.get_running_loop().time() + budget
        while state.model is None and state.fitting and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)

    async def GetForecast(self, request: forecaster_pb2.GetForecastRequest,
                          context: grpc.aio.ServicerContext) -> forecaster_pb2.GetForecastResponse:
        key = ingest.series_key(request.series)
        steps = request.horizon_steps or DEFAULT_HORIZON_STEPS
        if not 1 <= steps <= MAX_HORIZON_STEPS:
            raise InvalidArgument("horizon_steps", f"must be in 1..{MAX_HORIZON_STEPS}")
        coverage = check_coverage(request.interval_coverage_fraction or DEFAULT_COVERAGE_FRACTION)
        state = self._state_for(key)
        await self._first_fit(state, context)
        if state.model is not None:
            cache_key = (state.fit_version, state.updates, steps, coverage)
            cached = state.cache.get(cache_key)
            pred = cached if cached is not None else await asyncio.to_thread(self._prediction, state, steps, coverage)
            history_end = state.history_end_s
        else:
            # No fit (too short a history, or the first fit outlasted the wait): seasonal naive, and say so.
            pred, history_end = await asyncio.to_thread(self._naive_prediction, state, steps, coverage)
        res = state.resolution_s
        points = [common_pb2.ForecastPoint(time=ts_proto(history_end + (i + 1) * res), mean=float(m),
                                           lower=float(lo), upper=float(hi))
                  for i, (m, lo, hi) in enumerate(zip(pred.mean, pred.lower, pred.upper, strict=True))]
        now = Timestamp()
        now.GetCurrentTime()
        return forecaster_pb2.GetForecastResponse(forecast=common_pb2.Forecast(
            series=key.to_proto(), model=pred.model, interval_coverage_fraction=coverage, generated_at=now,
            history_end=ts_proto(history_end), points=points, resolution_s=res))

    # ---------------------------------------------------------------- backtest
    async def Backtest(self, request: forecaster_pb2.BacktestRequest,
                       context: grpc.aio.ServicerContext) -> forecaster_pb2.BacktestResponse:
        history = request.history_hours or 72
        horizon = request.horizon_hours or 24
        days = request.days or 7
        try:
            check_windows(history, horizon, days)
        except ValueError as exc:
            name = str(exc).split(" ", 1)[0]
            raise InvalidArgument(name, str(exc)) from None
        model = request.model or self.settings.forecast_model
        if model not in MODELS:
            raise InvalidArgument("model", f"unknown model {model!r}; known: {', '.join(MODELS)}")
        which = request.WhichOneof("data")
        if which == "series":
            state = self._state_for(ingest.series_key(request.series))
            if state.resolution_s != HOUR_S:
                raise FailedPrecondition("backtests run on hourly series")
            last = await asyncio.to_thread(self._last_time, state.series_id)
            if last is None:
                raise FailedPrecondition("series has no points")
            span_s = backtest_span_hours(history, horizon, days) * HOUR_S  # what the windows read, no more
            first, grid = await asyncio.to_thread(ingest.load_grid, self.db, state.series_id, HOUR_S,
                                                  last - span_s, None)
            series = RegularSeries(f"{state.key.kind}/{state.key.key}/{state.key.signal}", first, HOUR_S, grid)
            holidays = self.holidays_of(state.key)
        elif which == "inline":
            series = await asyncio.to_thread(_inline_series, request.inline,
                                             backtest_span_hours(history, horizon, days))
            holidays = None
        else:
            raise InvalidArgument("data", "give a stored series or inline points")
        try:
            result = await self.pool.backtest(series, history, horizon, days, model, holidays)
        except ValueError as exc:
            raise FailedPrecondition(str(exc)) from None
        return forecaster_pb2.BacktestResponse(
            mape_percent=result.mape, naive_mape_percent=result.naive_mape, points=result.points,
            median_fit_s=result.fit_seconds_median, model=result.model,
            interval_coverage_fraction=result.interval_coverage_fraction,
            days=[forecaster_pb2.BacktestDay(day=ts_proto(d.day_s), mape_percent=d.mape_percent,
                                             naive_mape_percent=d.naive_mape_percent, fit_s=d.fit_s,
                                             interval_coverage_fraction=d.interval_coverage_fraction)
                  for d in result.days])


def check_coverage(coverage: float) -> float:
    """A requested interval coverage the interval maths can use: in [MIN_COVERAGE, MAX_COVERAGE], else
    InvalidArgument naming ``interval_coverage_fraction``. Inside (0, 1) is not enough: the normal quantile of a
    central interval is taken at ``0.5 + coverage / 2``, which rounds to 1.0 (an infinite z-score, INTERNAL
    before this check) for any coverage above ``1 - 2**-53``."""
    if not MIN_COVERAGE <= coverage <= MAX_COVERAGE:  # NaN fails both comparisons
        raise InvalidArgument("interval_coverage_fraction",
                              f"must be in [{MIN_COVERAGE:g}, 1 - {1 - MAX_COVERAGE:.0e}] (0 means "
                              f"{DEFAULT_COVERAGE_FRACTION}), got {coverage!r}")
    return coverage


def _check_whole_second(field: str, time: Timestamp) -> None:
    if time.nanos:
        raise InvalidArgument(field, f"sub-second timestamps are not on any step (nanos {time.nanos})")


def _range_end(request: forecaster_pb2.GetPointsRequest, field: str) -> int | None:
    """A GetPoints range end, checked against the documented time range; None when unset."""
    if not request.HasField(field):
        return None
    time = getattr(request, field)
    if not 0 <= time.nanos < 1_000_000_000:
        raise InvalidArgument(field, f"nanos must be in 0..999999999, got {time.nanos}")
    return ingest.check_time_s(field, time.seconds)


def _inline_series(inline: forecaster_pb2.InlineSeries, span_hours: int) -> RegularSeries:
    """Inline points as a grid over the last ``span_hours`` hours (all a backtest reads; older points are
    checked, then left out)."""
    if not inline.points:
        raise InvalidArgument("inline.points", "must not be empty")
    if len(inline.name) > 255:
        raise InvalidArgument("inline.name", "longer than 255 characters")
    for i, p in enumerate(inline.points):
        _check_whole_second(f"inline.points[{i}].time", p.time)
    times = np.array([p.time.seconds for p in inline.points], dtype=np.int64)
    values = np.array([p.value for p in inline.points], dtype=np.float64)
    try:
        ingest.validate_points(times, values, HOUR_S)
    except InvalidArgument as exc:
        raise InvalidArgument("inline." + exc.field, exc.message) from None
    if np.any(np.diff(times) <= 0):
        i = int(np.flatnonzero(np.diff(times) <= 0)[0]) + 1
        raise InvalidArgument(f"inline.points[{i}].time", "points must be in increasing time order")
    keep = times >= times[-1] - span_hours * HOUR_S
    times, values = times[keep], values[keep]
    first = int(times[0])
    grid = np.full(int((times[-1] - first) // HOUR_S) + 1, np.nan)
    grid[(times - first) // HOUR_S] = values
    return RegularSeries(inline.name or "inline", first, HOUR_S, grid)


async def build(ctx: ServiceContext) -> list[Registration]:
    settings: ForecasterSettings = ctx.settings  # type: ignore[assignment]
    if settings.forecast_model not in MODELS:
        raise ValueError(f"--forecast-model must be one of {', '.join(MODELS)}, got {settings.forecast_model!r}")
    pool = fitting.FitPool(settings.fit_workers)
    servicer = ForecasterServicer(ctx, pool)
    await asyncio.to_thread(servicer.restore)
    tasks = [asyncio.ensure_future(servicer.scheduler())]
    if settings.electricitymaps_url and settings.electricitymaps_zones:
        from greenserve.forecaster.provider_electricitymaps import ElectricityMapsClient, poll_forever

        client = ElectricityMapsClient(settings.electricitymaps_url, settings.electricitymaps_token)
        tasks.append(asyncio.ensure_future(poll_forever(client, servicer, settings.electricitymaps_zones,
                                                        settings.electricitymaps_poll_s)))

    async def stop() -> None:
        for task in [*tasks, *servicer._tasks]:
            task.cancel()  # a refit awaiting its worker ends here: an interrupted fit is not stored
        await asyncio.to_thread(pool.shutdown)  # ends the workers even mid-fit (within about a second)

    ctx.on_stop.append(stop)
    return [registration(forecaster_pb2, forecaster_pb2_grpc, "ForecasterService", servicer)]
