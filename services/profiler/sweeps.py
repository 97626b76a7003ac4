"""Sweeps: configurations x request rates, measured in the background and persisted point by point.

One worker measures one sweep at a time (points on a real engine must not overlap), in creation order.
Every point is committed in one transaction with the sweep's progress counters; the point that ends a
configuration's ladder commits that configuration's profile in the same transaction. So:

* a crash or restart loses at most the point being measured; on start the service re-queues every sweep
  left PENDING or RUNNING, and the run skips the cells that have a row (the unique (sweep, index) constraint
  makes a second row for a cell impossible);
* the ladder of a configuration climbs the rates in order and, unless the method says FULL_LADDER, stops after
  the first point whose SLO attainment is below the target; the remaining rates are stored as skipped points
  and the profile says where and why (``ladder_note``, ``skipped_rates_per_s``);
* CancelSweep cancels the measurement in flight (engine requests are cancelled; a simulator point is left to
  finish in its thread and dropped), keeps every committed point and stores the partial ladder's profile.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

import sqlalchemy as sa
from google.protobuf.timestamp_pb2 import Timestamp

from greenserve.common.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from greenserve.common.orm_conventions import utcnow
from greenserve.common.persistence import Database
from greenserve.common.tasks import cancel_and_wait
from greenserve.profiler import spec as spec_rules
from greenserve.profiler.keys import config_key
from greenserve.profiler.method import Method, as_proto, resolve
from greenserve.profiler.models import Sweep, SweepPoint
from greenserve.profiler.store import insert_profile
from greenserve.v1 import common_pb2, profiler_pb2

log = logging.getLogger("greenserve.profiler.sweeps")

STATE_VALUES: dict[str, profiler_pb2.SweepState] = {
    "pending": profiler_pb2.SWEEP_STATE_PENDING,
    "running": profiler_pb2.SWEEP_STATE_RUNNING,
    "succeeded": profiler_pb2.SWEEP_STATE_SUCCEEDED,
    "failed": profiler_pb2.SWEEP_STATE_FAILED,
    "cancelled": profiler_pb2.SWEEP_STATE_CANCELLED,
}
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
CANCEL_WAIT_S = 10.0
MAX_PAGE_OFFSET = 2**53  # ListSweeps tokens are row offsets
MAX_QUEUED_SWEEPS = 1000  # sweeps waiting for the worker (kept in memory): past it StartSweep is RESOURCE_EXHAUSTED


class Backend(Protocol):
    source: common_pb2.ProfileSource
    name: str

    async def prepare(self, spec: profiler_pb2.SweepSpec) -> None: ...
    async def apply_config(self, spec: profiler_pb2.SweepSpec, config: common_pb2.ProfileConfig) -> str: ...
    async def measure(self, spec: profiler_pb2.SweepSpec, config: common_pb2.ProfileConfig, rate_per_s: float,
                      method: Method) -> common_pb2.ProfilePoint: ...
    def provenance(self, spec: profiler_pb2.SweepSpec, config: common_pb2.ProfileConfig) -> tuple[str, str]: ...
    async def close(self) -> None: ...


def _ts(value: Any) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def sweep_proto(row: Sweep) -> profiler_pb2.Sweep:
    """The API view of a sweep row."""
    out = profiler_pb2.Sweep(
        id=row.id, spec=profiler_pb2.SweepSpec.FromString(row.request), state=STATE_VALUES[row.state],
        done_points=row.done_points, total_points=row.total_points, error=row.error or "",
        profile_ids=list(row.profile_ids or []), skipped_points=row.skipped_points or 0,
        notes=[str(n) for n in (row.notes or [])])
    out.created_at.CopyFrom(_ts(row.created_at))
    out.updated_at.CopyFrom(_ts(row.updated_at))
    remaining = row.total_points - row.done_points - (row.skipped_points or 0)
    if row.state not in TERMINAL and row.done_points and remaining > 0:
        out.eta_s = (row.busy_s or 0.0) / row.done_points * remaining
    return out


def profile_config(spec: profiler_pb2.SweepSpec, index: int) -> common_pb2.ProfileConfig:
    """Configuration ``index`` of the spec with the sweep's workload filled in (it is part of the key)."""
    config = common_pb2.ProfileConfig()
    config.CopyFrom(spec.configs[index])
    if not config.workload:
        config.workload = spec.workload
    return config


class SweepRunner:
    """Owns the sweeps table: accepts sweeps, runs them one at a time, cancels and streams them."""

    def __init__(self, db: Database, backends: Mapping[int, Callable[[], Backend]]) -> None:
        self.db = db
        self._backend_factories = dict(backends)
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()
        self._cancel_requested: set[str] = set()
        self._running_id: str | None = None
        self._measure_task: asyncio.Task[Any] | None = None
        self._run_done: dict[str, asyncio.Event] = {}

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> list[str]:
        """Re-queue sweeps left PENDING or RUNNING by a previous process and start the worker."""
        def unfinished() -> list[str]:
            with self.db.session(readonly=True) as s:
                return list(s.scalars(sa.select(Sweep.id).where(Sweep.state.in_(("pending", "running")))
                                      .order_by(Sweep.created_at, Sweep.id)))

        ids = await asyncio.to_thread(unfinished)
        for sweep_id in ids:
            self._queue.put_nowait(sweep_id)
        self._worker = asyncio.get_running_loop().create_task(self._work(), name="profiler-sweeps")
        return ids

    async def stop(self) -> None:
        await cancel_and_wait(self._worker)

    def backend(self, spec: profiler_pb2.SweepSpec) -> Backend:
        factory = self._backend_factories.get(spec.backend)
        if factory is None:
            raise FailedPrecondition(f"backend {profiler_pb2.SweepBackend.Name(spec.backend)} is not enabled "
                                     "in this profiler", field="spec.backend")
        return factory()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- API -----------------------------------------------------------------------------------------

    async def submit(self, spec: profiler_pb2.SweepSpec) -> profiler_pb2.Sweep:
        """Validate (nothing stored when it fails), check the backend can run it, store PENDING, queue it."""
        spec_rules.validate(spec)
        backend = self.backend(spec)
        try:
            await backend.prepare(spec)
        finally:
            await backend.close()
        if self._queue.qsize() >= MAX_QUEUED_SWEEPS:
            raise ResourceExhausted(f"{MAX_QUEUED_SWEEPS} sweeps are waiting to run already; start this one when "
                                    "fewer are (or cancel some)")
        now = utcnow()
        row = Sweep(id=str(uuid.uuid4()), state="pending", created_at=now, updated_at=now,
                    total_points=len(spec.configs) * len(spec.request_rates_per_s), done_points=0, skipped_points=0,
                    busy_s=0.0, error=None, request=spec.SerializeToString(), notes=[], profile_ids=[])

        def insert() -> profiler_pb2.Sweep:
            with self.db.session() as s:
                s.add(row)
                s.flush()
                return sweep_proto(row)

        created = await asyncio.to_thread(insert)
        self._queue.put_nowait(created.id)
        await self._notify()
        return created

    def _load(self, sweep_id: str) -> Sweep:
        with self.db.session(readonly=True) as s:
            row = s.get(Sweep, sweep_id)
            if row is None:
                raise NotFound(f"no sweep {sweep_id!r}", field="sweep_id")
            s.expunge(row)
            return row

    async def get(self, sweep_id: str) -> profiler_pb2.Sweep:
        _check_id(sweep_id)
        return sweep_proto(await asyncio.to_thread(self._load, sweep_id))

    async def list(self, page_size: int, page_token: str) -> tuple[list[profiler_pb2.Sweep], str]:
        size = page_size or 50
        if size > 1000:
            raise InvalidArgument("page_size", "must be at most 1000")
        try:
            offset = int(page_token) if page_token else 0
        except ValueError:
            offset = -1
        if not 0 <= offset <= MAX_PAGE_OFFSET:  # beyond it the database driver overflows (INTERNAL)
            raise InvalidArgument("page_token", "not a token this service returned")

        def rows() -> list[Sweep]:
            with self.db.session(readonly=True) as s:
                found = list(s.scalars(sa.select(Sweep).order_by(Sweep.created_at.desc(), Sweep.id)
                                       .offset(offset).limit(size + 1)))
                for r in found:
                    s.expunge(r)
                return found

        found = await asyncio.to_thread(rows)
        token = str(offset + size) if len(found) > size else ""
        return [sweep_proto(r) for r in found[:size]], token

    async def cancel(self, sweep_id: str) -> profiler_pb2.Sweep:
        """Stop the sweep within seconds; committed points stay, the partial ladder's profile is stored."""
        _check_id(sweep_id)
        row = await asyncio.to_thread(self._load, sweep_id)
        if row.state in TERMINAL:
            raise FailedPrecondition(f"sweep {sweep_id} already ended ({row.state})", field="sweep_id")
        if self._running_id == sweep_id:
            self._cancel_requested.add(sweep_id)
            done = self._run_done.setdefault(sweep_id, asyncio.Event())
            if self._measure_task is not None:
                self._measure_task.cancel()
            try:
                await asyncio.wait_for(done.wait(), CANCEL_WAIT_S)
            except TimeoutError:
                log.warning("sweep did not stop in time; marking it cancelled", extra={"sweep_id": sweep_id})
        else:  # waiting: its place in the queue (MAX_QUEUED_SWEEPS) is free at once
            with contextlib.suppress(ValueError):
                self._queue._queue.remove(sweep_id)  # type: ignore[attr-defined]  # asyncio.Queue's deque
        await asyncio.to_thread(self._finish, sweep_id, "cancelled", "", True)
        await self._notify()
        return await self.get(sweep_id)

    async def watch(self, sweep_id: str) -> AsyncIterator[tuple[profiler_pb2.Sweep, common_pb2.ProfilePoint | None]]:
        """The sweep now (with every point already measured, one event each), then one event per change."""
        _check_id(sweep_id)
        sent: set[int] = set()
        last_state: tuple[int, int, int] | None = None
        while True:
            row, points = await asyncio.to_thread(self._snapshot, sweep_id, frozenset(sent))
            sweep = sweep_proto(row)
            state = (sweep.state, sweep.done_points, sweep.skipped_points)
            for index, point in points:
                sent.add(index)
                yield sweep, point
            if not points and state != last_state:
                yield sweep, None
            last_state = state
            if row.state in TERMINAL:
                return
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), 1.0)
                except TimeoutError:
                    pass

    def _snapshot(self, sweep_id: str, sent: frozenset[int],
                  ) -> tuple[Sweep, builtins.list[tuple[int, common_pb2.ProfilePoint]]]:
        with self.db.session(readonly=True) as s:
            row = s.get(Sweep, sweep_id)
            if row is None:
                raise NotFound(f"no sweep {sweep_id!r}", field="sweep_id")
            s.expunge(row)
            found = s.execute(sa.select(SweepPoint.point_index, SweepPoint.body)
                              .where(SweepPoint.sweep_id == sweep_id, SweepPoint.state == "measured")
                              .order_by(SweepPoint.point_index)).all()
        return row, [(i, common_pb2.ProfilePoint.FromString(b)) for i, b in found if i not in sent]

    # -- the worker ----------------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            sweep_id = await self._queue.get()
            self._running_id = sweep_id
            try:
                await self._run(sweep_id)
            except asyncio.CancelledError:
                if sweep_id not in self._cancel_requested:
                    raise  # shutdown: the sweep stays RUNNING and resumes on the next start
            except Exception as exc:  # a failing sweep must not stop the worker
                log.exception("sweep failed", extra={"sweep_id": sweep_id})
                await asyncio.to_thread(self._finish, sweep_id, "failed", f"{type(exc).__name__}: {exc}", False)
            finally:
                self._running_id = None
                self._measure_task = None
                self._cancel_requested.discard(sweep_id)
                self._run_done.setdefault(sweep_id, asyncio.Event()).set()
                self._run_done.pop(sweep_id, None)
                await self._notify()

    async def _run(self, sweep_id: str) -> None:
        row = await asyncio.to_thread(self._load, sweep_id)
        if row.state in TERMINAL:
            return
        spec = profiler_pb2.SweepSpec.FromString(row.request)
        method = resolve(spec)
        done = await asyncio.to_thread(self._cells, sweep_id)
        await asyncio.to_thread(self._set_running, sweep_id, bool(done))
        await self._notify()
        backend = self.backend(spec)
        n_rates = len(spec.request_rates_per_s)
        try:
            for ci in range(len(spec.configs)):
                if all(ci * n_rates + ri in done for ri in range(n_rates)):
                    continue  # ladder finished (measured or stopped) before a restart
                config = profile_config(spec, ci)
                note = await backend.apply_config(spec, config)
                for ri, rate in enumerate(spec.request_rates_per_s):
                    index = ci * n_rates + ri
                    if index in done:
                        continue
                    if sweep_id in self._cancel_requested:
                        return
                    started = time.monotonic()
                    self._measure_task = asyncio.ensure_future(backend.measure(spec, config, rate, method))
                    point = await self._measure_task
                    self._measure_task = None
                    busy_s = time.monotonic() - started
                    stop = method.stop_below_target and point.below_slo_target
                    skipped = [ci * n_rates + rj for rj in range(ri + 1, n_rates)] if stop else []
                    last = stop or ri == n_rates - 1
                    profile = None
                    if last:
                        points = [p for p in (done.get(ci * n_rates + rj) for rj in range(ri)) if p is not None]
                        profile = self._profile(spec, ci, [*points, point], backend, method,
                                                stopped_at=point if stop else None, note=note)
                    await asyncio.to_thread(self._commit, sweep_id, index, ci, ri, point, skipped, profile, busy_s)
                    done[index] = point
                    for j in skipped:
                        done[j] = None
                    await self._notify()
                    if stop:
                        break
        except asyncio.CancelledError:
            if sweep_id in self._cancel_requested:
                return
            raise
        finally:
            await backend.close()
        await asyncio.to_thread(self._finish, sweep_id, "succeeded", "", False)

    # -- database steps (threads) --------------------------------------------------------------------

    def _cells(self, sweep_id: str) -> dict[int, common_pb2.ProfilePoint | None]:
        """Committed cells: index -> point (None for a skipped cell)."""
        with self.db.session(readonly=True) as s:
            found = s.execute(sa.select(SweepPoint.point_index, SweepPoint.state, SweepPoint.body)
                              .where(SweepPoint.sweep_id == sweep_id)).all()
        return {i: (common_pb2.ProfilePoint.FromString(b) if st == "measured" else None) for i, st, b in found}

    def _set_running(self, sweep_id: str, resumed: bool) -> None:
        with self.db.session() as s:
            row = s.get(Sweep, sweep_id)
            if row is None or row.state in TERMINAL:
                return
            if resumed or row.state == "running":
                row.notes = [*(row.notes or []), f"resumed at {utcnow().isoformat()} after "
                             f"{row.done_points + row.skipped_points} of {row.total_points} points"]
            row.state, row.updated_at = "running", max(utcnow(), row.created_at)

    def _commit(self, sweep_id: str, index: int, ci: int, ri: int, point: common_pb2.ProfilePoint,
                skipped: builtins.list[int], profile: common_pb2.Profile | None, busy_s: float) -> None:
        with self.db.session() as s:
            row = s.get(Sweep, sweep_id)
            if row is None or row.state != "running":
                return  # cancelled meanwhile: the point is dropped
            now = max(utcnow(), row.created_at)
            s.add(SweepPoint(sweep_id=sweep_id, point_index=index, config_index=ci, rate_index=ri, state="measured",
                             created_at=now, body=point.SerializeToString()))
            n_rates = len(profiler_pb2.SweepSpec.FromString(row.request).request_rates_per_s)
            for j in skipped:
                s.add(SweepPoint(sweep_id=sweep_id, point_index=j, config_index=ci, rate_index=j % n_rates,
                                 state="skipped", created_at=now, body=b""))
            row.done_points += 1
            row.skipped_points = (row.skipped_points or 0) + len(skipped)
            row.busy_s = (row.busy_s or 0.0) + busy_s
            row.updated_at = now
            if profile is not None:
                stored = insert_profile(s, profile, sweep_id=sweep_id)
                row.profile_ids = [*(row.profile_ids or []), f"{stored.config_key}@{stored.version}"]
                if profile.ladder_note:
                    row.notes = [*(row.notes or []), f"{stored.config_key}: {profile.ladder_note}"]

    def _finish(self, sweep_id: str, state: str, error: str, store_partial: bool) -> None:
        with self.db.session() as s:
            row = s.get(Sweep, sweep_id)
            if row is None or row.state in TERMINAL:
                return
            spec = profiler_pb2.SweepSpec.FromString(row.request)
            if store_partial and row.done_points:
                self._store_partial(s, row, spec)
            row.state, row.error = state, error or None
            row.updated_at = max(utcnow(), row.created_at)

    def _store_partial(self, s: Any, row: Sweep, spec: profiler_pb2.SweepSpec) -> None:
        """On cancel: the profile of a configuration whose ladder was cut short (if it has measured points)."""
        n_rates = len(spec.request_rates_per_s)
        cells = s.execute(sa.select(SweepPoint.config_index, SweepPoint.rate_index, SweepPoint.state, SweepPoint.body)
                          .where(SweepPoint.sweep_id == row.id)).all()
        by_config: dict[int, dict[int, bytes | None]] = {}
        for ci, ri, st, body in cells:
            by_config.setdefault(ci, {})[ri] = body if st == "measured" else None
        stored_keys = {pid.rsplit("@", 1)[0] for pid in (row.profile_ids or [])}
        backend = self.backend(spec)
        method = resolve(spec)
        for ci, cells_of in sorted(by_config.items()):
            if len(cells_of) == n_rates:
                continue  # complete ladders stored their profile with their last point
            config = profile_config(spec, ci)
            if config_key(config) in stored_keys:
                continue
            points = [common_pb2.ProfilePoint.FromString(b) for _, b in sorted(cells_of.items()) if b is not None]
            if not points:
                continue
            profile = self._profile(spec, ci, points, backend, method, stopped_at=None, note="")
            measured = len(points)
            profile.ladder_note = f"partial: sweep cancelled after {measured} of {n_rates} rates"
            profile.skipped_rates_per_s.extend(spec.request_rates_per_s[measured:])
            stored = insert_profile(s, profile, sweep_id=row.id)
            row.profile_ids = [*(row.profile_ids or []), f"{stored.config_key}@{stored.version}"]

    def _profile(self, spec: profiler_pb2.SweepSpec, ci: int, points: builtins.list[common_pb2.ProfilePoint],
                 backend: Backend, method: Method, *, stopped_at: common_pb2.ProfilePoint | None, note: str) -> common_pb2.Profile:
        config = profile_config(spec, ci)
        provenance, model_version = backend.provenance(spec, config)
        sources = sorted({p.power_source for p in points if p.power_source})
        profile = common_pb2.Profile(config=config, slo=spec.slo, source=backend.source,
                                     method=as_proto(method), model_version=model_version)
        profile.points.extend(sorted(points, key=lambda p: p.request_rate_per_s))
        parts = [provenance, f"workload {spec.workload}, seed {spec.seed}"]
        if sources:
            parts.append("power: " + ", ".join(sources))
        if note:
            parts.append(note)
        profile.note = "; ".join(parts)
        if stopped_at is not None:
            rate = stopped_at.request_rate_per_s
            later = [r for r in spec.request_rates_per_s if r > rate]
            profile.ladder_note = (f"stopped: SLO attainment {stopped_at.slo_attainment_fraction:.3f} < target "
                                   f"{spec.slo.attainment_fraction:.3f} at {rate:g} req/s"
                                   + (f"; not measured: {', '.join(f'{r:g}' for r in later)} req/s" if later else ""))
            profile.skipped_rates_per_s.extend(later)
        return profile


def _check_id(sweep_id: str) -> None:
    try:
        uuid.UUID(sweep_id)
    except ValueError:
        raise InvalidArgument("sweep_id", f"not a sweep id: {sweep_id!r}") from None
