"""MIG layouts with a model variant per instance (CLOVER, exact): the "mig_layouts" knob.

Per pool and hour, CLOVER's problem (Sec. 4.1): choose each GPU's MIG layout and each instance's variant to

    maximise  f = lambda x dCarbon + (1 - lambda) x dAccuracy                       (Eq. 3)
    dAccuracy = (A - A_base) / A_base x 100 %     A = request-weighted quality      (Eq. 1)
    dCarbon   = (C_base - C) / C_base x 100 %     C = operational carbon of the hour (Eq. 2)
    subject to the SLA                                                              (Eq. 5)

with ``lambda`` = ``inputs.carbon_weight_fraction``, ``C_base`` the carbon of BASE (the best variant on every GPU
whole) at the horizon's mean CI (CLOVER's baseline CI) and ``C`` the carbon at the hour's CI. Eq. 2 per request
times the hour's requests is the same ratio, and stays defined at zero load.

**Exact formulation.** GPUs of one model are interchangeable (CLOVER's configuration-graph argument), so the
decision is how many GPUs take each layout-and-variants *pattern* (``mig_patterns``): integers ``z[c, p]`` =
GPUs now in state class ``c`` that take pattern ``p``. The load split is continuous: ``y[k]`` requests/s on
instance kind ``k = (gpu model, profile, variant)``, each bounded by ``headroom x capacity_k x instances_k``, the
capacity at the pool's SLO from the profiles (``capacity.py``). Then

* SLA, hard: ``sum_k y[k] = load`` (the forecast's upper bound). CLOVER's SA energy (Eq. 6) multiplies ``-f`` by
  ``min(1, L_tail / L)``, which *rewards* a violating configuration when ``f < 0``; here a configuration that
  cannot carry the load is infeasible, never scored. When no layout can carry it, the plan carries the most any
  layout can and says so.
* optional accuracy-loss cap: ``sum_k q_k y[k] >= (1 - cap) x load``;
* change cost (issue 19 item 3): each engine a GPU must (re)start to go from its state to the pattern is charged
  the carbon of its idle power over drain + start-up + cache warm-up, in the objective's units; ties are broken
  towards fewer restarts, so a GPU is never reshuffled for a gain below its change cost;
* optional bound on the graph edit distance (CLOVER Sec. 4.2: edge-weight changes of the (variant, slice) graph)
  between consecutive hours.

Everything is linear; HiGHS (highspy, the model passed as arrays: PuLP's expression building doubled each solve)
proves the optimum (``mip_rel_gap`` configurable; 0 by default). Hours are solved in order, each from the previous
hour's plan (the change cost couples them); within a plan an hour whose CI and load moved less than 5 % since the
last solve keeps the configuration (CLOVER's re-optimisation trigger), as long as it still carries the load.
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import highspy
import numpy as np
from scipy.optimize import linprog

from greenserve.gpu_partitioner.geometry import Placement, geometry
from greenserve.optimizer.fleet import GPU_HARDWARE
from greenserve.optimizer.inputs import engine_hardware, guess_simulator_model
from greenserve.optimizer.planning import KnobPlan, PlanningInputs
from greenserve.optimizer.solvers import mig_patterns as mp
from greenserve.optimizer.solvers.keep_current import _mig_layouts as in_force_layouts
from greenserve.v1 import common_pb2

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


# ----------------------------------------------------------------------------------------------------------------
# The exact solver
# ----------------------------------------------------------------------------------------------------------------


class _Milp:
    """A MILP in column/row form handed to HiGHS (highspy) in one call. PuLP's expression building took about half
    of each hour's solve time here; a plan solves hundreds of these (pools x hours)."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.integer: list[int] = []
        self.rows: list[tuple[float, float, dict[int, float]]] = []

    def column(self, cost: float, lower: float, upper: float, *, integer: bool = False) -> int:
        self.cost.append(cost)
        self.lower.append(lower)
        self.upper.append(upper)
        if integer:
            self.integer.append(len(self.cost) - 1)
        return len(self.cost) - 1

    def row(self, lower: float, upper: float, coefficients: dict[int, float]) -> None:
        self.rows.append((lower, upper, coefficients))

    def maximise(self, *, gap_rel: float, time_limit_s: float | None
                 ) -> tuple[bool, list[float], float | None, float | None]:
        """(solved, column values, dual bound, MIP gap)."""
        inf = highspy.kHighsInf

        def clip(v: float) -> float:
            return inf if v == math.inf else -inf if v == -math.inf else v

        def load(integer: bool) -> highspy.Highs:
            h = highspy.Highs()
            h.setOptionValue("output_flag", False)
            # No "threads" option: HiGHS's scheduler is global to the process and is fixed by the first solve
            # (PuLP's, for the cache ILP); asking for another thread count afterwards makes every run fail.
            h.setOptionValue("mip_rel_gap", gap_rel)
            if time_limit_s is not None:
                h.setOptionValue("time_limit", float(time_limit_s))
            n = len(self.cost)
            h.addCols(n, np.array(self.cost, dtype=float), np.array([clip(v) for v in self.lower], dtype=float),
                      np.array([clip(v) for v in self.upper], dtype=float), 0, np.array([], dtype=np.int32),
                      np.array([], dtype=np.int32), np.array([], dtype=float))
            if integer and self.integer:
                h.changeColsIntegrality(len(self.integer), np.array(self.integer, dtype=np.int32),
                                        np.array([highspy.HighsVarType.kInteger] * len(self.integer)))
            starts, index, value = [], [], []
            for _, _, coefficients in self.rows:
                starts.append(len(index))
                for c, v in coefficients.items():
                    index.append(c)
                    value.append(v)
            h.addRows(len(self.rows), np.array([clip(r[0]) for r in self.rows], dtype=float),
                      np.array([clip(r[1]) for r in self.rows], dtype=float), len(index),
                      np.array(starts, dtype=np.int32), np.array(index, dtype=np.int32), np.array(value, dtype=float))
            h.changeObjectiveSense(highspy.ObjSense.kMaximize)
            return h

        # The LP relaxation first: when its optimum is integral it is the MILP's optimum (its bound is met).
        # The MILP then runs on a model of its own: HiGHS 1.16 re-run as a MIP on the object that just solved the
        # relaxation returned a wrong incumbent with gap 0 (caught by the brute-force test).
        h = load(integer=False)
        h.run()
        if h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
            x = list(h.getSolution().col_value)
            if all(abs(x[c] - round(x[c])) <= 1e-7 for c in self.integer):
                return True, x, float(h.getInfo().objective_function_value), 0.0
        h = load(integer=True)
        h.run()
        status = h.getModelStatus()
        if status not in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kTimeLimit) or \
                h.getInfo().primal_solution_status != 2:  # 2: a feasible solution
            return False, [], None, None
        info = h.getInfo()
        bound = float(info.mip_dual_bound) if math.isfinite(info.mip_dual_bound) else None
        gap = float(info.mip_gap) if math.isfinite(info.mip_gap) else None
        return True, list(h.getSolution().col_value), bound, gap


def solve_exact(problem: Problem, *, gap_rel: float = 0.0, time_limit_s: float | None = None) -> Solution:
    started = time.perf_counter()
    started_cpu = time.process_time()
    load = problem.load_rps
    servable = max_servable(problem)
    if load > servable + 1e-9:
        problem.notes.append(f"pool {problem.pool}: forecast load {load:.2f} req/s exceeds what any layout serves "
                             f"within the SLO ({servable:.2f} req/s); planned for {servable:.2f}")
        load = servable
    model = _Milp()
    z: dict[tuple[int, tuple, mp.Pattern], int] = {}
    change: dict[tuple[int, tuple, mp.Pattern], tuple[float, int, int, State]] = {}
    n_cols: dict[tuple[int, mp.Pattern], list[int]] = defaultdict(list)
    lam = problem.weight
    idle_coef = lam * 100.0 * 3600.0 * problem.g_per_j() / problem.base_carbon_g
    for gi, group in enumerate(problem.groups):
        idle = {p: problem.pattern_idle_w(p) for p in group.patterns}
        classes: dict[tuple, tuple[State, int]] = {}
        for state in group.states:  # states keyed by plain tuples: hashing Placement dataclasses is slow
            skey = tuple((p.start, p.size, p.profile, v) for p, v in state)
            classes[skey] = (state, classes[skey][1] + 1 if skey in classes else 1)
        change_coef = problem.change_s * problem.g_per_j()
        for skey, (state, count) in sorted(classes.items()):
            row = []
            if ("keep", skey) not in problem.memo:
                problem.memo[("keep", skey)] = mp.keep_pattern(group.gpu_model, state)
            keep = problem.memo[("keep", skey)]
            candidates = group.patterns if keep is None else [*group.patterns, keep]
            if keep is not None:
                idle[keep] = problem.pattern_idle_w(keep)
            for pattern in candidates:
                watts, n_started, changes = problem.transition(state, pattern, skey)
                cost_g = watts * change_coef
                col = model.column(-(idle_coef * idle[pattern] + lam * 100.0 * cost_g / problem.base_carbon_g
                                     + TIE_BREAK * changes), 0.0, count, integer=True)
                z[(gi, skey, pattern)] = col
                change[(gi, skey, pattern)] = (cost_g, n_started, changes, state)
                n_cols[(gi, pattern)].append(col)
                row.append(col)
            model.row(count, count, {c: 1.0 for c in row})
    kinds = sorted(problem.options)
    coef = flow_coefficients(problem, load)
    y = {k: model.column(coef[k], 0.0, math.inf) for k in kinds}
    instances: dict[Kind, dict[int, float]] = defaultdict(dict)  # kind -> {z column: instances per GPU}
    for (gi, pattern), cols in n_cols.items():
        for k, m in problem.kinds_of(pattern).items():
            for c in cols:
                instances[k][c] = float(m)
    for k in kinds:  # y_k <= headroom x capacity_k x instances_k
        cap = problem.headroom * problem.options[k].capacity_requests_per_s
        model.row(-math.inf, 0.0, {y[k]: 1.0, **{c: -cap * m for c, m in instances[k].items()}})
    model.row(load, load, {y[k]: 1.0 for k in kinds})
    if problem.max_accuracy_loss is not None and load > 0:
        model.row((1 - problem.max_accuracy_loss) * load, math.inf,
                  {y[k]: problem.options[k].quality_fraction for k in kinds})
    if problem.max_ged is not None and problem.previous_graph is not None:
        d = []
        for e in sorted(set(problem.previous_graph) | set(kinds)):
            de = model.column(0.0, 0.0, math.inf)
            prev = float(problem.previous_graph.get(e, 0))
            w = instances.get(e, {})
            model.row(-prev, math.inf, {de: 1.0, **{c: -m for c, m in w.items()}})  # d >= W - prev
            model.row(prev, math.inf, {de: 1.0, **{c: m for c, m in w.items()}})  # d >= prev - W
            d.append(de)
        model.row(-math.inf, float(problem.max_ged), {c: 1.0 for c in d})
    # The objective's constant: f = lambda x 100 x (1 - C / C_base) + (1 - lambda) x 100 x (A - 1).
    constant = lam * 100.0 - ((1 - lam) * 100.0 if load > 0 else 0.0)
    ok, x, bound, mip_gap = model.maximise(gap_rel=gap_rel, time_limit_s=time_limit_s)
    if not ok:
        raise RuntimeError(f"pool {problem.pool}: no configuration meets the SLO and the constraints; MIG layouts "
                           f"left as in force")
    bound = bound + constant if bound is not None else None
    counts: Counter[tuple[int, mp.Pattern]] = Counter()
    transitions = {}
    change_total = 0.0
    n_restart = n_changes = 0
    for key, col in z.items():
        n = int(round(x[col]))
        if n:
            transitions[(key[0], change[key][3], key[2])] = n
            counts[(key[0], key[2])] += n
            change_total += change[key][0] * n
            n_restart += change[key][1] * n
            n_changes += change[key][2] * n
    flows = {k: max(0.0, x[c]) for k, c in y.items() if x[c] > 1e-12}
    f, d_c, d_a, carbon = score(problem, dict(counts), flows, load)
    objective_value = f - lam * 100.0 * change_total / problem.base_carbon_g - TIE_BREAK * n_changes
    sol_status = "optimal"
    if mip_gap is not None and mip_gap > 1e-6 and (bound is None or bound - objective_value > 1e-6):
        sol_status = "within gap"
    return Solution(dict(counts), flows, objective_value, f, d_c, d_a, carbon, change_total, n_restart,
                    sum(flows.values()), sol_status, bound, mip_gap, time.perf_counter() - started,
                    time.process_time() - started_cpu, transitions)


# ----------------------------------------------------------------------------------------------------------------
# From the fleet to problems, and back to layouts
# ----------------------------------------------------------------------------------------------------------------


def gpu_model_of(gpu: common_pb2.Gpu) -> str | None:
    """The gpu-partitioner's geometry name of a GPU (None when it has no MIG)."""
    name = GPU_HARDWARE.get(gpu.model)
    if name is None:
        return None
    try:
        geometry(name)
    except KeyError:
        return None
    return name


def pool_variants(pool: common_pb2.Pool) -> list[common_pb2.ModelVariant | None]:
    return list(pool.variants) if pool.variants else [None]


def variant_name(v: common_pb2.ModelVariant | None) -> str:
    return v.name if v is not None else "default"


class OptionTable:
    """Options of one pool: an engine already running the variant on that slice, else the simulator."""

    def __init__(self, inputs: PlanningInputs, pool: common_pb2.Pool, pool_index: int) -> None:
        self.inputs, self.pool, self.pool_index = inputs, pool, pool_index
        self.engines: dict[tuple[str, str], str] = {}
        default = pool.variants[0].name if pool.variants else "default"
        for engine in pool.engines:
            hw = engine_hardware(engine, inputs.fleet)
            if "-MIG-" in hw and engine.id in inputs.capabilities:
                self.engines.setdefault((hw, engine.model_variant or default), engine.id)

    def option(self, gpu_model: str, profile: str, variant: common_pb2.ModelVariant | None) -> mp.Option | None:
        name = variant_name(variant)
        hw = f"{gpu_model}-MIG-{profile}"
        engine_id = self.engines.get((hw, name))
        quality = variant.quality_fraction if variant is not None else 1.0
        if engine_id is not None:
            cap = self.inputs.capabilities[engine_id]
            if cap.capacity_requests_per_s > 0:
                return mp.Option(cap.capacity_requests_per_s, cap.idle_power_w, cap.energy_per_request_j, quality,
                                 cap.source, f"engine {engine_id}: {cap.detail}")
        sim = (variant.simulator_model if variant is not None and variant.simulator_model else None) or \
            guess_simulator_model(variant.model if variant is not None else self.pool.model) or \
            guess_simulator_model(self.pool.model)
        vi = next((i for i, v in enumerate(self.pool.variants) if v.name == name), None)
        field_ = (f"fleet.pools[{self.pool_index}].variants[{vi}].simulator_model" if vi is not None
                  else f"fleet.pools[{self.pool_index}].model")
        return mp.predicted_option(self.pool, gpu_model, profile, variant, sim, field_)


def gpu_idle_w(gpu_model: str) -> float:
    """Idle power of the whole GPU (the simulator's GPU table; the closest family's when it has none)."""
    gpus = mp._sim_gpus()
    key = gpu_model if gpu_model in gpus else ("H100-80GB" if gpu_model.startswith("H") else "A100-80GB")
    return float(gpus[key]["idle_w"])


def none_idle_w(gpu_model: str, profile: str) -> float:
    """A slice's share of the GPU's idle power (its SMs), as the simulator charges a MIG engine."""
    return gpu_idle_w(gpu_model) * mp.slice_sm_fraction(gpu_model, profile, geometry(gpu_model))


@dataclass
class PoolSetup:
    pool: common_pb2.Pool
    groups: list[Group]
    options: dict[Kind, mp.Option]
    none_idle: dict[tuple[str, str], float]
    variant_names: dict[str, str]  # planned name -> MigPlacement.model_variant
    fixed_capacity_rps: float  # the pool's engines the plan does not touch
    base_power_w: float  # BASE's idle power (best variant on each GPU whole)
    base_energy_per_request_j: float
    memo: dict = field(default_factory=dict, repr=False)  # shared by the hours' problems


def setup_pool(inputs: PlanningInputs, pool: common_pb2.Pool, pool_index: int, headroom: float,
               in_force: dict[str, common_pb2.MigLayout]) -> PoolSetup | None:
    """The pool's MIG GPUs with their states in force, and the options of its variants on their slices. A GPU is
    planned when its model has MIG and MIG is in use on it (enabled, instances declared or reported, or a layout in
    force): a GPU running whole (MIG off, e.g. one of a tensor-parallel engine's GPUs) stays as it is."""
    gpus = [g for g in inputs.fleet.gpus if g.pool == pool.name and gpu_model_of(g) is not None
            and (g.mig_enabled or g.instances or (g.uuid in in_force and in_force[g.uuid].placements))]
    if not gpus:
        return None
    table = OptionTable(inputs, pool, pool_index)
    variants = pool_variants(pool)
    names = {variant_name(v): (v.name if v is not None else "") for v in variants}
    default = variant_name(variants[0])
    # What runs on each instance now: the variant of the pool's engine on it (by MIG UUID or the instance's engine
    # id), which the layout in force may not say (a layout declared in the fleet names no variant).
    by_mig = {e.mig_uuid: e for e in pool.engines if e.mig_uuid}
    by_id = {e.id: e for e in pool.engines}
    running: dict[tuple[str, int, str], str] = {}
    for gpu in gpus:
        for inst in gpu.instances:
            engine = by_mig.get(inst.uuid) if inst.uuid else None
            engine = engine or by_id.get(inst.engine_id)
            if engine is not None:
                running[(gpu.uuid, inst.placement_start, inst.profile)] = engine.model_variant
    members = []
    for gpu in gpus:
        layout = in_force.get(gpu.uuid)
        state: list[tuple[Placement, str]] = []
        # The state: the pool's engines running on the GPU's reported instances when there are any (reality),
        # else the layout in force as keep-current sees it (the plan in force or the operator's declaration).
        if gpu.reported_by != "operator":
            for inst in gpu.instances:
                key = (gpu.uuid, inst.placement_start, inst.profile)
                if key in running and inst.placement_size:
                    name = running[key]
                    v = next((k for k, n in names.items() if n == name), default) if name else default
                    state.append((Placement(start=inst.placement_start, size=inst.placement_size,
                                            profile=inst.profile), v))
        if not state and layout is not None:
            for pl in layout.placements:
                if pl.pool == pool.name:
                    name = running.get((gpu.uuid, pl.start, pl.profile), pl.model_variant)
                    v = next((k for k, n in names.items() if n == name), default) if name else default
                    state.append((Placement(start=pl.start, size=pl.size, profile=pl.profile), v))
        members.append((gpu.uuid, gpu_model_of(gpu), tuple(sorted(state))))
    planned = {g.uuid for g in gpus}
    # The pool's engines the plan does not move (on no planned GPU) take load first.
    fixed = sum(headroom * inputs.capabilities[e.id].capacity_requests_per_s for e in pool.engines
                if e.id in inputs.capabilities and e.gpu_uuid not in planned)
    return make_setup(pool, members, table.option, fixed)


def make_setup(pool: common_pb2.Pool, members: list[tuple[str, str, State]],
               option: Callable[[str, str, common_pb2.ModelVariant | None], mp.Option | None],
               fixed_capacity_rps: float = 0.0) -> PoolSetup:
    """A pool's setup from its GPUs ``(uuid, gpu model, state)`` and an option function (tests and the bench
    give their own)."""
    variants = pool_variants(pool)
    names = {variant_name(v): (v.name if v is not None else "") for v in variants}
    options: dict[Kind, mp.Option] = {}
    none_idle: dict[tuple[str, str], float] = {}
    groups: dict[str, Group] = {}
    for uuid, model, state in members:
        if model not in groups:
            by_profile: dict[str, list[str]] = {}
            for prof in sorted({p for cls in mp.layout_classes(model) for p in cls}):
                none_idle[(model, prof)] = none_idle_w(model, prof)
                for v in variants:
                    opt = option(model, prof, v)
                    if opt is not None:
                        options[(model, prof, variant_name(v))] = opt
                        by_profile.setdefault(prof, []).append(variant_name(v))
            groups[model] = Group(model, [], [], mp.enumerate_patterns(model, by_profile))
        groups[model].uuids.append(uuid)
        groups[model].states.append(state)
    # BASE: the best variant that fits on the largest slice of every GPU (CLOVER's default configuration).
    base_idle = 0.0
    base_e: list[float] = []
    for model, group in groups.items():
        whole = max((p for cls in mp.layout_classes(model) for p in cls),
                    key=lambda p: geometry(model).profile(p).compute_slices)
        opt = next((options[(model, whole, variant_name(v))] for v in variants
                    if (model, whole, variant_name(v)) in options), None)
        base_idle += max(gpu_idle_w(model), opt.idle_power_w if opt else 0.0) * len(group.uuids)
        if opt:
            base_e.append(opt.energy_per_request_j)
    base_e_req = sum(base_e) / len(base_e) if base_e else 0.0
    return PoolSetup(pool, list(groups.values()), options, none_idle, names, fixed_capacity_rps, base_idle, base_e_req)


def to_layouts(setup: PoolSetup, problem: Problem, solution: Solution
               ) -> tuple[dict[str, common_pb2.MigLayout], list[list[State]]]:
    """Concrete layouts per GPU: a GPU keeps its state when its pattern allows it; the others take the concrete
    layout of their pattern that restarts the fewest engines (``mig_patterns.restarts``)."""
    out: dict[str, common_pb2.MigLayout] = {}
    new_states: list[list[State]] = []
    for gi, group in enumerate(problem.groups):
        want: dict[tuple[State, mp.Pattern], int] = {
            (s, p): n for (g, s, p), n in solution.transitions.items() if g == gi}
        states_out: list[State] = []
        for uuid, state in zip(group.uuids, group.states):
            pattern = next(p for (s, p), n in sorted(want.items(), key=lambda kv: len(mp.restarts(*kv[0])[0]))
                           if s == state and n > 0)
            want[(state, pattern)] -= 1
            _, layout, variants = mp.restarts(state, pattern)
            msg = common_pb2.MigLayout(gpu_uuid=uuid)
            st = []
            for pl, v in zip(layout, variants):
                if not v:  # an instance without an engine is not created (a subset of a valid layout is valid)
                    continue
                msg.placements.add(profile=pl.profile, start=pl.start, size=pl.size, pool=setup.pool.name,
                                   model_variant=setup.variant_names.get(v, ""))
                st.append((pl, v))
            out[uuid] = msg
            states_out.append(tuple(sorted(st)))
        new_states.append(states_out)
    return out, new_states


def graph_of(problem: Problem, solution: Solution) -> dict[Kind, int]:
    return instances_of(problem, solution.counts)


def base_carbon_g(setup: PoolSetup, load_rps: float, base_ci: float, pue: float) -> float:
    """C_base of one hour: BASE's energy at the baseline CI (never 0: a floor of 1 mg keeps Eq. 2 defined)."""
    energy_j = (setup.base_power_w + setup.base_energy_per_request_j * load_rps) * 3600.0
    return max(energy_j * pue * base_ci / 3.6e6, 1e-3)


def problem_for(setup: PoolSetup, states: list[list[State]] | None, load_rps: float, ci: float, base_ci: float,
                pue: float, weight: float, *, headroom: float = 0.9, max_accuracy_loss: float | None = None,
                change_s: float = DEFAULT_CHANGE_S, max_ged: int | None = None,
                previous_graph: dict[Kind, int] | None = None) -> Problem:
    """The problem of one hour of a pool (``states``: per group, the GPUs' states; None: as in the setup)."""
    states = states if states is not None else [list(g.states) for g in setup.groups]
    groups = [Group(g.gpu_model, g.uuids, st, g.patterns) for g, st in zip(setup.groups, states)]
    return Problem(setup.pool.name, load_rps, ci, base_carbon_g(setup, load_rps, base_ci, pue), pue, weight, groups,
                   setup.options, setup.none_idle, headroom, max_accuracy_loss, change_s, max_ged, previous_graph,
                   memo=setup.memo)


class MigVariantsSolver:
    """The "mig_layouts" knob, CLOVER's objective solved exactly (see the module docstring)."""

    knob = "mig_layouts"
    name = "mig_layouts.clover_exact"

    def __init__(self, *, headroom_fraction: float = 0.9, load_bound: str = "upper", change_s: float = DEFAULT_CHANGE_S,
                 max_ged_per_hour: int | None = None, max_accuracy_loss_fraction: float | None = None,
                 gap_rel: float = 0.0, time_limit_s: float | None = None, resolve_change_fraction: float = 0.05,
                 time_budget_s: float = 8.0) -> None:
        if not 0 < headroom_fraction <= 1:
            raise ValueError("headroom_fraction: must be in (0, 1]")
        if change_s < 0 or not math.isfinite(change_s):
            raise ValueError("change_s: must be a finite number >= 0")
        if max_accuracy_loss_fraction is not None and not 0 <= max_accuracy_loss_fraction < 1:
            raise ValueError("max_accuracy_loss_fraction: must be in [0, 1)")
        self.headroom = headroom_fraction
        self.load_bound = load_bound
        self.change_s = change_s
        self.max_ged = max_ged_per_hour
        self.max_loss = max_accuracy_loss_fraction
        self.gap_rel = gap_rel
        self.time_limit_s = time_limit_s
        self.resolve_change = resolve_change_fraction
        self.time_budget_s = time_budget_s

    def solve(self, inputs: PlanningInputs) -> KnobPlan:
        started = time.perf_counter()
        started_cpu = time.process_time()
        kept = in_force_layouts(inputs)[0]
        hours: list[dict[str, common_pb2.MigLayout]] = [{m.gpu_uuid: m for m in h} for h in kept]
        in_force = hours[0] if hours else {}
        lines: list[str] = []
        kept_hours = solved_hours = 0
        planned_pools = 0
        worst_gap = 0.0
        n_gpus = 0
        for pi, pool in enumerate(inputs.fleet.pools):
            setup = setup_pool(inputs, pool, pi, self.headroom, in_force)
            if setup is None:
                continue
            planned_pools += 1
            n_gpus += sum(len(g.uuids) for g in setup.groups)
            fc = inputs.load.get(pool.name)
            ci = inputs.ci.get(pool.region)
            base_ci = (sum(ci.mean) / len(ci.mean)) if ci and ci.mean else 0.0
            states = [list(g.states) for g in setup.groups]
            previous_graph = None
            previous: Solution | None = None
            last: tuple[float, float, float] | None = None  # (load, CI, capacity) of the last hour solved
            for h in range(inputs.horizon_hours):
                load = (fc.upper[h] if self.load_bound == "upper" else fc.mean[h]) if fc else 0.0
                load_mig = max(0.0, load - setup.fixed_capacity_rps)
                ci_h = ci.mean[h] if ci else 0.0
                if h > 0 and last is not None and self._keep(last, load_mig, ci_h, started):
                    kept_hours += 1
                    hours[h].update({uuid: hours[h - 1][uuid] for g in setup.groups for uuid in g.uuids})
                    continue
                problem = problem_for(setup, states, load_mig, ci_h, base_ci or ci_h or 1.0, inputs.params.pue,
                                      inputs.carbon_weight_fraction, headroom=self.headroom,
                                      max_accuracy_loss=self.max_loss, change_s=self.change_s, max_ged=self.max_ged,
                                      previous_graph=previous_graph)
                solution = solve_exact(problem, gap_rel=self.gap_rel, time_limit_s=self.time_limit_s)
                worst_gap = max(worst_gap, solution.mip_gap or 0.0)
                layouts, new_states = to_layouts(setup, problem, solution)
                hours[h].update(layouts)
                if h == 0 or solution.restarts or problem.notes:
                    lines.append(explain_line(pool.name, h, problem, solution, previous))
                lines.extend(problem.notes)
                states = new_states
                previous_graph = graph_of(problem, solution)
                previous = solution
                solved_hours += 1
                capacity = sum(problem.headroom * problem.options[k].capacity_requests_per_s * n
                               for k, n in previous_graph.items())
                last = (load_mig, ci_h, capacity)
        per_interval = [[m for _, m in sorted(hour.items(), key=lambda kv: order_key(inputs, kv[0]))] for hour in hours]
        took = time.perf_counter() - started
        if not planned_pools:
            return KnobPlan(per_interval, detail="MIG layouts kept: no pool has MIG-capable GPUs assigned",
                            status="kept")
        detail = (f"CLOVER objective (lambda {inputs.carbon_weight_fraction:g}) solved exactly (HiGHS MILP) for "
                  f"{planned_pools} pool(s), {n_gpus} GPU(s) over {inputs.horizon_hours} h in {took:.2f} s "
                  f"({time.process_time() - started_cpu:.2f} s CPU): "
                  f"{solved_hours} pool-hour(s) solved"
                  + (f" (worst MIP gap {worst_gap:.2%})" if worst_gap > 0 else " (each proven optimal)")
                  + (f", {kept_hours} kept the previous hour's configuration (CI and load within "
                     f"{self.resolve_change:.0%} of the last solve, CLOVER's re-optimisation trigger, or the "
                     f"{self.time_budget_s:g} s budget spent)" if kept_hours else ""))
        return KnobPlan(per_interval, explanation=lines, detail=detail)


    def _keep(self, last: tuple[float, float, float], load: float, ci: float, started: float) -> bool:
        """Keep the previous hour's configuration: the SLA still holds with it and either CI and load moved less
        than ``resolve_change_fraction`` since the last solve, or the time budget is spent."""
        last_load, last_ci, capacity = last
        if load > capacity + 1e-9:
            return False
        if time.perf_counter() - started > self.time_budget_s:
            return True

        def moved(new: float, old: float) -> bool:
            return abs(new - old) > self.resolve_change * max(abs(old), 1e-9)

        return not (moved(ci, last_ci) or moved(load, last_load))


def order_key(inputs: PlanningInputs, uuid: str) -> int:
    for i, g in enumerate(inputs.fleet.gpus):
        if g.uuid == uuid:
            return i
    return len(inputs.fleet.gpus)


def explain_line(pool: str, hour: int, problem: Problem, solution: Solution, previous: Solution | None) -> str:
    parts = []
    for gi, group in enumerate(problem.groups):
        used = sorted(((p, n) for (g, p), n in solution.counts.items() if g == gi), key=lambda t: -t[1])
        parts.append(f"{len(group.uuids)} {group.gpu_model}: " + ", ".join(f"{n}x {p.label()}" for p, n in used))
    if hour == 0:
        for group in problem.groups:
            was = Counter(mp.make_pattern(group.gpu_model, (), [(pl.profile, v) for pl, v in st]).label()
                          for st in group.states)
            parts.append("was " + ", ".join(f"{n}x {label}" for label, n in was.most_common()))
    sources = sorted({o.source for o in problem.options.values()})
    change = (f"; {solution.restarts} engine(s) restarted, change cost {solution.change_g:.1f} g"
              if solution.restarts else "; no engine restarted")
    return (f"pool {pool}, hour {hour}: {'; '.join(parts)}; CI {problem.ci_g_per_kwh:.0f} g/kWh, load "
            f"{solution.served_rps:.2f} req/s: carbon {solution.d_carbon:+.1f} % vs BASE, accuracy "
            f"{solution.d_accuracy:+.2f} % (objective {solution.f:.2f}, lambda {problem.weight:g}){change}; "
            f"{solution.status}; capacities {', '.join(sources)}")
