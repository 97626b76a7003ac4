"""The access history the planner replays (GetAccessWindow): a bounded record of each pool's accesses.

The journal (``journal.py``) is pruned at every checkpoint, so it cannot answer "what did this pool's traffic
look like at this hour yesterday". Every accepted HIT, MISS and STORE of ``ReportAccesses`` is therefore also
recorded here, in the same call, up to a cap per pool and UTC hour (``--access-history-per-hour``: the hour's
first accesses; past the cap an hour records nothing more), and hours older than ``--access-history-days``
are deleted at each checkpoint. The rows hold what a replay needs: entry key, kind, tokens, hit tokens,
conversation and document ids, time.

Bounds: at most ``per_hour x 24 x days`` rows per pool (5,000 x 24 x 8 = 960,000 by default, about 200 bytes
each); one GetAccessWindow answers at most MAX_LIMIT accesses of a window of at most MAX_WINDOW_S.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.cache_manager.journal import Event
from greenserve.cache_manager.models import AccessSample
from greenserve.common.errors import InvalidArgument
from greenserve.common.names import check_name
from greenserve.common.persistence import Database
from greenserve.v1 import cache_manager_pb2
from sqlalchemy import delete, func, insert, select
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

HOUR_S = 3600
PER_HOUR = 5000  # default of --access-history-per-hour
DAYS = 8.0  # default of --access-history-days: "same hour last week" and a day of slack
DEFAULT_LIMIT = 5000
MAX_LIMIT = 20_000
MAX_WINDOW_S = 86400.0
TIME_MIN_S, TIME_MAX_S = 0, 4_102_444_800  # 1970-01-01 .. 2100-01-01
_RECORDED = frozenset({cache_manager_pb2.ACCESS_KIND_HIT, cache_manager_pb2.ACCESS_KIND_MISS,
                       cache_manager_pb2.ACCESS_KIND_STORE})


@dataclass(frozen=True)
class WindowQuery:
    """A checked GetAccessWindow request."""

    pool: str
    start_s: float
    end_s: float
    limit: int


def _time_s(field: str, ts: Timestamp) -> float:
    if not 0 <= ts.nanos < 1_000_000_000:
        raise InvalidArgument(f"{field}.nanos", "must be 0-999999999")
    if not TIME_MIN_S <= ts.seconds < TIME_MAX_S:
        raise InvalidArgument(field, f"must be from 1970-01-01 to 2100-01-01 UTC, got {ts.seconds} s")
    return ts.seconds + ts.nanos * 1e-9


def check_request(request: cache_manager_pb2.GetAccessWindowRequest) -> WindowQuery:
    """The request checked; InvalidArgument names the field."""
    check_name("pool", request.pool)
    for name in ("start", "end"):
        if not request.HasField(name):
            raise InvalidArgument(name, "required")
    start_s, end_s = _time_s("start", request.start), _time_s("end", request.end)
    if not end_s > start_s:
        raise InvalidArgument("end", "must be after start")
    if end_s - start_s > MAX_WINDOW_S:
        raise InvalidArgument("end", f"the window is at most {MAX_WINDOW_S:g} s, got {end_s - start_s:g} s")
    if request.limit > MAX_LIMIT:
        raise InvalidArgument("limit", f"must be 0-{MAX_LIMIT} (0 means {DEFAULT_LIMIT}), got {request.limit}")
    return WindowQuery(request.pool, start_s, end_s, request.limit or DEFAULT_LIMIT)


def hour_of(time_s: float) -> int:
    return math.floor(time_s / HOUR_S) * HOUR_S


class AccessHistory:
    """Records and answers windows of the access history (module doc). Not thread-safe: the service calls
    ``record`` under its lock."""

    def __init__(self, db: Database, per_hour: int = PER_HOUR, days: float = DAYS) -> None:
        if per_hour < 1:
            raise ValueError("per_hour: must be >= 1")
        if not days > 0:
            raise ValueError("days: must be > 0")
        self.db = db
        self.per_hour = per_hour
        self.days = days
        self._counts: dict[tuple[str, int], int] = {}  # (pool, hour) -> rows recorded (loaded on first use)

    def _count(self, s: Session, pool: str, hour_s: int) -> int:
        key = (pool, hour_s)
        if key not in self._counts:
            self._counts[key] = int(s.scalar(select(func.count()).select_from(AccessSample).where(
                AccessSample.pool == pool, AccessSample.hour_s == hour_s)) or 0)
        return self._counts[key]

    def record(self, events: list[Event]) -> int:
        """Record the HIT/MISS/STORE events within their hours' caps (one transaction); how many were kept."""
        rows = []
        with self.db.session() as s:
            added: dict[tuple[str, int], int] = {}
            for ev in events:
                if ev.kind not in _RECORDED:
                    continue
                hour = hour_of(ev.time_s)
                key = (ev.pool, hour)
                n = self._count(s, ev.pool, hour) + added.get(key, 0)
                if n >= self.per_hour:
                    continue
                added[key] = added.get(key, 0) + 1
                rows.append({"pool": ev.pool, "entry_key": ev.entry_key, "kind": ev.kind, "tokens": ev.tokens,
                             "hit_tokens": ev.hit_tokens, "conversation_id": ev.conversation_id,
                             "document_id": ev.document_id, "time_s": ev.time_s, "hour_s": hour})
            if rows:
                s.execute(insert(AccessSample), rows)
            s.commit()
        for key, n in added.items():  # only once committed
            self._counts[key] = self._counts.get(key, 0) + n
        return len(rows)

    def prune(self, now_s: float) -> int:
        """Delete the hours older than ``days``; how many rows went."""
        floor = hour_of(now_s - self.days * 86400.0)
        with self.db.session() as s:
            result = s.execute(delete(AccessSample).where(AccessSample.hour_s < floor))
            assert isinstance(result, CursorResult)  # a DELETE without RETURNING: its rowcount is the rows deleted
            n = result.rowcount
            s.commit()
        self._counts = {k: v for k, v in self._counts.items() if k[1] >= floor}
        return int(n or 0)

    def window(self, q: WindowQuery) -> cache_manager_pb2.GetAccessWindowResponse:
        """The window's accesses (the earliest ``q.limit``), whether more exist, the pool's newest access and
        how many of the window's hours hit the cap."""
        out = cache_manager_pb2.GetAccessWindowResponse()
        with self.db.session(readonly=True) as s:
            c = AccessSample
            rows = list(s.execute(select(c.entry_key, c.kind, c.tokens, c.hit_tokens, c.conversation_id,
                                         c.document_id, c.time_s).where(
                AccessSample.pool == q.pool, AccessSample.time_s >= q.start_s, AccessSample.time_s < q.end_s)
                .order_by(AccessSample.time_s, AccessSample.id).limit(q.limit + 1)))
            latest = s.scalar(select(func.max(AccessSample.time_s)).where(AccessSample.pool == q.pool))
            capped = s.scalar(select(func.count()).select_from(
                select(AccessSample.hour_s).where(AccessSample.pool == q.pool,
                                                  AccessSample.hour_s >= hour_of(q.start_s),
                                                  AccessSample.hour_s < q.end_s)
                .group_by(AccessSample.hour_s).having(func.count() >= self.per_hour).subquery()))
        out.truncated = len(rows) > q.limit
        for r in rows[:q.limit]:
            rec = out.accesses.add(entry_key=r.entry_key, kind=r.kind, tokens=min(int(r.tokens), 2**32 - 1),
                                   hit_tokens=min(int(r.hit_tokens), 2**32 - 1), conversation_id=r.conversation_id,
                                   document_id=r.document_id)
            _set_time(rec.time, r.time_s)
        if latest is not None:
            _set_time(out.latest_time, float(latest))
        out.capped_hours = int(capped or 0)
        return out


def _set_time(ts: Timestamp, time_s: float) -> None:
    seconds = math.floor(time_s)
    ts.seconds, ts.nanos = seconds, min(round((time_s - seconds) * 1e9), 999_999_999)
