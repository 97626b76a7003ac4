"""Validation and storage of series points: all-or-nothing batches, idempotent duplicates, reported gaps.

Rules:

* every value must be finite and in ``[0, MAX_POINT_VALUE]`` (1e15). A bad point fails the whole batch with
  INVALID_ARGUMENT naming ``points[i]``, and nothing of the batch is stored;
* a timestamp must lie in ``[TIME_MIN_S, TIME_MAX_S)``: 1970-01-01 to 2100-01-01 UTC (within this range no span, gap or step count overflows a uint32 or a datetime), and sit on
  the series' step (a multiple of ``resolution_s`` since the epoch);
* a timestamp already stored with the same value is a duplicate and is ignored; with another value it is a
  conflict, rejected like a bad point (stored history is never silently rewritten);
* missing steps are reported as gaps; nothing is interpolated into the store.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
from sqlalchemy import Select, func, insert, select
from sqlalchemy.orm import Session

from greenserve.common.errors import InvalidArgument
from greenserve.common.persistence import Database
from greenserve.forecaster.csv_sources import missing_runs
from greenserve.forecaster.models import Point, Series
from greenserve.v1 import common_pb2

#: Gaps listed in one response at most (the earliest first).
MAX_REPORTED_GAPS = 100
#: Largest batch accepted by one IngestPoints call.
MAX_BATCH_POINTS = 200_000
#: Range of every point time (Unix seconds): 1970-01-01T00:00:00Z inclusive to 2100-01-01T00:00:00Z exclusive.
TIME_MIN_S = 0
TIME_MAX_S = 4_102_444_800
#: Largest point value (and forecast bound) in any unit: 1e15 g/kWh or per second is far beyond any grid or fleet.
MAX_POINT_VALUE = 1e15

UNIT_NAMES = {
    common_pb2.UNIT_G_PER_KWH: "g_per_kwh",
    common_pb2.UNIT_REQUESTS_PER_S: "requests_per_s",
    common_pb2.UNIT_INPUT_TOKENS_PER_S: "input_tokens_per_s",
    common_pb2.UNIT_OUTPUT_TOKENS_PER_S: "output_tokens_per_s",
}
UNIT_BY_NAME = {v: k for k, v in UNIT_NAMES.items()}
SIGNAL_NAMES = {common_pb2.CARBON_SIGNAL_DIRECT: "direct", common_pb2.CARBON_SIGNAL_LIFECYCLE: "lifecycle"}
SIGNAL_BY_NAME = {v: k for k, v in SIGNAL_NAMES.items()}


@dataclass(frozen=True)
class SeriesKey:
    """A series identity as stored: kind ('ci'/'load'), key (region or pool), signal, unit."""

    kind: str
    key: str
    signal: str
    unit: str

    def to_proto(self) -> common_pb2.SeriesRef:
        if self.kind == "ci":
            return common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key=self.key,
                                        carbon_signal=SIGNAL_BY_NAME[self.signal], unit=common_pb2.UNIT_G_PER_KWH)
        return common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_LOAD, key=self.key, unit=UNIT_BY_NAME[self.unit])


def series_key(ref: common_pb2.SeriesRef, field: str = "series") -> SeriesKey:
    """Validate a SeriesRef: CI needs a carbon signal (unit g/kWh); load needs a load unit."""
    key = ref.key.strip()
    if not key:
        raise InvalidArgument(f"{field}.key", "must not be empty")
    if len(key) > 255:
        raise InvalidArgument(f"{field}.key", "longer than 255 characters")
    if ref.kind == common_pb2.SERIES_KIND_CARBON_INTENSITY:
        if ref.carbon_signal not in SIGNAL_NAMES:
            raise InvalidArgument(f"{field}.carbon_signal", "carbon-intensity series need DIRECT or LIFECYCLE")
        if ref.unit not in (common_pb2.UNIT_UNSPECIFIED, common_pb2.UNIT_G_PER_KWH):
            raise InvalidArgument(f"{field}.unit", "carbon intensity is in UNIT_G_PER_KWH")
        return SeriesKey("ci", key, SIGNAL_NAMES[ref.carbon_signal], "g_per_kwh")
    if ref.kind == common_pb2.SERIES_KIND_LOAD:
        if ref.unit not in UNIT_NAMES or ref.unit == common_pb2.UNIT_G_PER_KWH:
            raise InvalidArgument(f"{field}.unit", "load series need REQUESTS_PER_S, INPUT_TOKENS_PER_S or "
                                                   "OUTPUT_TOKENS_PER_S")
        unit = UNIT_NAMES[ref.unit]
        return SeriesKey("load", key, unit, unit)
    raise InvalidArgument(f"{field}.kind", "must be CARBON_INTENSITY or LOAD")


def check_time_s(field: str, seconds: int) -> int:
    """``seconds`` when it lies in the documented range of point times, else InvalidArgument naming ``field``."""
    if not TIME_MIN_S <= seconds < TIME_MAX_S:
        raise InvalidArgument(field, f"must be in 1970-01-01T00:00:00Z .. 2100-01-01T00:00:00Z (Unix seconds "
                                     f"{TIME_MIN_S}..{TIME_MAX_S - 1}), got {seconds}")
    return seconds


def validate_points(times_s: np.ndarray, values: np.ndarray, resolution_s: int) -> None:
    """Raise InvalidArgument naming the first bad point: non-finite, negative or too large, out of the time
    range, off-step or repeated with another value inside the batch."""
    if not 1 <= resolution_s <= 86_400:
        raise InvalidArgument("resolution_s", f"must be in 1..86400, got {resolution_s}")
    if len(values) > MAX_BATCH_POINTS:
        raise InvalidArgument("points", f"at most {MAX_BATCH_POINTS} points per call, got {len(values)}")
    bad = np.flatnonzero(~np.isfinite(values))
    if len(bad):
        i = int(bad[0])
        raise InvalidArgument(f"points[{i}].value", f"must be finite, got {values[i]!r}")
    bad = np.flatnonzero((values < 0) | (values > MAX_POINT_VALUE))
    if len(bad):
        i = int(bad[0])
        raise InvalidArgument(f"points[{i}].value", f"must be in [0, {MAX_POINT_VALUE:g}], got {values[i]!r}")
    bad = np.flatnonzero((times_s < TIME_MIN_S) | (times_s >= TIME_MAX_S))
    if len(bad):
        i = int(bad[0])
        check_time_s(f"points[{i}].time", int(times_s[i]))
    bad = np.flatnonzero(times_s % resolution_s != 0)
    if len(bad):
        i = int(bad[0])
        raise InvalidArgument(f"points[{i}].time", f"not on the {resolution_s}s step of the series")
    order = np.argsort(times_s, kind="stable")
    st, sv = times_s[order], values[order]
    same = np.flatnonzero((st[1:] == st[:-1]) & (sv[1:] != sv[:-1]))
    if len(same):
        i = int(order[same[0] + 1])
        raise InvalidArgument(f"points[{i}].time", "repeated in the batch with a different value")


def to_dt(ts_s: int) -> datetime:
    return datetime.fromtimestamp(int(ts_s), tz=timezone.utc)


def to_s(value: datetime) -> int:
    return int(value.timestamp())


@dataclass
class IngestResult:
    series_id: int
    inserted: int
    duplicates: int
    gaps: list[tuple[int, int]]
    new_times_s: np.ndarray
    #: points left out because the series holds another value at their time or is stored at another resolution
    #: (``keep_stored`` only: otherwise they refuse the batch)
    conflicts: int = 0


@dataclass
class Batch:
    """Points for one series, stored by :func:`ingest_batches` (``field_prefix`` names them in errors)."""

    key: SeriesKey
    resolution_s: int
    times_s: np.ndarray
    values: np.ndarray
    field_prefix: str = "points"


def ingest_points(db: Database, key: SeriesKey, resolution_s: int, times_s: np.ndarray, values: np.ndarray,
                  field_prefix: str = "points") -> IngestResult:
    """Store a validated batch in one transaction (all or nothing)."""
    return ingest_batches(db, [Batch(key, resolution_s, times_s, values, field_prefix)])[0]


def ingest_batches(db: Database, batches: list[Batch], *, gaps: bool = True,
                   before_commit: Callable[[Session], None] | None = None,
                   keep_stored: bool = False) -> list[IngestResult]:
    """Validate every batch, then store them all in one transaction: all or nothing across series.
    ``before_commit`` runs in that transaction (StreamLoad stores its open hours there). ``keep_stored``: a point
    whose time the series already holds with another value, or a batch for a series stored at another resolution,
    is left out (counted in ``conflicts``) instead of refusing the call; the stored history is kept either way."""
    for b in batches:
        try:
            validate_points(b.times_s, b.values, b.resolution_s)
        except InvalidArgument as exc:
            field = exc.field.replace("points", b.field_prefix, 1) if exc.field.startswith("points") else exc.field
            raise InvalidArgument(field, exc.message) from None
    stored: list[tuple[int, int, int, np.ndarray, int]] = []
    with db.session() as s:
        for b in batches:
            stored.append(_store(s, b, keep_stored))
        if before_commit is not None:
            before_commit(s)
    return [IngestResult(sid, inserted, dups, series_gaps(db, sid, b.resolution_s) if gaps else [], new, conflicts)
            for (sid, inserted, dups, new, conflicts), b in zip(stored, batches, strict=True)]


def _store(s: Session, b: Batch, keep_stored: bool = False) -> tuple[int, int, int, np.ndarray, int]:
    """Insert a validated batch in the open transaction: (series id, inserted, duplicates, new times, conflicts
    left out: see ``ingest_batches``)."""
    key, resolution_s, times_s, values = b.key, b.resolution_s, b.times_s, b.values
    series = s.scalars(select(Series).where(Series.kind == key.kind, Series.key == key.key,
                                            Series.signal == key.signal)).one_or_none()
    if series is None:
        series = Series(kind=key.kind, key=key.key, signal=key.signal, unit=key.unit, resolution_s=resolution_s)
        s.add(series)
        s.flush()
    elif series.resolution_s != resolution_s:
        if keep_stored:
            return series.id, 0, 0, np.empty(0, dtype=np.int64), len(times_s)
        raise InvalidArgument("resolution_s", f"series is stored at {series.resolution_s}s, got {resolution_s}s")
    existing: dict[int, float] = {}
    if len(times_s):
        lo, hi = to_dt(int(times_s.min())), to_dt(int(times_s.max()))
        for ts, value in s.execute(select(Point.ts, Point.value).where(
                Point.series_id == series.id, Point.ts >= lo, Point.ts <= hi)):
            existing[to_s(ts)] = value
    rows = []
    seen: set[int] = set()
    duplicates = conflicts = 0
    for i, (t, v) in enumerate(zip(times_s.tolist(), values.tolist(), strict=True)):
        if t in existing:
            if not math.isclose(existing[t], v, rel_tol=1e-12, abs_tol=1e-12):
                if keep_stored:
                    conflicts += 1
                    continue
                raise InvalidArgument(f"{b.field_prefix}[{i}].value",
                                      f"conflicts with the stored value {existing[t]!r} at {to_dt(t).isoformat()}")
            duplicates += 1
            continue
        if t in seen:
            duplicates += 1
            continue
        seen.add(t)
        rows.append({"series_id": series.id, "ts": to_dt(t), "value": float(v)})
    if rows:
        s.execute(insert(Point), rows)
    return series.id, len(rows), duplicates, np.array(sorted(seen), dtype=np.int64), conflicts


#: Rows read per round trip where a whole series is scanned (gaps): memory stays bounded by it.
SCAN_CHUNK_ROWS = 10_000


def series_gaps(db: Database, series_id: int, resolution_s: int,
                limit: int = MAX_REPORTED_GAPS) -> list[tuple[int, int]]:
    """(first missing time, missing steps) of the first ``limit`` holes between the first and last stored point,
    scanning the stored times in chunks (never the whole series in memory)."""
    gaps: list[tuple[int, int]] = []
    prev: int | None = None
    with db.session(readonly=True) as s:
        result = s.execute(select(Point.ts).where(Point.series_id == series_id).order_by(Point.ts)
                           .execution_options(yield_per=SCAN_CHUNK_ROWS))
        for part in result.scalars().partitions():
            times = np.array([to_s(t) for t in part], dtype=np.int64)
            if prev is not None:
                times = np.concatenate([[prev], times])
            prev = int(times[-1])
            steps = np.diff(times) // resolution_s
            for i in np.flatnonzero(steps > 1):
                gaps.append((int(times[i] + resolution_s), int(steps[i] - 1)))
                if len(gaps) >= limit:
                    return gaps
    return gaps


def _points_in_range(series_id: int, start_s: int | None, end_s: int | None) -> Select:
    """(ts, value) of the series' points in ``[start_s, end_s)`` (None: unbounded), in time order."""
    q = select(Point.ts, Point.value).where(Point.series_id == series_id)
    if start_s is not None:
        q = q.where(Point.ts >= to_dt(start_s))
    if end_s is not None:
        q = q.where(Point.ts < to_dt(end_s))
    return q.order_by(Point.ts)


def load_points(db: Database, series_id: int, start_s: int | None = None, end_s: int | None = None,
                limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The stored points in ``[start_s, end_s)`` as (times, values), in time order (the first ``limit``):
    what is stored, no grid."""
    with db.session(readonly=True) as s:
        q = _points_in_range(series_id, start_s, end_s)
        if limit is not None:
            q = q.limit(limit)
        rows = s.execute(q).all()
    return (np.array([to_s(t) for t, _ in rows], dtype=np.int64),
            np.array([v for _, v in rows], dtype=np.float64))


def load_grid(db: Database, series_id: int, resolution_s: int, start_s: int | None = None,
              end_s: int | None = None) -> tuple[int, np.ndarray]:
    """Stored points on a regular grid (NaN where missing): (first time, values). The grid spans the first to the
    last stored point of the range: callers bound the range (a fit window, a backtest's days), never the whole
    series (a sparse series over decades would make a grid of gigabytes)."""
    with db.session(readonly=True) as s:
        rows = s.execute(_points_in_range(series_id, start_s, end_s)).all()
    if not rows:
        return (start_s or 0), np.empty(0)
    times = np.array([to_s(t) for t, _ in rows], dtype=np.int64)
    vals = np.array([v for _, v in rows], dtype=np.float64)
    first = int(times[0])
    n = int((times[-1] - first) // resolution_s) + 1
    grid = np.full(n, np.nan)
    grid[(times - first) // resolution_s] = vals
    return first, grid


def point_count(db: Database, series_id: int) -> int:
    with db.session(readonly=True) as s:
        return int(s.scalar(select(func.count()).select_from(Point).where(Point.series_id == series_id)) or 0)


__all__ = ["MAX_POINT_VALUE", "MAX_REPORTED_GAPS", "TIME_MAX_S", "TIME_MIN_S", "Batch", "IngestResult", "SeriesKey",
           "check_time_s", "ingest_batches", "ingest_points", "load_grid", "load_points", "missing_runs",
           "series_gaps", "series_key", "validate_points"]
