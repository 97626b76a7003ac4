"""The active plan: routing weights per pool and engine, from the optimizer's WatchPlans stream.

* On start the last good plan is read back from the database (table ``last_plan``), so a restarted
  router routes on it even while the optimizer is down.
* A background task subscribes to ``OptimizerService.WatchPlans`` (after the version it holds) and
  reconnects with capped exponential backoff; every new plan is validated, put in force and persisted
  (one row, written off the event loop). A plan with bad weights is refused and the old one kept.
* The weights in force are those of the plan interval that covers now; past the last interval the
  last interval's weights stay in force (better than none while the optimizer is unreachable).
* Without any plan, ``weights_for`` returns no weights and the policy routes by load and affinity.
* "Engines from the plan": when a plan names engines the router does not know, it asks the optimizer
  for the fleet inventory (GetFleet) and registers them (source "plan"); the inventory also gives each
  pool's SLO and grid region, used by the carbon receipt.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable

import grpc
from greenserve.common.tasks import cancel_and_wait
from greenserve.common.persistence import Database, utcnow
from greenserve.router.models import LAST_PLAN_ID, LastPlan
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc

log = logging.getLogger("greenserve.router.plans")

Weights = dict[str, float]


class PlanError(ValueError):
    """A plan the router refuses (its field path is in the message)."""


def validate_plan(plan: common_pb2.Plan) -> None:
    """Raises PlanError when a plan cannot be routed on."""
    if plan.version < 1:
        raise PlanError("plan.version must be >= 1")
    for i, interval in enumerate(plan.intervals):
        for j, w in enumerate(interval.routing_weights):
            if not math.isfinite(w.weight) or w.weight < 0:
                raise PlanError(f"plan.intervals[{i}].routing_weights[{j}].weight must be finite and >= 0")
            if not w.engine_id:
                raise PlanError(f"plan.intervals[{i}].routing_weights[{j}].engine_id is empty")


class PlanStore:
    """The plan in force and the weights derived from it; cheap to read on every request."""

    def __init__(self, db: Database | None = None, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock
        self.plan: common_pb2.Plan | None = None
        self.version = 0
        self.received_at = 0.0
        self._weights: dict[str, Weights] = {}
        self._valid_until = math.inf  # wall time when the interval in force ends
        self.pool_slo: dict[str, common_pb2.Slo] = {}
        self.pool_region: dict[str, str] = {}

    # -- read side (request path) -----------------------------------------------------------------

    def weights_for(self, pool: str) -> tuple[Weights | None, int]:
        """Weights of ``pool`` in force now (None without a plan or without weights for the pool)."""
        if self.plan is None:
            return None, 0
        if self.clock() >= self._valid_until:
            self._select_interval()
        return self._weights.get(pool), self.version

    def engine_ids(self) -> set[str]:
        if self.plan is None:
            return set()
        return {w.engine_id for interval in self.plan.intervals for w in interval.routing_weights}

    # -- write side ------------------------------------------------------------------------------

    def _select_interval(self) -> None:
        plan = self.plan
        assert plan is not None
        now = self.clock()
        chosen = None
        next_change = math.inf
        for interval in plan.intervals:
            start = interval.start.ToSeconds() if interval.HasField("start") else -math.inf
            end = interval.end.ToSeconds() if interval.HasField("end") else math.inf
            if start <= now < end:
                chosen, next_change = interval, end
                break
            if start > now:
                next_change = min(next_change, start)
        if chosen is None and plan.intervals:
            starts = [iv for iv in plan.intervals if not iv.HasField("start") or iv.start.ToSeconds() <= now]
            chosen = starts[-1] if starts else plan.intervals[0]
        weights: dict[str, Weights] = {}
        if chosen is not None:
            for w in chosen.routing_weights:
                weights.setdefault(w.pool, {})[w.engine_id] = w.weight
        self._weights = weights
        self._valid_until = next_change

    def apply(self, plan: common_pb2.Plan) -> bool:
        """Puts ``plan`` in force if it is newer and valid; returns whether it was applied."""
        validate_plan(plan)
        if plan.version <= self.version:
            return False
        self.plan = plan
        self.version = plan.version
        self.received_at = self.clock()
        self._valid_until = -math.inf
        self._select_interval()
        return True

    def apply_fleet(self, fleet: common_pb2.FleetInventory) -> None:
        for pool in fleet.pools:
            if pool.HasField("slo"):
                self.pool_slo[pool.name] = pool.slo
            if pool.region:
                self.pool_region[pool.name] = pool.region

    def persist(self, plan: common_pb2.Plan) -> None:
        """Writes the plan as the last good one (one transaction; blocking: call off the event loop)."""
        if self.db is None:
            return
        body = plan.SerializeToString()
        with self.db.session() as s:
            row = s.get(LastPlan, LAST_PLAN_ID)
            if row is None:
                s.add(LastPlan(id=LAST_PLAN_ID, plan_version=plan.version, received_at=utcnow(), body=body))
            else:
                row.plan_version, row.received_at, row.body = plan.version, utcnow(), body

    def load_persisted(self) -> bool:
        """Puts the stored last good plan in force (blocking); False when there is none or it is bad."""
        if self.db is None:
            return False
        with self.db.session(readonly=True) as s:
            row = s.get(LastPlan, LAST_PLAN_ID)
            body = None if row is None else bytes(row.body)
        if body is None:
            return False
        plan = common_pb2.Plan()
        try:
            plan.ParseFromString(body)
            return self.apply(plan)
        except Exception as exc:  # noqa: BLE001 - a corrupt row must not stop the router
            log.warning("stored plan unreadable; routing without it", extra={"error": str(exc)})
            return False


class PlanWatcher:
    """Background subscription to WatchPlans with reconnects; calls ``on_plan`` after each new plan."""

    def __init__(
        self,
        store: PlanStore,
        channel: grpc.aio.Channel,
        on_plan: Callable[[common_pb2.Plan], Awaitable[None]] | None = None,
        backoff_max_s: float = 10.0,
    ) -> None:
        self.store = store
        self.stub = optimizer_pb2_grpc.OptimizerServiceStub(channel)
        self.on_plan = on_plan
        self.backoff_max_s = backoff_max_s
        self.connected = False
        self.rejected = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="plan-watcher")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            try:
                call = self.stub.WatchPlans(optimizer_pb2.WatchPlansRequest(after_version=self.store.version))
                async for event in call:
                    self.connected = True
                    backoff = 0.2
                    await self._handle(event.plan)
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                if self.connected:
                    log.warning("plan stream lost; routing on plan v%d", self.store.version,
                                extra={"code": exc.code().name})
            except Exception:
                log.exception("plan watcher error")
            self.connected = False
            await asyncio.sleep(backoff)
            backoff = min(self.backoff_max_s, backoff * 2)

    async def _handle(self, plan: common_pb2.Plan) -> None:
        try:
            applied = self.store.apply(plan)
        except PlanError as exc:
            self.rejected += 1
            log.warning("plan refused", extra={"plan_version": plan.version, "error": str(exc)})
            return
        if not applied:
            return
        log.info("plan in force", extra={"plan_version": plan.version})
        await asyncio.to_thread(self.store.persist, plan)
        if self.on_plan is not None:
            await self.on_plan(plan)

