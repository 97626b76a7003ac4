"""What the planner hands every solver and what a solver answers: ``PlanningInputs`` (gathered once per computation,
never changed by a solver), ``SeriesForecast``, ``KnobPlan`` (one knob's messages per interval and, from the routing
solver, the expected figures per pool: ``PoolFigures``), and the solver protocols.

A solver is any object with ``knob`` (the PlanInterval field it fills: ``routing_weights``, ``cache_targets``,
``mig_layouts`` or ``serving_modes``), ``name`` and ``solve(inputs) -> KnobPlan``; plan_builder.py runs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from google.protobuf.message import Message

from greenserve.common.carbon_params import CarbonParams
from greenserve.common.embodied_carbon import Platform
from greenserve.optimizer.capacity import Capability
from greenserve.v1 import common_pb2

if TYPE_CHECKING:
    from greenserve.optimizer.replay_trace import ReplayTrace

KNOBS = ("routing_weights", "cache_targets", "mig_layouts", "serving_modes", "engine_runs", "gpu_power")
KNOB_LABELS = {"routing_weights": "routing", "cache_targets": "cache", "mig_layouts": "MIG", "serving_modes": "modes",
               "engine_runs": "engine sleep", "gpu_power": "GPU clocks"}
DEFAULT_SOLVER_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SeriesForecast:
    """Hourly mean / lower / upper of one series over the horizon, and how fresh it is."""

    mean: tuple[float, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    model: str = ""
    stale_s: float = 0.0  # age of the forecast when it was not refreshed for this computation (0: fresh)
    source: str = "forecaster"  # "forecaster", "cache" (the forecaster was down), "constant"
    made_s: float = 0.0  # when the forecaster computed it (Unix seconds; 0: unknown)
    history_end_s: float = 0.0  # the last observed point its model had seen (Unix seconds; 0: unknown)


@dataclass
class PlanningInputs:
    """Everything a solver may read, gathered once per computation."""

    start_s: float
    horizon_hours: int
    fleet: common_pb2.FleetInventory
    ci: dict[str, SeriesForecast]  # per region
    load: dict[str, SeriesForecast]  # per pool
    capabilities: dict[str, Capability]  # per engine id
    params: CarbonParams
    gpu_platform: dict[str, Platform]  # per GPU uuid (embodied of one GPU)
    current: common_pb2.Plan | None = None
    carbon_weight_fraction: float = 1.0
    declared: common_pb2.FleetInventory | None = None  # what the operator declared (targets such as MIG layouts)
    cache_sizes: dict[str, tuple[int, int]] = field(default_factory=dict)  # pool -> (DRAM, disk) bytes in force
    # Recorded traffic to replay (traffic_history.py; only when a solver wants_traffic_history): pool -> trace,
    # and pool -> why it has none.
    traffic: dict[str, ReplayTrace] = field(default_factory=dict)
    traffic_missing: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # pool -> fraction of prompt tokens its engines are expected to find in the prefix cache (measured; rounded down
    # by capacity.hit_fraction_step): predicted capacities of new MIG instances count it (capacity.py)
    prefix_hit_fraction: dict[str, float] = field(default_factory=dict)
    # Per interval, the engines' capabilities as another knob's choice leaves them (a cache solver's DRAM size per
    # hour changes the prefix hits and so the capacity: ``KnobPlan.capabilities``); None: ``capabilities`` throughout.
    interval_capabilities: list[dict[str, Capability]] | None = None
    # pool -> the load the plan must carry per unit of forecast mean, learned from backtests of the load forecast
    # (actual / forecast); a pool without one takes the solver's default
    load_margin: dict[str, float] = field(default_factory=dict)
    # pool -> DRAM (L1) resizes, each an LMCache restart, in the 24 h before ``start_s``: a solver that bounds
    # restarts per day counts them against its budget
    dram_restarts_last_day: dict[str, int] = field(default_factory=dict)
    # pool -> share of the predicted capacity a plan may count (1: all), lowered after a measured SLO breach showed
    # that the prediction promised more than the engines gave, won back by good hours (optimizer/loop.py)
    capacity_derate: dict[str, float] = field(default_factory=dict)
    # pool -> why its LMCache tier does not work (the profiler measured its KV connector degraded): no cache target
    # for it (cache_tier_health.py)
    cache_tier_faults: dict[str, common_pb2.CacheTierFault] = field(default_factory=dict)

    def capabilities_at(self, hour: int) -> dict[str, Capability]:
        """The engines' capabilities in hour ``hour`` of the horizon (``interval_capabilities``, else
        ``capabilities``)."""
        if self.interval_capabilities is not None and hour < len(self.interval_capabilities):
            return self.interval_capabilities[hour]
        return self.capabilities

    @property
    def interval_starts_s(self) -> list[float]:
        return [self.start_s + 3600.0 * h for h in range(self.horizon_hours)]

    def pool(self, name: str) -> common_pb2.Pool:
        for pool in self.fleet.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)

    def current_interval(self, hour: int) -> common_pb2.PlanInterval | None:
        """The interval of the plan in force covering hour ``hour`` of the horizon (or its last one)."""
        plan = self.current
        if plan is None or not plan.intervals:
            return None
        t = self.start_s + 3600.0 * hour
        for interval in plan.intervals:
            if interval.start.ToSeconds() <= t < interval.end.ToSeconds():
                return interval
        return plan.intervals[-1]


@dataclass
class PoolFigures:
    """What a solver expects of one pool in one interval."""

    load_requests_per_s: float
    capacity_requests_per_s: float
    attainment_fraction: float
    engine_rates: dict[str, float]  # requests per second sent to each engine
    # dynamic J per request of engines the fleet does not list yet (MIG instances a layout creates; their GPU's
    # idle power is charged with the pool's listed engines)
    new_engine_energy_per_request_j: dict[str, float] = field(default_factory=dict)
    attainment_at_upper_fraction: float | None = None  # predicted if the load reaches its interval's upper bound
    engines_awake: int = 0  # engines the plan keeps awake (0: the plan does not put engines to sleep)
    saved_g_by_lever: dict[str, float] = field(default_factory=dict)  # vs the static fleet, by lever (predicted)


@dataclass
class KnobPlan:
    """A solver's answer: per interval the messages of its knob, plus lines for the explanation."""

    per_interval: list[list[Message]]
    explanation: list[str] = field(default_factory=list)
    detail: str = ""
    status: str = "ok"  # "ok" or "kept"
    pool_figures: list[dict[str, PoolFigures]] | None = None  # routing solvers fill it
    # Per interval, the engines' capabilities under this knob's choice (a cache solver whose sizes change the
    # engines' capacity fills it): the planner runs such a solver before routing and hands these to the solvers
    # after it and to the plan's figures (``PlanningInputs.interval_capabilities``).
    capabilities: list[dict[str, Capability]] | None = None


class Solver(Protocol):
    knob: str
    name: str

    def solve(self, inputs: PlanningInputs) -> KnobPlan: ...


class JointSolver(Protocol):
    """A solver that decides several knobs together (``knobs``) and answers one ``KnobPlan`` per knob. ``knob`` is
    the one whose answer carries the pool figures (``routing_weights``); the planner runs it first, in one call."""

    knob: str
    knobs: tuple[str, ...]
    name: str

    def solve_knobs(self, inputs: PlanningInputs) -> dict[str, KnobPlan]: ...


def solver_knobs(solver: Any) -> tuple[str, ...]:
    """The knobs ``solver`` fills: its ``knobs`` (a joint solver) or its one ``knob``."""
    return tuple(getattr(solver, "knobs", None) or (solver.knob,))


def keep_current_messages(inputs: PlanningInputs, knob: str) -> list[list[Message]]:
    """Per interval, the knob's messages of the plan in force (empty without one)."""
    out: list[list[Message]] = []
    for h in range(inputs.horizon_hours):
        interval = inputs.current_interval(h)
        out.append([] if interval is None else list(getattr(interval, knob)))
    return out
