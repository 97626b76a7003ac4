"""The exact solver of one pool-hour (see ``mig_variants`` for the formulation): the MILP built in column/row form
and handed to HiGHS (highspy)."""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict

import highspy
import numpy as np

from greenserve.optimizer.solvers import mig_patterns as mp
from greenserve.optimizer.solvers.mig_problem import (TIE_BREAK, Kind, Problem, Solution, State, flow_coefficients,
                                                     max_servable, score)


class Milp:
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
            starts: list[int] = []
            index: list[int] = []
            value: list[float] = []
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
    model = Milp()
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
    for (_gi, pattern), cols in n_cols.items():
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

