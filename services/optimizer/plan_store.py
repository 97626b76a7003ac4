"""Versioned plans: store, activate (one active at a time; activating an older version is the rollback), list,
watch, and the enforcers' reports about them.

Writes are one transaction each (``Database.session``); watchers get the plan now in force and every later one
through a bounded queue per watcher (a watcher too slow to take 16 plans is dropped and reconnects). A plan is
handed to the watchers under the same lock as its activation's commit, so two activations racing (a computed plan
and a rollback) reach every watcher in the order they were committed, and the last one a watcher gets is the plan
in force.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import threading
from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from greenserve.common.errors import InvalidArgument, NotFound, ResourceExhausted
from greenserve.common.orm_conventions import utcnow
from greenserve.common.persistence import Database
from greenserve.optimizer.models import EnforcementReport, Plan
from greenserve.v1 import common_pb2, optimizer_pb2

log = logging.getLogger("greenserve.optimizer.plans")

STATE_NAMES = {
    common_pb2.PLAN_STATE_PROPOSED: "proposed",
    common_pb2.PLAN_STATE_ACTIVE: "active",
    common_pb2.PLAN_STATE_SUPERSEDED: "superseded",
}
STATE_VALUES = {name: value for value, name in STATE_NAMES.items()}
ENFORCEMENT_NAMES = {
    optimizer_pb2.ENFORCEMENT_STATE_APPLYING: "applying",
    optimizer_pb2.ENFORCEMENT_STATE_APPLIED: "applied",
    optimizer_pb2.ENFORCEMENT_STATE_FAILED: "failed",
    optimizer_pb2.ENFORCEMENT_STATE_ROLLED_BACK: "rolled_back",
    optimizer_pb2.ENFORCEMENT_STATE_REFUSED: "refused",
}
WATCH_QUEUE_PLANS = 16
MAX_COMPONENT_CHARS = 64
MAX_INSTANCE_CHARS = 253
MAX_DETAIL_CHARS = 4000
#: Distinct (component, instance) pairs whose reports are kept per plan version. Reports are keyed by the
#: reporter's own instance name, so without a cap a caller inventing names grew the table (and GetPlanStatus)
#: without bound. Generous: a fleet has one router / cache-manager / gpu-partitioner per host or replica, far
#: fewer than 4096; a new pair past it is refused with RESOURCE_EXHAUSTED, a report of a pair already kept is
#: always taken (the latest replaces it). Reports are kept as long as their plan, and the plans are all kept
#: (ListPlans, rollback by activation): no retention prunes either.
MAX_REPORTERS_PER_PLAN = 4096


def _dt(ts: Timestamp) -> datetime:
    return ts.ToDatetime(tzinfo=UTC)


def _body_with_state(body: bytes, state: str) -> common_pb2.Plan:
    plan = common_pb2.Plan()
    plan.ParseFromString(body)
    plan.state = STATE_VALUES[state]
    return plan


def summary(plan: common_pb2.Plan) -> common_pb2.Plan:
    """The plan without its intervals (ListPlans, GetPlanStatus)."""
    out = common_pb2.Plan()
    out.CopyFrom(plan)
    del out.intervals[:]
    return out


class PlanStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._write = threading.Lock()
        # Serializes the reports of this process, so that MAX_REPORTERS_PER_PLAN is exact (count, then insert).
        self._report_write = threading.Lock()
        self.active: common_pb2.Plan | None = None
        self._watchers: set[asyncio.Queue[common_pb2.Plan | None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- reads ----------------------------------------------------------------------------------------

    def load(self) -> None:
        with self.db.session(readonly=True) as s:
            row = s.scalars(select(Plan).where(Plan.state == "active")).first()
            self.active = None if row is None else _body_with_state(bytes(row.body), row.state)

    def next_version(self) -> int:
        with self.db.session(readonly=True) as s:
            return int(s.scalar(select(func.max(Plan.version))) or 0) + 1

    def get(self, version: int) -> common_pb2.Plan:
        if version == 0:
            if self.active is None:
                raise NotFound("no plan is active yet (compute one with ComputePlan)")
            return self.active
        with self.db.session(readonly=True) as s:
            row = s.get(Plan, version)
            if row is None:
                raise NotFound(f"plan version {version} does not exist", field="version")
            return _body_with_state(bytes(row.body), row.state)

    def list(self, page_size: int, before_version: int | None) -> tuple[list[common_pb2.Plan], int | None]:
        """Plans newest first (summaries), and the version to continue before (None at the end)."""
        with self.db.session(readonly=True) as s:
            query = select(Plan).order_by(Plan.version.desc()).limit(page_size + 1)
            if before_version is not None:
                query = query.where(Plan.version < before_version)
            rows = list(s.scalars(query))
            plans = [summary(_body_with_state(bytes(r.body), r.state)) for r in rows[:page_size]]
        more = len(rows) > page_size
        return plans, (plans[-1].version if more and plans else None)

    # -- writes ---------------------------------------------------------------------------------------

    def store(self, plan: common_pb2.Plan, activate: bool) -> common_pb2.Plan:
        """Stores a computed plan with the next version (and activates it); blocking, one transaction."""
        with self._write:
            with self.db.session() as s:
                version = int(s.scalar(select(func.max(Plan.version))) or 0) + 1
                plan.version = version
                plan.state = common_pb2.PLAN_STATE_ACTIVE if activate else common_pb2.PLAN_STATE_PROPOSED
                if activate:
                    for row in s.scalars(select(Plan).where(Plan.state == "active")):
                        row.state = "superseded"
                    s.flush()
                s.add(Plan(
                    version=version, created_at=_dt(plan.created_at), valid_from=_dt(plan.valid_from),
                    valid_until=_dt(plan.valid_until), state=STATE_NAMES[plan.state],
                    expected_total_carbon_g=max(0.0, plan.expected_carbon.total_g), body=plan.SerializeToString(),
                ))
            if activate:
                self.active = plan
                self._publish(plan)  # under the write lock: watchers get activations in the order they committed
        return plan

    def activate(self, version: int) -> common_pb2.Plan:
        """Puts a stored plan in force (a proposed one, or an older one: the rollback); blocking."""
        if version < 1:
            raise InvalidArgument("version", "must be >= 1")
        with self._write:
            with self.db.session() as s:
                row = s.get(Plan, version)
                if row is None:
                    raise NotFound(f"plan version {version} does not exist", field="version")
                if row.state == "active":
                    return _body_with_state(bytes(row.body), "active")
                for other in s.scalars(select(Plan).where(Plan.state == "active")):
                    other.state = "superseded"
                s.flush()
                row.state = "active"
                plan = _body_with_state(bytes(row.body), "active")
            self.active = plan
            self._publish(plan)  # under the write lock (see store)
        return plan

    # -- watchers -------------------------------------------------------------------------------------

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def _publish(self, plan: common_pb2.Plan) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._deliver(plan)
        else:
            loop.call_soon_threadsafe(self._deliver, plan)

    def _deliver(self, plan: common_pb2.Plan) -> None:
        for queue in list(self._watchers):
            try:
                queue.put_nowait(plan)
            except asyncio.QueueFull:
                log.warning("plan watcher too slow; dropping it (it reconnects)")
                self._watchers.discard(queue)
                queue._queue.clear()  # type: ignore[attr-defined]  # make room for the end marker
                queue.put_nowait(None)

    def subscribe(self) -> asyncio.Queue[common_pb2.Plan | None]:
        queue: asyncio.Queue[common_pb2.Plan | None] = asyncio.Queue(maxsize=WATCH_QUEUE_PLANS)
        self._watchers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[common_pb2.Plan | None]) -> None:
        self._watchers.discard(queue)

    @property
    def watcher_count(self) -> int:
        return len(self._watchers)

    # -- enforcement reports --------------------------------------------------------------------------

    def record_report(self, report: optimizer_pb2.EnforcementReport) -> None:
        """Keeps the latest report per (plan version, component, instance), for at most MAX_REPORTERS_PER_PLAN
        (component, instance) pairs per plan version; blocking."""
        if report.component not in ("router", "cache-manager", "gpu-partitioner"):
            raise InvalidArgument("report.component", "must be router, cache-manager or gpu-partitioner")
        if len(report.instance) > MAX_INSTANCE_CHARS or any(c in report.instance for c in "\n\r\x00"):
            raise InvalidArgument("report.instance", f"at most {MAX_INSTANCE_CHARS} characters, one line")
        if report.plan_version < 1 or report.plan_version > 2**53:
            raise InvalidArgument("report.plan_version", "must be a stored plan version (>= 1)")
        if report.state not in ENFORCEMENT_NAMES:
            raise InvalidArgument("report.state", "must be APPLYING, APPLIED, FAILED, ROLLED_BACK or REFUSED")
        stored = optimizer_pb2.EnforcementReport()
        stored.CopyFrom(report)
        stored.detail = report.detail[:MAX_DETAIL_CHARS]
        try:
            reported_at = _dt(stored.reported_at) if stored.HasField("reported_at") else utcnow()
        except (ValueError, OverflowError):
            raise InvalidArgument("report.reported_at", "is not a valid instant") from None
        if stored.HasField("interval_start"):
            try:
                _dt(stored.interval_start)
            except (ValueError, OverflowError):
                raise InvalidArgument("report.interval_start", "is not a valid instant") from None
        if not stored.HasField("reported_at"):
            stored.reported_at.FromDatetime(reported_at)
        key = (report.plan_version, report.component, report.instance)
        body = stored.SerializeToString()
        state = ENFORCEMENT_NAMES[report.state]
        for attempt in range(2):
            try:
                with self._report_write, self.db.session() as s:
                    if s.get(Plan, report.plan_version) is None:
                        raise NotFound(f"plan version {report.plan_version} does not exist",
                                       field="report.plan_version")
                    row = s.get(EnforcementReport, key)
                    if row is None:
                        kept = s.execute(select(func.count()).select_from(EnforcementReport)
                                         .where(EnforcementReport.plan_version == key[0])).scalar_one()
                        if kept >= MAX_REPORTERS_PER_PLAN:
                            raise ResourceExhausted(
                                f"plan version {key[0]} already has reports of {MAX_REPORTERS_PER_PLAN} component "
                                "instances (the most kept); a new instance is refused, the ones reported may "
                                "report again", field="report.instance")
                        s.add(EnforcementReport(plan_version=key[0], component=key[1], instance=key[2], state=state,
                                                reported_at=reported_at, body=body))
                    else:
                        row.state, row.reported_at, row.body = state, reported_at, body
                return
            except IntegrityError:  # a concurrent first report inserted the row (PostgreSQL): update it instead
                if attempt:
                    raise

    def reports(self, version: int) -> builtins.list[optimizer_pb2.EnforcementReport]:
        with self.db.session(readonly=True) as s:
            rows = s.scalars(select(EnforcementReport).where(EnforcementReport.plan_version == version)
                             .order_by(EnforcementReport.component, EnforcementReport.instance))
            out = []
            for row in rows:
                msg = optimizer_pb2.EnforcementReport()
                msg.ParseFromString(bytes(row.body))
                out.append(msg)
            return out

    def previous_reporters(self, version: int) -> set[tuple[str, str]]:
        """Component instances that reported on the latest plan before ``version`` that has reports: the ones
        expected to report on it. Not every instance that ever reported: a router replica is named after its pod,
        which a rollout renames, and an instance gone for good would then keep every later plan pending. One that
        missed a whole plan (down, or gone) is no longer expected after it."""
        with self.db.session(readonly=True) as s:
            previous = s.scalar(select(func.max(EnforcementReport.plan_version))
                                .where(EnforcementReport.plan_version < version))
            if previous is None:
                return set()
            rows = s.execute(select(EnforcementReport.component, EnforcementReport.instance)
                             .where(EnforcementReport.plan_version == previous))
            return {(c, i) for c, i in rows}
