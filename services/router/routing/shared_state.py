"""What the router's replicas and workers share through its database, and how each learns of a change.

Every replica (a router process, or a worker of ``--workers``) opens the same database (PostgreSQL in
production, one SQLite file with WAL locally) and keeps its registry in memory for the request path.
What must be the same on all of them is in the database:

* the engines (``engines``: registrations, deregistrations, drains; written as before by core.py);
* the ejection verdicts in force (``engine_health``: one row per ejected engine with its until-time in
  UTC, deleted when the engine recovers);
* the plan in force (``last_plan``; each replica follows WatchPlans itself, and one that lags picks a
  newer stored plan up from here).

Change notification: every such write bumps the one-row counter ``state_version`` in the same
transaction (``bump``). Each replica polls that counter with one single-row SELECT every
``poll_interval_s`` (default 0.25 s) and, when it moved, reloads the three tables and applies the
difference to its registry (``Snapshot``). On PostgreSQL a bump also sends ``NOTIFY greenserve_router``
(delivered at commit), which a replica listens for on a connection of its own so that it reloads at
once; the poll stays as the fallback. A registration through any replica is thus routed to by every
replica within one poll interval plus one reload (docs/router.md gives the measured figure).

Each replica also records what it routes on in ``router_replicas`` (plan version, state version seen,
heartbeat), listed by ListEngines, so a replica that lags behind the others can be seen; a replica silent
for an hour is dropped from that list.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from greenserve.common.orm_conventions import utcnow
from greenserve.common.persistence import Database
from greenserve.router import models
from greenserve.router.routing.engines import EngineState
from greenserve.v1 import common_pb2
from sqlalchemy import delete, select, text, update
from sqlalchemy.orm import Session

log = logging.getLogger("greenserve.router.routing.shared_state")

NOTIFY_CHANNEL = "greenserve_router"
HEARTBEAT_S = 5.0
FORGET_REPLICA_S = 3600.0  # a replica silent this long is dropped from router_replicas (restarts change host:pid)


def bump(s: Session) -> None:
    """Moves the change counter on, in the caller's transaction (so a reader that sees the new value also
    sees the write). On PostgreSQL the replicas listening are notified when the transaction commits."""
    s.execute(update(models.StateVersion).where(models.StateVersion.id == models.STATE_VERSION_ID)
              .values(version=models.StateVersion.version + 1))
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SELECT pg_notify(:channel, '')"), {"channel": NOTIFY_CHANNEL})


def engine_state(row: models.Engine) -> EngineState:
    # the column's CHECK constraint holds kind to the EngineKind numbers
    kind = cast(common_pb2.EngineKind, row.kind)
    return EngineState(id=row.id, url=row.url, pool=row.pool, model=row.model, source=row.source,
                       draining=row.draining, kind=kind, gpu_uuid=row.gpu_uuid, mig_uuid=row.mig_uuid,
                       idle_power_w=row.idle_power_w, busy_power_w=row.busy_power_w, prefill_url=row.prefill_url,
                       prefill_kv_transfer_params=row.prefill_kv_transfer_params)


@dataclass(frozen=True)
class Verdict:
    """An ejection in force, as stored."""

    ejected_until: datetime
    eject_count: int
    reason: str
    replica_id: str


@dataclass(frozen=True)
class Snapshot:
    """The shared state at ``version`` (read in one transaction, the counter first)."""

    version: int
    engines: list[EngineState]
    verdicts: dict[str, Verdict]
    plan_version: int


class SharedState:
    """Reads and writes the shared tables (blocking: call in a thread, never on the event loop)."""

    def __init__(self, db: Database, replica_id: str) -> None:
        self.db = db
        self.replica_id = replica_id[: models.REPLICA_ID_MAX_CHARS]

    # -- reads ------------------------------------------------------------------------------------------

    def version(self) -> int:
        """The change counter (one single-row SELECT)."""
        with self.db.session(readonly=True) as s:
            return int(s.execute(select(models.StateVersion.version)).scalar_one_or_none() or 0)

    def snapshot(self) -> Snapshot:
        with self.db.session(readonly=True) as s:
            version = int(s.execute(select(models.StateVersion.version)).scalar_one_or_none() or 0)
            engines = [engine_state(r) for r in s.query(models.Engine).all()]
            verdicts = {r.engine_id: Verdict(r.ejected_until, r.eject_count, r.reason, r.replica_id)
                        for r in s.query(models.EngineHealth).all()}
            plan_version = s.execute(select(models.LastPlan.plan_version)).scalar_one_or_none() or 0
        return Snapshot(version, engines, verdicts, int(plan_version))

    def replicas(self) -> list[models.RouterReplica]:
        with self.db.session(readonly=True) as s:
            rows = s.query(models.RouterReplica).order_by(models.RouterReplica.replica_id).all()
            s.expunge_all()
        return rows

    # -- writes -----------------------------------------------------------------------------------------

    def record_verdict(self, engine_id: str, ejected: bool, until_wall_s: float, eject_count: int,
                       reason: str) -> None:
        """Stores an ejection (or, ``ejected`` False, deletes it: the engine recovered) and bumps."""
        with self.db.session() as s:
            row = s.get(models.EngineHealth, engine_id)
            if not ejected:
                if row is None:
                    return
                s.delete(row)
            else:
                until = datetime.fromtimestamp(until_wall_s, tz=UTC)
                values = {"ejected_until": until, "eject_count": max(1, eject_count),
                          "reason": reason[: models.REASON_MAX_CHARS], "replica_id": self.replica_id,
                          "updated_at": utcnow()}
                if row is None:
                    s.add(models.EngineHealth(engine_id=engine_id, **values))
                else:
                    for k, v in values.items():
                        setattr(row, k, v)
            bump(s)

    def heartbeat(self, plan_version: int, state_version: int) -> None:
        """Records what this replica routes on (and forgets replicas silent for ``FORGET_REPLICA_S``)."""
        with self.db.session() as s:
            s.execute(delete(models.RouterReplica).where(
                models.RouterReplica.seen_at < utcnow() - timedelta(seconds=FORGET_REPLICA_S)))
            row = s.get(models.RouterReplica, self.replica_id)
            if row is None:
                s.add(models.RouterReplica(replica_id=self.replica_id, plan_version=plan_version,
                                           state_version=state_version, seen_at=utcnow()))
            else:
                row.plan_version, row.state_version, row.seen_at = plan_version, state_version, utcnow()


def wall_to_monotonic(until: datetime, now_mono: float, now_wall: float) -> float:
    """A stored UTC time on this process's monotonic clock."""
    return now_mono + (until.timestamp() - now_wall)


def expired(verdict: Verdict, now_wall: float) -> bool:
    return verdict.ejected_until.timestamp() <= now_wall


class Listener:
    """LISTEN greenserve_router on a PostgreSQL connection of its own, in a daemon thread; calls ``wake``
    (thread-safe) on every notification. Reconnects after an error; ``stop`` ends it."""

    def __init__(self, db: Database, wake: Any) -> None:
        self.db = db
        self.wake = wake
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.notifications = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="router-state-listen", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        import psycopg

        # the database's own URL as a libpq URI (query parameters such as sslmode kept)
        conninfo = self.db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        while not self._stop.is_set():
            try:
                with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self.notifications += 1
                            self.wake()
            except Exception as exc:  # noqa: BLE001 - the poll goes on; retry the listener later
                log.warning("state listener disconnected; polling only", extra={"error": str(exc)})
                self._stop.wait(1.0)


def until_wall_s(engine: EngineState, now_mono: float, now_wall: float) -> float:
    """An engine's ejection end on the wall clock (for storing)."""
    return now_wall + max(0.0, engine.ejected_until - now_mono)


__all__ = ["HEARTBEAT_S", "NOTIFY_CHANNEL", "Listener", "SharedState", "Snapshot", "Verdict", "bump",
           "engine_state", "expired", "until_wall_s", "wall_to_monotonic"]
