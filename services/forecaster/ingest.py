"""Validation and storage of series points: all-or-nothing batches, idempotent duplicates, reported gaps.

Rules (issue 4):

* every value must be finite; carbon intensity and load must be >= 0. A bad point fails the whole batch
  with INVALID_ARGUMENT naming ``points[i]``, and nothing of the batch is stored;
* a timestamp must sit on the series' step (a multiple of ``resolution_s`` since the epoch);
* a timestamp already stored with the same value is a duplicate and is ignored; with another value it is a
  conflict, rejected like a bad point (stored history is never silently rewritten);
* missing steps are reported as gaps; nothing is interpolated into the store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
from sqlalchemy import func, insert, select

from greenserve.common.errors import InvalidArgument
from greenserve.common.persistence import Database
from greenserve.forecaster.csv_sources import missing_runs
from greenserve.forecaster.models import Point, Series
from greenserve.v1 import common_pb2

#: Gaps listed in one response at most (the earliest first).
MAX_REPORTED_GAPS = 100
#: Largest batch accepted by one IngestPoints call.
MAX_BATCH_POINTS = 200_000

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


def validate_points(times_s: np.ndarray, values: np.ndarray, resolution_s: int) -> None:
    """Raise InvalidArgument naming the first bad point: non-finite, negative, off-step or repeated with
    another value inside the batch."""
    if resolution_s <= 0:
        raise InvalidArgument("resolution_s", "must be > 0")
    if len(values) > MAX_BATCH_POINTS:
        raise InvalidArgument("points", f"at most {MAX_BATCH_POINTS} points per call, got {len(values)}")
    bad = np.flatnonzero(~np.isfinite(values))
    if len(bad):
        i = int(bad[0])
        raise InvalidArgument(f"points[{i}].value", f"must be finite, got {values[i]!r}")
    bad = np.flatnonzero(values < 0)
    if len(bad):
        i = int(bad[0])
        raise InvalidArgument(f"points[{i}].value", f"must be >= 0, got {values[i]!r}")
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


def ingest_points(db: Database, key: SeriesKey, resolution_s: int, times_s: np.ndarray, values: np.ndarray,
                  field_prefix: str = "points") -> IngestResult:
    """Store a validated batch in one transaction (all or nothing)."""
    validate_points(times_s, values, resolution_s)
    with db.session() as s:
        series = s.scalars(select(Series).where(Series.kind == key.kind, Series.key == key.key,
                                                Series.signal == key.signal)).one_or_none()
        if series is None:
            series = Series(kind=key.kind, key=key.key, signal=key.signal, unit=key.unit, resolution_s=resolution_s)
            s.add(series)
            s.flush()
        elif series.resolution_s != resolution_s:
            raise InvalidArgument("resolution_s", f"series is stored at {series.resolution_s}s, got {resolution_s}s")
        existing: dict[int, float] = {}
        if len(times_s):
            lo, hi = to_dt(int(times_s.min())), to_dt(int(times_s.max()))
            for ts, value in s.execute(select(Point.ts, Point.value).where(
                    Point.series_id == series.id, Point.ts >= lo, Point.ts <= hi)):
                existing[to_s(ts)] = value
        rows = []
        seen: set[int] = set()
        duplicates = 0
        for i, (t, v) in enumerate(zip(times_s.tolist(), values.tolist(), strict=True)):
            if t in existing:
                if not math.isclose(existing[t], v, rel_tol=1e-12, abs_tol=1e-12):
                    raise InvalidArgument(f"{field_prefix}[{i}].value",
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
        series_id = series.id
    gaps = series_gaps(db, series_id, resolution_s)
    return IngestResult(series_id, len(rows), duplicates, gaps, np.array(sorted(seen), dtype=np.int64))


def series_times(db: Database, series_id: int) -> np.ndarray:
    with db.session(readonly=True) as s:
        rows = s.execute(select(Point.ts).where(Point.series_id == series_id).order_by(Point.ts)).scalars().all()
    return np.array([to_s(t) for t in rows], dtype=np.int64)


def series_gaps(db: Database, series_id: int, resolution_s: int) -> list[tuple[int, int]]:
    """(first missing time, missing steps) of every hole between the first and last stored point."""
    times = series_times(db, series_id)
    if len(times) < 2:
        return []
    steps = np.diff(times) // resolution_s
    holes = np.flatnonzero(steps > 1)
    return [(int(times[i] + resolution_s), int(steps[i] - 1)) for i in holes]


def load_grid(db: Database, series_id: int, resolution_s: int, start_s: int | None = None,
              end_s: int | None = None) -> tuple[int, np.ndarray]:
    """Stored points on a regular grid (NaN where missing): (first time, values)."""
    with db.session(readonly=True) as s:
        q = select(Point.ts, Point.value).where(Point.series_id == series_id)
        if start_s is not None:
            q = q.where(Point.ts >= to_dt(start_s))
        if end_s is not None:
            q = q.where(Point.ts < to_dt(end_s))
        rows = s.execute(q.order_by(Point.ts)).all()
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


__all__ = ["MAX_REPORTED_GAPS", "IngestResult", "SeriesKey", "ingest_points", "load_grid", "missing_runs",
           "series_gaps", "series_key", "validate_points"]
