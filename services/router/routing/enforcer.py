"""The active plan: routing weights per pool and engine, from the optimizer's WatchPlans stream.

* On start the last good plan is read back from the database (table ``last_plan``), so a restarted
  router routes on it even while the optimizer is down, and reports it again (``applied``): a process killed
  between storing a plan and reporting it leaves no plan status short of the router's report.
* ``PlanWatcher`` follows ``OptimizerService.WatchPlans`` with the shared ``PlanFollower``
  (``greenserve.common.plan_follow``: reconnects with capped backoff, after the version it holds); every new
  plan is validated, put in force and persisted (one row, written off the event loop). A plan with bad
  weights is refused and the old one kept.
* Never backwards: a worker or replica whose stream lags takes a newer plan another one stored from the shared
  database (shared_state.py) ahead of its stream. The stream gives activations in commit order, so what it still
  has queued was activated before that plan: the follower drops it and watches again after the plan in force
  (``PlanFollower.resubscribe``); the new call starts with the optimizer's plan in force if that is another one (an
  operator's rollback is applied that way). A plan dropped so that is older than the one in force is reported
  REFUSED, "skipped as stale". The database is only a way forward: a stored plan no newer than every plan this
  process has had in force is not taken from it (a replica whose stream lags may store an older one late).
* It reports to the optimizer (component ``router``): ``applied`` with the pools and engines the interval
  in force weights (and the weighted engines the router does not know even after GetFleet), ``refused``
  with the reason for a plan it cannot route on; again each time the clock enters the plan's next interval.
* The weights in force are those of the plan interval that covers now by the shared clock
  (``greenserve.common.clock``, wall or virtual); past the last interval the last interval's weights stay
  in force (better than none while the optimizer is unreachable).
* Without any plan, ``weights_for`` returns no weights and the policy routes by load and affinity.
* "Engines from the plan": when a plan names engines the router does not know, it asks the optimizer
  for the fleet inventory (GetFleet) and registers them (source "plan"), except one deregistered that the fleet
  still lists (``RouterCore.deregistered``); the inventory also gives each pool's SLO and grid region, used by the
  carbon receipt.
* MIG instances a plan's layout creates have no engine id yet when the plan is made: the plan names them by
  placement (``mig:<gpu uuid>/<profile>@<start>``) and the weight goes to the engine(s) the inventory's
  ``gpus[].instances[]`` report at that placement (the gpu-partitioner registers them under its own ids).
* Engines that step down: the interval's ``engine_runs`` (awake or asleep per engine, placements resolved as
  weights are; an engine it does not name is awake) go to the ``EngineSleeper`` (engine_sleep.py), which drains and
  puts to sleep, or wakes, each engine; the report says what is asleep, going to sleep or waking, and which engine
  failed to (``applying`` while engines are still on their way, then ``applied`` or ``failed`` once they settle).
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from collections.abc import Awaitable, Callable

import grpc
from greenserve.common.clock import now_s
from greenserve.common.db_errors import unavailable_reason
from greenserve.common.mig_geometry import instance_engine_ids
from greenserve.common.orm_conventions import utcnow
from greenserve.common.persistence import Database
from greenserve.common.plan_follow import APPLIED, REFUSED, Outcome, PlanFollower
from greenserve.common.tasks import cancel_and_wait
from greenserve.router.models import LAST_PLAN_ID, LastPlan
from greenserve.router.routing.engine_sleep import EngineSleeper
from greenserve.router.routing.shared_state import (
    bump,  # a stored plan is a change the other replicas learn of
)
from greenserve.v1 import common_pb2

log = logging.getLogger("greenserve.router.routing.enforcer")

Weights = dict[str, float]
# A plan names a MIG instance its layout creates by placement (optimizer/solvers/routing_weights.py,
# placement_engine_id); the fleet inventory says which engine runs there once the gpu-partitioner reports it.
MIG_PLACEMENT_PREFIX = "mig:"


RUN_STATES = frozenset(common_pb2.EngineRunState.values())


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
        named: set[str] = set()
        for j, run in enumerate(interval.engine_runs):
            where = f"plan.intervals[{i}].engine_runs[{j}]"
            if not run.engine_id:
                raise PlanError(f"{where}.engine_id is empty")
            if run.state not in RUN_STATES:
                raise PlanError(f"{where}.state {run.state} is not an EngineRunState")
            if run.engine_id in named:
                raise PlanError(f"{where}: engine {run.engine_id!r} is named twice in the interval")
            named.add(run.engine_id)


class ActivePlan:
    """The plan in force and the weights derived from it; cheap to read on every request."""

    def __init__(self, db: Database | None = None, clock: Callable[[], float] = now_s) -> None:
        self.db = db
        self.clock = clock
        self.plan: common_pb2.Plan | None = None
        self.version = 0
        self.received_at = 0.0
        self.seen_version = 0  # the highest version this store has had in force
        # called with a plan read from the database and put in force (ahead of the WatchPlans stream)
        self.on_stored_plan: Callable[[common_pb2.Plan], None] | None = None
        self._weights: dict[str, Weights] = {}
        self._runs: dict[str, int] = {}  # engine id -> EngineRunState of the interval in force (resolved)
        self._interval: common_pb2.PlanInterval | None = None  # the interval in force (_select_interval)
        self._valid_from = -math.inf  # clock time from which the interval in force is the one selected
        self._valid_until = math.inf  # clock time when the interval in force ends
        self.pool_slo: dict[str, common_pb2.Slo] = {}
        self.pool_region: dict[str, str] = {}
        # "mig:<gpu>/<profile>@<start>" (a MIG instance the plan's layout creates) -> the engine ids the fleet
        # inventory reports on that instance (the gpu-partitioner registers them with their own ids)
        self.instance_engines: dict[str, list[str]] = {}

    # -- read side (request path) -----------------------------------------------------------------

    def weights_for(self, pool: str) -> tuple[Weights | None, int]:
        """Weights of ``pool`` in force now (None without a plan or without weights for the pool)."""
        if self.plan is None:
            return None, 0
        if not self._valid_from <= self.clock() < self._valid_until:
            self._select_interval()
        return self._weights.get(pool), self.version

    def unresolved_placements(self) -> set[str]:
        """MIG placements (``mig:<gpu>/<profile>@<start>``) the interval in force weights that no engine of the
        fleet inventory runs at yet: the layout is being applied, and until the gpu-partitioner reports the
        engines it started there (and the router reads the fleet again) their weight goes to no engine."""
        if self.plan is None:
            return set()
        if not self._valid_from <= self.clock() < self._valid_until:
            self._select_interval()
        interval = self._interval
        if interval is None:
            return set()
        return {w.engine_id for w in interval.routing_weights
                if w.engine_id.startswith(MIG_PLACEMENT_PREFIX) and w.engine_id not in self.instance_engines}

    def engine_ids(self) -> set[str]:
        if self.plan is None:
            return set()
        return {e for interval in self.plan.intervals
                for name in [*(w.engine_id for w in interval.routing_weights),
                             *(r.engine_id for r in interval.engine_runs)]
                for e in self.instance_engines.get(name, (name,))}

    def run_targets(self) -> dict[str, int]:
        """Engine id -> EngineRunState the interval in force gives it (MIG placements resolved to their engines);
        empty without a plan or without ``engine_runs`` (every engine awake)."""
        if self.plan is None:
            return {}
        if not self._valid_from <= self.clock() < self._valid_until:
            self._select_interval()
        return dict(self._runs)

    def interval_in_force(self) -> common_pb2.PlanInterval | None:
        if self.plan is not None and not self._valid_from <= self.clock() < self._valid_until:
            self._select_interval()
        return self._interval

    # -- write side ------------------------------------------------------------------------------

    def _select_interval(self) -> None:
        plan = self.plan
        assert plan is not None
        now = self.clock()
        chosen = None
        # The choice depends on the clock only through the intervals' bounds: it holds from the last bound at or
        # before now to the first after it, so a clock jumping either way past one selects again.
        bounds = [t for iv in plan.intervals for t in (iv.start.ToSeconds() if iv.HasField("start") else -math.inf,
                                                       iv.end.ToSeconds() if iv.HasField("end") else math.inf)]
        valid_from = max((t for t in bounds if t <= now), default=-math.inf)
        next_change = min((t for t in bounds if t > now), default=math.inf)
        for interval in plan.intervals:
            start = interval.start.ToSeconds() if interval.HasField("start") else -math.inf
            end = interval.end.ToSeconds() if interval.HasField("end") else math.inf
            if start <= now < end:
                chosen = interval
                break
        if chosen is None and plan.intervals:
            starts = [iv for iv in plan.intervals if not iv.HasField("start") or iv.start.ToSeconds() <= now]
            chosen = starts[-1] if starts else plan.intervals[0]
        weights: dict[str, Weights] = {}
        runs: dict[str, int] = {}
        self._interval = chosen
        if chosen is not None:
            for w in chosen.routing_weights:
                pool = weights.setdefault(w.pool, {})
                for engine_id in self.instance_engines.get(w.engine_id, (w.engine_id,)):
                    pool[engine_id] = w.weight
            for r in chosen.engine_runs:
                for engine_id in self.instance_engines.get(r.engine_id, (r.engine_id,)):
                    runs[engine_id] = r.state
        self._weights = weights
        self._runs = runs
        self._valid_from = valid_from
        self._valid_until = next_change

    def apply(self, plan: common_pb2.Plan, *, rollback: bool = False) -> bool:
        """Puts ``plan`` in force if it is valid and newer (or, with ``rollback``, any other version: the optimizer
        streams an older plan when an operator re-activates it); returns whether it was applied.

        Without ``rollback`` the plan is one read from the database: taken only when newer than every plan in force
        before (after a rollback a stored plan of a higher version may be stale), and ``on_stored_plan`` is told."""
        validate_plan(plan)
        if plan.version == self.version or (plan.version < self.version and not rollback):
            return False
        if not rollback and plan.version <= self.seen_version:
            return False
        self.plan = plan
        self.version = plan.version
        self.seen_version = max(self.seen_version, plan.version)
        self.received_at = self.clock()
        self._valid_until = -math.inf
        self._select_interval()
        if not rollback and self.on_stored_plan is not None:
            self.on_stored_plan(plan)
        return True

    def apply_fleet(self, fleet: common_pb2.FleetInventory) -> None:
        for pool in fleet.pools:
            if pool.HasField("slo"):
                self.pool_slo[pool.name] = pool.slo
            if pool.region:
                self.pool_region[pool.name] = pool.region
        instances = {f"{MIG_PLACEMENT_PREFIX}{gpu.uuid}/{inst.profile}@{inst.placement_start}":
                     ids for gpu in fleet.gpus for inst in gpu.instances if (ids := instance_engine_ids(inst))}
        if instances != self.instance_engines:
            self.instance_engines = instances
            if self.plan is not None:
                self._select_interval()  # the plan's MIG placements now name these engines

    def persist(self, plan: common_pb2.Plan) -> None:
        """Writes the plan as the last good one (one transaction; blocking: call off the event loop)."""
        if self.db is None:
            return
        body = plan.SerializeToString()
        with self.db.session() as s:
            row = s.get(LastPlan, LAST_PLAN_ID)
            if row is None:
                s.add(LastPlan(id=LAST_PLAN_ID, plan_version=plan.version, received_at=utcnow(), body=body))
            elif row.plan_version == plan.version and bytes(row.body) == body:
                return  # another replica stored the same plan already
            else:
                row.plan_version, row.received_at, row.body = plan.version, utcnow(), body
            bump(s)

    def read_persisted(self) -> common_pb2.Plan | None:
        """The stored last good plan (blocking), None when there is none or it is unreadable."""
        if self.db is None:
            return None
        with self.db.session(readonly=True) as s:
            row = s.get(LastPlan, LAST_PLAN_ID)
            body = None if row is None else bytes(row.body)
        if body is None:
            return None
        plan = common_pb2.Plan()
        try:
            plan.ParseFromString(body)
            validate_plan(plan)
        except Exception as exc:  # noqa: BLE001 - a corrupt row must not stop the router
            log.warning("stored plan unreadable; routing without it", extra={"error": str(exc)})
            return None
        return plan

    def load_persisted(self) -> bool:
        """Puts the stored last good plan in force (blocking); False when there is none or it is bad."""
        plan = self.read_persisted()
        return plan is not None and self.apply(plan)


class PlanWatcher:
    """Follows WatchPlans (the shared PlanFollower), puts each new valid plan in force, calls ``on_plan`` after it,
    and reports what the router did with the interval in force (module docstring)."""

    def __init__(
        self,
        store: ActivePlan,
        channel: grpc.aio.Channel | None,
        on_plan: Callable[[common_pb2.Plan], Awaitable[None]] | None = None,
        backoff_max_s: float = 10.0,
        *,
        instance: str | None = None,
        known_engines: Callable[[], set[str]] | None = None,
        on_unresolved: Callable[[], None] | None = None,
        sleeper: EngineSleeper | None = None,
    ) -> None:
        self.store = store
        self.on_plan = on_plan
        self.sleeper = sleeper  # puts engines to sleep and wakes them as the interval's engine_runs say
        self.on_unresolved = on_unresolved  # the interval in force weights MIG placements the fleet lacks
        self.known_engines = known_engines
        self.rejected = 0
        self.unstored: tuple[int, str] | None = None  # (version, why) of a plan in force that could not be stored
        self.follower = PlanFollower(component="router", instance=instance or socket.gethostname(), channel=channel,
                                     reconcile=self._reconcile, load=self._in_force, backoff_max_s=backoff_max_s)
        self._start: asyncio.Task[None] | None = None
        # a plan taken from the shared database ahead of the stream: what the stream has queued is older
        store.on_stored_plan = self.follower.resubscribe

    @property
    def connected(self) -> bool:
        return self.follower.connected

    def start(self) -> None:
        self._start = asyncio.get_running_loop().create_task(self._follow(), name="router-plan-follow")

    async def _follow(self) -> None:
        await self.follower.start()
        # A plan read back from the database is in force in this process now: report it. The process before a
        # restart may have been killed between storing the plan and sending its report, and the follower does not
        # reconcile a plan it starts from.
        stored = self.follower.plan
        if stored is not None and stored.version == self.store.version:
            await self.follower.reconcile_now(force=True)

    async def stop(self) -> None:
        await cancel_and_wait(self._start)
        self._start = None
        await self.follower.stop()

    async def _in_force(self) -> common_pb2.Plan | None:
        """The follower starts from the plan the store holds (read back from the database at start)."""
        return self.store.plan

    async def _reconcile(self, plan: common_pb2.Plan, interval: common_pb2.PlanInterval | None) -> Outcome:
        try:
            applied = self.store.apply(plan, rollback=True)  # what WatchPlans streams is the plan in force
        except PlanError as exc:
            self.rejected += 1
            log.warning("plan refused", extra={"plan_version": plan.version, "error": str(exc)})
            kept = f"routing stays on plan v{self.store.version}" if self.store.version else "routing by load and affinity"
            return Outcome(REFUSED, f"{exc}; {kept}")
        if applied:
            log.info("plan in force", extra={"plan_version": plan.version})
            self.unstored = None
            try:
                await asyncio.to_thread(self.store.persist, plan)
            except Exception as exc:  # noqa: BLE001 - routing on the plan goes on; the report says it is not stored
                reason = unavailable_reason(exc) or f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                log.warning("plan in force but not stored", extra={"plan_version": plan.version, "error": reason})
                self.unstored = (plan.version, reason)
            if self.on_plan is not None:
                await self.on_plan(plan)
        if self.on_unresolved is not None and self.store.unresolved_placements():
            self.on_unresolved()  # a new plan, or a new interval of it, whose layout is still being applied
        if self.sleeper is not None:
            self.sleeper.apply(self.store.run_targets())
        return self.outcome(plan, interval)

    def outcome(self, plan: common_pb2.Plan, interval: common_pb2.PlanInterval | None) -> Outcome:
        """The report of routing on ``interval``: its weights, and the engines' run states when the plan puts
        engines to sleep (APPLYING while they are on their way, FAILED while one fails)."""
        detail = self.describe(plan, interval)
        if self.unstored is not None and self.unstored[0] == plan.version:
            detail += (f"; not stored in the router's database ({self.unstored[1]}): a restart routes on the plan "
                       "stored before until the optimizer streams this one again")
        state = None
        if self.sleeper is not None:
            runs = self.sleeper.describe()
            if runs:
                detail += "; " + runs
            state = self.sleeper.outcome_state()
        return Outcome(APPLIED if state is None else state, detail)

    def report_runs(self) -> None:
        """Reports again once an engine reached its run state or failed to (EngineSleeper.on_change)."""
        plan = self.store.plan
        if plan is None:
            return
        interval = self.store.interval_in_force()
        self.follower.reporter.report(plan.version, interval, self.outcome(plan, interval))

    def describe(self, plan: common_pb2.Plan, interval: common_pb2.PlanInterval | None) -> str:
        """What routing on ``interval`` means: pools and engines weighted, weighted engines the router lacks."""
        weights = [] if interval is None else list(interval.routing_weights)
        if not weights:
            return f"plan v{plan.version}: no routing weights in this interval; routing by load and affinity"
        pools = {w.pool for w in weights}
        engines = {e for w in weights for e in self.store.instance_engines.get(w.engine_id, (w.engine_id,))}
        detail = f"plan v{plan.version}: weights for {len(pools)} pool(s), {len(engines)} engine(s)"
        if self.known_engines is not None:
            unknown = sorted(engines - self.known_engines())
            if unknown:
                shown = ", ".join(unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
                detail += (f"; {len(unknown)} weighted engine(s) unknown to the router even after GetFleet, no "
                           f"request goes to them: {shown}")
        return detail
