"""The model of one pool-hour of the variants-on-MIG problem (CLOVER, exact; see ``mig_variants``): the GPUs in
groups, the options of each (GPU model, MIG profile, variant) kind, a solution, and the evaluation of a configuration
shared by the exact solver's check, CLOVER's SA and random search (``mig_search``) and the brute-force tests."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from scipy.optimize import linprog

from greenserve.common.mig_geometry import Placement, geometry
from greenserve.optimizer.solvers import mig_patterns as mp

Kind = tuple[str, str, str]  # (gpu model, profile, variant)
State = tuple[tuple[Placement, str], ...]  # one GPU's instances of the pool: (placement, variant), sorted



# Drain + engine start-up + cache warm-up of one (re)started engine. Assumption (not measured here): vLLM drains
# in-flight requests in ~30 s, loads an 8B model and captures CUDA graphs in ~90 s, and its prefix cache refills
# in ~60 s; set ``change_s`` from measurements of your engines.
DEFAULT_CHANGE_S = 180.0
TIE_BREAK = 1e-4  # objective points per restarted engine: among equal plans, the one that changes least


@dataclass
class Group:
    """The GPUs of one model in one pool."""

    gpu_model: str
    uuids: list[str]
    states: list[State]  # per GPU, its state in force
    patterns: list[mp.Pattern]


@dataclass
class Problem:
    """One pool in one hour."""

    pool: str
    load_rps: float
    ci_g_per_kwh: float
    base_carbon_g: float  # C_base of the hour (BASE at the baseline CI)
    pue: float
    weight: float  # lambda
    groups: list[Group]
    options: dict[Kind, mp.Option]
    none_idle_w: dict[tuple[str, str], float]  # (gpu model, profile) -> idle power of an instance without engine
    headroom: float = 0.9
    max_accuracy_loss: float | None = None
    change_s: float = DEFAULT_CHANGE_S
    max_ged: int | None = None
    previous_graph: dict[Kind, int] | None = None
    notes: list[str] = field(default_factory=list)
    # Hour-independent figures of patterns and transitions, shared by the hours of one pool (see ``PoolSetup``).
    memo: dict = field(default_factory=dict, repr=False)

    def g_per_j(self) -> float:
        return self.pue * self.ci_g_per_kwh / 3.6e6

    def pattern_idle_w(self, pattern: mp.Pattern) -> float:
        """Idle power of a GPU in the pattern: its engines' idle power, and never less than the whole GPU's (the GPU
        idles whole whatever its layout: an empty slice or a stopped engine saves nothing; the simulator's slice
        shares add up to the GPU's within rounding, which must not decide a plan)."""
        key = ("idle", pattern)
        if key not in self.memo:
            model = pattern.gpu_model
            engines = sum(self.options[(model, p, v)].idle_power_w for p, v in pattern.kinds
                          if v and (model, p, v) in self.options)
            self.memo[key] = max(self.gpu_idle_w(model), engines)
        return self.memo[key]

    def transition(self, state: State, pattern: mp.Pattern, state_key: tuple | None = None) -> tuple[float, int, int]:
        """(idle power of the engines started, engines started, engines started + stopped) to go from ``state``
        to ``pattern``."""
        key = ("move", state if state_key is None else state_key, pattern)
        if key not in self.memo:
            started = mp.restarts(state, pattern)[0]
            watts = sum(self.options[(pattern.gpu_model, p, v)].idle_power_w for p, v in started)
            self.memo[key] = (watts, len(started), len(started) + mp.stopped(state, pattern))
        return self.memo[key]

    def gpu_idle_w(self, model: str) -> float:
        return gpu_idle_w(model)

    def kinds_of(self, pattern: mp.Pattern) -> dict[Kind, int]:
        """Engines of a pattern that serve (a kept engine the model has no option for serves nothing here)."""
        key = ("kinds", pattern)
        if key not in self.memo:
            self.memo[key] = {(pattern.gpu_model, p, v): n for (p, v), n in pattern.counts.items()
                              if v and (pattern.gpu_model, p, v) in self.options}
        return self.memo[key]

    def change_g(self, started: list[tuple[str, str]], gpu_model: str) -> float:
        return sum(self.options[(gpu_model, p, v)].idle_power_w for p, v in started) * self.change_s * self.g_per_j()


@dataclass
class Solution:
    counts: dict[tuple[int, mp.Pattern], int]  # (group index, pattern) -> GPUs
    flows: dict[Kind, float]
    objective: float  # f minus the change cost (objective points)
    f: float
    d_carbon: float
    d_accuracy: float
    carbon_g: float
    change_g: float
    restarts: int
    served_rps: float
    status: str  # "optimal", "within gap", "feasible", "infeasible"
    bound: float | None = None
    mip_gap: float | None = None
    solve_s: float = 0.0
    solve_cpu_s: float = 0.0  # this process's CPU time (the wall time on a loaded machine overstates the work)
    transitions: dict[tuple[int, State, mp.Pattern], int] = field(default_factory=dict)


def gpu_idle_w(gpu_model: str) -> float:
    """Idle power of the whole GPU (the simulator's GPU table; the closest family's when it has none)."""
    gpus = mp._sim_gpus()
    key = gpu_model if gpu_model in gpus else ("H100-80GB" if gpu_model.startswith("H") else "A100-80GB")
    return float(gpus[key]["idle_w"])


def none_idle_w(gpu_model: str, profile: str) -> float:
    """A slice's share of the GPU's idle power (its SMs), as the simulator charges a MIG engine."""
    return gpu_idle_w(gpu_model) * mp.slice_sm_fraction(gpu_model, profile, geometry(gpu_model))



# ----------------------------------------------------------------------------------------------------------------
# Evaluation of a configuration (shared by the exact solver's check, SA, random search and brute force)
# ----------------------------------------------------------------------------------------------------------------


def max_servable(problem: Problem) -> float:
    """The most load any configuration carries within the SLA (each GPU at its highest-capacity pattern)."""
    total = 0.0
    for g in problem.groups:
        best = max((sum(problem.options[k].capacity_requests_per_s * n for k, n in problem.kinds_of(p).items())
                    for p in g.patterns), default=0.0)
        total += problem.headroom * best * len(g.uuids)
    return total


def flow_coefficients(problem: Problem, load: float) -> dict[Kind, float]:
    """Objective points per request/s on each kind: -lambda x its dynamic carbon + (1 - lambda) x its quality."""
    lam = problem.weight
    out = {}
    for k, opt in problem.options.items():
        carbon = opt.energy_per_request_j * 3600.0 * problem.g_per_j()
        acc = (1 - lam) * 100.0 * opt.quality_fraction / load if load > 0 else 0.0
        out[k] = -lam * 100.0 * carbon / problem.base_carbon_g + acc
    return out


def best_flows(problem: Problem, instances: dict[Kind, int], load: float) -> dict[Kind, float] | None:
    """The optimal split of ``load`` over the instances (None when the SLA cannot hold). Without an accuracy cap
    this is a fractional knapsack (fill the best coefficient first: exact); with one, a two-row LP."""
    caps = {k: problem.headroom * problem.options[k].capacity_requests_per_s * n for k, n in instances.items() if n > 0}
    if sum(caps.values()) < load - 1e-9:
        return None
    coef = flow_coefficients(problem, load)
    if problem.max_accuracy_loss is None or load <= 0:
        flows, left = {}, load
        for k in sorted(caps, key=lambda k: (-coef[k], k)):
            take = min(caps[k], left)
            flows[k] = take
            left -= take
        return flows
    keys = sorted(caps)
    result = linprog([-coef[k] for k in keys], A_ub=[[-problem.options[k].quality_fraction for k in keys]],
                     b_ub=[-(1 - problem.max_accuracy_loss) * load], A_eq=[[1.0] * len(keys)], b_eq=[load],
                     bounds=[(0.0, caps[k]) for k in keys], method="highs")
    if result.status != 0:
        return None
    return {k: max(0.0, float(v)) for k, v in zip(keys, result.x)}


def score(problem: Problem, counts: dict[tuple[int, mp.Pattern], int], flows: dict[Kind, float], load: float
          ) -> tuple[float, float, float, float]:
    """(f, dCarbon, dAccuracy, carbon_g) of a configuration and its load split."""
    idle_w = sum(problem.pattern_idle_w(p) * n for (_, p), n in counts.items())
    dyn_j = sum(problem.options[k].energy_per_request_j * y for k, y in flows.items()) * 3600.0
    carbon = (idle_w * 3600.0 + dyn_j) * problem.g_per_j()
    d_carbon = 100.0 * (problem.base_carbon_g - carbon) / problem.base_carbon_g
    served = sum(flows.values())
    quality = sum(problem.options[k].quality_fraction * y for k, y in flows.items()) / served if served > 0 else 1.0
    d_accuracy = 100.0 * (quality - 1.0)
    lam = problem.weight
    return lam * d_carbon + (1 - lam) * d_accuracy, d_carbon, d_accuracy, carbon


def instances_of(problem: Problem, counts: dict[tuple[int, mp.Pattern], int]) -> dict[Kind, int]:
    out: Counter[Kind] = Counter()
    for (_, p), n in counts.items():
        for k, m in problem.kinds_of(p).items():
            out[k] += m * n
    return dict(out)


def evaluate(problem: Problem, counts: dict[tuple[int, mp.Pattern], int], load: float | None = None
             ) -> tuple[float, dict[Kind, float]] | None:
    """f of a configuration with its best load split; None when it violates the SLA (or the accuracy cap)."""
    load = problem.load_rps if load is None else load
    flows = best_flows(problem, instances_of(problem, counts), load)
    if flows is None:
        return None
    return score(problem, counts, flows, load)[0], flows

