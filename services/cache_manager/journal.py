"""The cache-manager's journals in its database: access events (their checks, their journal, and how one event
changes a pool's index), and the L1 resize by controlled restart in progress (``begin_resize`` ... ``end_resize``).

`ReportAccesses` reads the whole stream, checks every event (`check_events`: the first bad one refuses the
stream with INVALID_ARGUMENT naming `events[i].field`, nothing stored), writes all of them to the journal in
one transaction (`append`), and only then applies them to the in-memory index (`apply`), in journal order.
The same `apply` replays the journal at start over each pool's last snapshot, so the index after a kill
holds exactly the acknowledged events. Documented ranges (protos/greenserve/v1/cache_manager.proto):

| field | range |
|---|---|
| pool | a name (`greenserve.common.names.check_name`) |
| entry_key | 1-512 printable ASCII characters, no spaces |
| kind | HIT, MISS, STORE or EVICT |
| tokens, hit_tokens | 0-16,777,216 (a STORE needs tokens > 0) |
| size_bytes | 0-2^50 (a STORE needs size_bytes > 0) |
| turn | 0-1,000,000 |
| conversation_id, document_id | 0-256 printable characters |
| time | unset (the time of arrival) or from 1970-01-01 to at most MAX_FUTURE_S after now |
| tier | a CacheTier value |
| events per stream | at most MAX_EVENTS_PER_STREAM |
| one event's message | at most MAX_EVENT_BYTES serialized (unknown fields included) |

A resize step is written (one transaction) before the restart command stops the old LMCache server: target and
previous size, the L2 quotas the restart will make LMCache forget, the plan version; then the restart command's
pid once it runs. It is cleared once the outcome is recorded; a row found at start is a restart a kill cut,
finished or rolled back by resize_recovery.py.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import AsyncIterable, Iterator
from dataclasses import dataclass

import numpy as np
from sqlalchemy import delete, func, insert, select
from sqlalchemy.engine import CursorResult

from greenserve.common.cache_index.index import CacheIndex
from greenserve.cache_manager.models import AccessEvent, ResizeStep
from greenserve.common.errors import InvalidArgument
from greenserve.common.names import check_name
from greenserve.common.orm_conventions import utcnow
from greenserve.common.persistence import Database
from greenserve.v1 import cache_manager_pb2, common_pb2

MAX_EVENTS_PER_STREAM = 20_000  # the router sends at most 10,000 (5,000 requests x hit + store)
#: Largest message of a stream: every field at the end of its range (4-byte characters in the ids) is about
#: 2.8 KB. Messages are kept until the whole stream is checked, so without it one stream could hold 20,000
#: messages of --max-message-bytes each (a field far past its range, or unknown fields).
MAX_EVENT_BYTES = 4096
MAX_TOKENS = 1 << 24
MAX_SIZE_BYTES = 1 << 50
MAX_TURN = 1_000_000
MAX_KEY_CHARS = 512
MAX_ID_CHARS = 256
MAX_FUTURE_S = 3600.0  # clock skew allowed between a reporter and this service
_KINDS = frozenset({cache_manager_pb2.ACCESS_KIND_HIT, cache_manager_pb2.ACCESS_KIND_MISS,
                    cache_manager_pb2.ACCESS_KIND_STORE, cache_manager_pb2.ACCESS_KIND_EVICT})
_TIERS = frozenset(common_pb2.CacheTier.values())
HISTORY_PER_POOL = 200_000  # default of --ttl-history-per-pool: recent accesses kept for group TTLs


@dataclass(frozen=True)
class Event:
    """One checked access event, as journaled and applied (`time_s` resolved at arrival)."""

    pool: str
    entry_key: str
    kind: int
    tokens: int = 0
    size_bytes: int = 0
    hit_tokens: int = 0
    turn: int = 0
    conversation_id: str = ""
    document_id: str = ""
    time_s: float = 0.0

    def row(self) -> dict:
        return {"pool": self.pool, "entry_key": self.entry_key, "kind": self.kind, "tokens": self.tokens,
                "size_bytes": self.size_bytes, "hit_tokens": self.hit_tokens, "turn": self.turn,
                "conversation_id": self.conversation_id, "document_id": self.document_id, "time_s": self.time_s}


def _printable(value: str, *, spaces: bool) -> bool:
    return value.isprintable() and (spaces or not any(c.isspace() for c in value))


async def read_stream(requests: AsyncIterable[cache_manager_pb2.ReportAccessesRequest],
                      ) -> list[cache_manager_pb2.ReportAccessesRequest]:
    """The messages of a client stream, at most MAX_EVENTS_PER_STREAM of at most MAX_EVENT_BYTES each (else
    InvalidArgument, read no further)."""
    out: list[cache_manager_pb2.ReportAccessesRequest] = []
    async for msg in requests:
        if len(out) == MAX_EVENTS_PER_STREAM:
            raise InvalidArgument("events", f"at most {MAX_EVENTS_PER_STREAM} events per stream; send more streams")
        if msg.ByteSize() > MAX_EVENT_BYTES:
            raise InvalidArgument(f"events[{len(out)}]", f"at most {MAX_EVENT_BYTES} bytes per event, got "
                                  f"{msg.ByteSize()} (a field past its range, or unknown fields)")
        out.append(msg)
    return out


def check_event(i: int, ev: cache_manager_pb2.ReportAccessesRequest, now_s: float) -> Event:
    """One request message checked against the documented ranges; InvalidArgument names `events[i].<field>`."""
    f = f"events[{i}]"
    check_name(f"{f}.pool", ev.pool)
    key = ev.entry_key
    if not key or len(key) > MAX_KEY_CHARS or not key.isascii() or not _printable(key, spaces=False):
        raise InvalidArgument(f"{f}.entry_key", f"required: 1-{MAX_KEY_CHARS} printable ASCII characters without "
                              "spaces")
    if ev.kind not in _KINDS:
        raise InvalidArgument(f"{f}.kind", "must be HIT, MISS, STORE or EVICT")
    for name in ("tokens", "hit_tokens"):
        if getattr(ev, name) > MAX_TOKENS:
            raise InvalidArgument(f"{f}.{name}", f"must be 0-{MAX_TOKENS}, got {getattr(ev, name)}")
    if ev.size_bytes > MAX_SIZE_BYTES:
        raise InvalidArgument(f"{f}.size_bytes", f"must be 0-2^50, got {ev.size_bytes} (a negative size arrives "
                              "as a huge uint64)")
    if ev.kind == cache_manager_pb2.ACCESS_KIND_STORE and (ev.tokens == 0 or ev.size_bytes == 0):
        raise InvalidArgument(f"{f}.tokens", "a store needs tokens > 0 and size_bytes > 0")
    if ev.turn > MAX_TURN:
        raise InvalidArgument(f"{f}.turn", f"must be 0-{MAX_TURN}, got {ev.turn}")
    for name in ("conversation_id", "document_id"):
        value = getattr(ev, name)
        if len(value) > MAX_ID_CHARS or not _printable(value, spaces=True):
            raise InvalidArgument(f"{f}.{name}", f"at most {MAX_ID_CHARS} printable characters")
    if ev.tier not in _TIERS:
        raise InvalidArgument(f"{f}.tier", f"unknown cache tier {ev.tier}")
    if ev.HasField("time"):
        t = ev.time
        if not 0 <= t.nanos < 1_000_000_000:
            raise InvalidArgument(f"{f}.time.nanos", "must be 0-999999999")
        time_s = t.seconds + t.nanos * 1e-9
        if not 0 <= time_s <= now_s + MAX_FUTURE_S:
            raise InvalidArgument(f"{f}.time", f"must be from 1970-01-01 to at most {MAX_FUTURE_S:g} s after the "
                                  f"service's clock, got {t.seconds} s")
    else:
        time_s = now_s
    if not math.isfinite(time_s):  # cannot happen with the checks above; kept as the invariant apply needs
        raise InvalidArgument(f"{f}.time", "must be finite")
    return Event(ev.pool, key, int(ev.kind), int(ev.tokens), int(ev.size_bytes), int(ev.hit_tokens), int(ev.turn),
                 ev.conversation_id, ev.document_id, float(time_s))


def check_events(messages: list[cache_manager_pb2.ReportAccessesRequest], now_s: float) -> list[Event]:
    """Every message checked (the first bad one raises; nothing is stored before all passed)."""
    return [check_event(i, ev, now_s) for i, ev in enumerate(messages)]


# ----- the journal ---------------------------------------------------------------------------------
def append(db: Database, events: list[Event]) -> list[int]:
    """Write the events to the journal in one transaction; their ids, in order."""
    if not events:
        return []
    with db.session() as s:
        ids = list(s.scalars(insert(AccessEvent).returning(AccessEvent.id, sort_by_parameter_order=True),
                             [e.row() for e in events]))
        s.commit()
    return ids


def last_id(db: Database) -> int:
    with db.session(readonly=True) as s:
        return int(s.scalar(select(func.max(AccessEvent.id))) or 0)


def replay(db: Database, after_id: int, batch: int = 10_000) -> Iterator[tuple[int, Event]]:
    """(id, event) of the journal after `after_id`, in order, read in batches (bounded memory)."""
    cursor = after_id
    while True:
        with db.session(readonly=True) as s:
            rows = list(s.scalars(select(AccessEvent).where(AccessEvent.id > cursor)
                                  .order_by(AccessEvent.id).limit(batch)))
            out = [(r.id, Event(r.pool, r.entry_key, r.kind, r.tokens, r.size_bytes, r.hit_tokens, r.turn,
                                r.conversation_id, r.document_id, r.time_s)) for r in rows]
        if not out:
            return
        yield from out
        cursor = out[-1][0]


def prune(db: Database, through_id: int) -> int:
    """Delete the journal's events up to `through_id` (all checkpointed), always keeping the newest one (with
    the table's AUTOINCREMENT, a second guard that ids keep growing); how many went."""
    if through_id <= 0:
        return 0
    with db.session() as s:
        newest = s.scalar(select(func.max(AccessEvent.id))) or 0
        result = s.execute(delete(AccessEvent).where(AccessEvent.id <= min(through_id, newest - 1)))
        assert isinstance(result, CursorResult)  # a DELETE without RETURNING: its rowcount is the rows deleted
        n = result.rowcount
        s.commit()
    return int(n or 0)


# ----- applying one event ----------------------------------------------------------------------
def apply(index: CacheIndex, event_id: int, ev: Event, history: deque, max_entries: int) -> None:
    """Apply one journaled event to its pool's index (live and at replay: the same function, the same order).

    A STORE that takes the index past `max_entries` makes it forget its first entries in its eviction order
    (lowest LCS, or least recent while the adaptive policy's LRU leads; LMCache's own eviction removes the
    objects) so memory stays bounded.
    """
    now = ev.time_s
    group = ev.conversation_id or ev.document_id
    if ev.kind == cache_manager_pb2.ACCESS_KIND_STORE:
        slot = index.store(ev.entry_key, tokens=ev.tokens, size_bytes=ev.size_bytes, now_s=now, turn=ev.turn,
                           document_id=ev.document_id, group=index.group_id(group) if group else None)
        excess = len(index) - max_entries
        if excess > 0:
            for s in index.choose_victims(excess, now, exclude=np.array([slot], dtype=np.int64)):
                index.remove_slot(int(s))
    elif ev.kind == cache_manager_pb2.ACCESS_KIND_HIT:
        index.hit(ev.entry_key, hit_tokens=ev.hit_tokens or ev.tokens, now_s=now, turn=ev.turn,
                  document_id=ev.document_id)
    elif ev.kind == cache_manager_pb2.ACCESS_KIND_EVICT:
        index.remove(ev.entry_key)
    if ev.kind != cache_manager_pb2.ACCESS_KIND_EVICT:
        history.append((now, hash(ev.entry_key), group))
    index.journal_id = event_id


def new_history(maxlen: int = HISTORY_PER_POOL) -> deque:
    """Recent accesses of one pool, (time, key hash, group), the oldest dropped past `maxlen`."""
    return deque(maxlen=maxlen)


# ----- the resize step in progress -------------------------------------------------------------
@dataclass(frozen=True)
class ResizeRecord:
    """One journaled resize step (a row of cache_resize_steps)."""

    server_id: str
    plan_version: int | None
    target_bytes: int
    previous_bytes: int
    quotas: dict[str, int]
    restart_pid: int | None = None
    restart_start_ticks: int | None = None


def begin_resize(db: Database, server_id: str, plan_version: int | None, target_bytes: int, previous_bytes: int,
                 quotas: dict[str, int]) -> None:
    """Journal a resize of `server_id` before its restart (one transaction; replaces a row left for it)."""
    with db.session() as s:
        row = s.get(ResizeStep, server_id)
        if row is None:
            row = ResizeStep(server_id=server_id)
            s.add(row)
        row.plan_version, row.target_bytes, row.previous_bytes = plan_version, target_bytes, previous_bytes
        row.quotas_json = json.dumps(quotas, sort_keys=True)
        row.restart_pid = row.restart_start_ticks = None
        row.started_at = utcnow()
        s.commit()


def note_restart(db: Database, server_id: str, pid: int, start_ticks: int | None) -> None:
    """The restart command of the journaled step runs as `pid` (started at `start_ticks`, /proc)."""
    with db.session() as s:
        row = s.get(ResizeStep, server_id)
        if row is not None:
            row.restart_pid, row.restart_start_ticks = pid, start_ticks
            s.commit()


def unfinished_resizes(db: Database) -> list[ResizeRecord]:
    """Every journaled resize step (at start: the ones a kill cut), by server."""
    with db.session(readonly=True) as s:
        return [ResizeRecord(r.server_id, r.plan_version, int(r.target_bytes), int(r.previous_bytes),
                             {str(k): int(v) for k, v in json.loads(r.quotas_json).items()}, r.restart_pid,
                             r.restart_start_ticks)
                for r in s.scalars(select(ResizeStep).order_by(ResizeStep.server_id))]


def end_resize(db: Database, *server_ids: str) -> None:
    """The resize steps of `server_ids` are over (their outcome recorded): their rows go, in one transaction."""
    if not server_ids:
        return
    with db.session() as s:
        s.execute(delete(ResizeStep).where(ResizeStep.server_id.in_(server_ids)))
        s.commit()
