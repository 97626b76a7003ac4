"""The GreenCache ILP as arrays: one builder, two ways to solve it (HiGHS through highspy, or PuLP).

``build`` turns pool models (``cache_greencache.PoolCacheModel``) and the sizes each hour may take into a MILP in
column/row form (numpy arrays and a sparse constraint matrix):

* a binary ``x[p, t, k]`` per pool, hour and allowed size, costing the size's carbon in that hour;
* ``sum_k x[p, t, k] = 1`` per pool and hour;
* the TTFT and TPOT attainment over the horizon (Eq. 6's global rho), when asked;
* the fleet's storage limit per hour, when set;
* the restart charge of an L1 (DRAM) resize (``restart_g``): a continuous ``u[p, t, k] >= x[p, t-1, k] -
  x[p, t, k]`` costing ``restart_g[t][k]`` (leaving size ``k`` at the start of hour ``t`` loses what L1 held), and
  for hour 0 the charge of leaving the size in force added to every other size's cost.

``solve_highs`` hands the arrays to HiGHS in one call (no expression building: on the 168 h x 64 sizes x 16 pools
bench PuLP's model building was about half of each pool's solve); ``solve_pulp`` builds the same model with PuLP and
solves it with PuLP's HiGHS or CBC, for cross-checks and for users who want PuLP's solvers. Both prove optimality
(relative gap 0). HiGHS runs with its presolve and its feasibility-jump heuristic off (``solve_highs``: measured
four times less CPU on this model), after the LP relaxation, which is the answer when it is integral.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import highspy
import numpy as np
import pulp
from scipy import sparse

if TYPE_CHECKING:
    from greenserve.optimizer.solvers.cache_greencache import PoolCacheModel

BACKENDS = ("highs", "pulp-highs", "pulp-cbc")
INTEGRAL_TOLERANCE = 1e-9  # an LP value this close to 0 or 1 counts as integral (HiGHS's own MIP tolerance: 1e-6)


@dataclass
class IlpArrays:
    """min cost @ v  s.t.  row_lower <= A @ v <= row_upper, 0 <= v <= 1, v[integer] binary."""

    cost: np.ndarray
    integer: np.ndarray  # bool per column
    matrix: sparse.csr_matrix
    row_lower: np.ndarray
    row_upper: np.ndarray
    x_pool: np.ndarray  # per binary column x (the first len(x_pool) columns): pool index, hour, size index
    x_hour: np.ndarray
    x_size: np.ndarray


def _in_force_cost(m: PoolCacheModel, ks: np.ndarray) -> np.ndarray:
    """Hour 0's charge for each size in ``ks``: leaving the size in force costs ``in_force_restart_g``."""
    if m.restart_g is None or m.in_force_index is None:
        return np.zeros(len(ks))
    return np.where(ks == m.in_force_index, 0.0, m.in_force_restart_g)


def build(models: list[PoolCacheModel], options: list[list[list[int]]], *, global_slo: bool,
          fleet_limit_bytes: int) -> IlpArrays:
    xp, xt, xk, xc = [], [], [], []
    for p, m in enumerate(models):
        hours = len(m.requests)
        counts = [len(options[p][t]) for t in range(hours)]
        ks = np.concatenate([np.asarray(options[p][t], dtype=np.int64) for t in range(hours)])
        ts = np.repeat(np.arange(hours), counts)
        cost = np.asarray(m.carbon_g, dtype=np.float64)[ts, ks]
        if m.restart_g is not None:
            restart = np.asarray(m.restart_g, dtype=np.float64)
            first = ts == 0
            cost[first] += _in_force_cost(m, ks[first])
            # Leaving k after hour t-1 when hour t cannot take k at all: the charge sits on x[t-1, k] itself.
            for t in range(1, hours):
                nxt = set(options[p][t])
                sel = np.flatnonzero(ts == t - 1)
                for i in sel:
                    if int(ks[i]) not in nxt:
                        cost[i] += restart[t, ks[i]]
        xp.append(np.full(len(ks), p))
        xt.append(ts)
        xk.append(ks)
        xc.append(cost)
    x_pool = np.concatenate(xp) if xp else np.zeros(0, dtype=np.int64)
    x_hour = np.concatenate(xt) if xt else np.zeros(0, dtype=np.int64)
    x_size = np.concatenate(xk) if xk else np.zeros(0, dtype=np.int64)
    costs = [np.concatenate(xc) if xc else np.zeros(0)]
    n_x = len(x_pool)
    col_of = {}  # (p, t, k) -> column, for the rows that need lookups
    rows_i: list[np.ndarray] = []
    rows_j: list[np.ndarray] = []
    rows_v: list[np.ndarray] = []
    lower: list[float] = []
    upper: list[float] = []
    row = 0
    n_cols = n_x
    offset = 0
    for p, m in enumerate(models):
        hours = len(m.requests)
        span = slice(offset, offset + sum(len(options[p][t]) for t in range(hours)))
        cols = np.arange(span.start, span.stop)
        ts, ks = x_hour[span], x_size[span]
        offset = span.stop
        # one size per hour
        rows_i.append(row + ts)
        rows_j.append(cols)
        rows_v.append(np.ones(len(cols)))
        lower += [1.0] * hours
        upper += [1.0] * hours
        row += hours
        total = float(sum(m.requests))
        if global_slo and total > 0:
            n = np.asarray(m.requests, dtype=np.float64)[ts]
            for att in (m.ttft, m.tpot):
                rows_i.append(np.full(len(cols), row))
                rows_j.append(cols)
                rows_v.append(n * np.asarray(att, dtype=np.float64)[ts, ks])
                lower.append(m.rho * total)
                upper.append(math.inf)
                row += 1
        if m.restart_g is not None and hours > 1:
            # u >= x[t-1, k] - x[t, k]  <=>  u - x[t-1, k] + x[t, k] >= 0, one continuous u per x[t-1, k] whose
            # size hour t may also take and whose leaving is charged (else charged on x[t-1, k] directly, above,
            # or free); in column order (hour, then the hour's sizes), built as arrays (a Python loop per row was
            # a fifth of the 168 h x 64 sizes x 16 pools bench's CPU).
            restart = np.asarray(m.restart_g, dtype=np.float64)
            n_sizes = restart.shape[1]
            col_at = np.full(hours * n_sizes, -1, dtype=np.int64)
            col_at[ts * n_sizes + ks] = cols
            prev = np.flatnonzero(ts < hours - 1)
            nxt = col_at[(ts[prev] + 1) * n_sizes + ks[prev]]
            charge = restart[ts[prev] + 1, ks[prev]]
            keep = (nxt >= 0) & (charge > 0)
            prev_cols, nxt, charge = cols[prev[keep]], nxt[keep], charge[keep]
            n_u = len(prev_cols)
            if n_u:
                u = n_cols + np.arange(n_u)
                n_cols += n_u
                costs.append(charge)
                rows_i.append(np.repeat(row + np.arange(n_u), 3))
                rows_j.append(np.column_stack([u, prev_cols, nxt]).ravel())
                rows_v.append(np.tile([1.0, -1.0, 1.0], n_u))
                lower += [0.0] * n_u
                upper += [math.inf] * n_u
                row += n_u
        col_of[p] = cols
    if fleet_limit_bytes > 0 and models:
        sizes = np.concatenate([np.asarray(m.sizes, dtype=np.float64)[x_size[col_of[p]]]
                                for p, m in enumerate(models)])
        rows_i.append(row + x_hour)
        rows_j.append(np.arange(n_x))
        rows_v.append(sizes)
        hours = len(models[0].requests)
        lower += [-math.inf] * hours
        upper += [float(fleet_limit_bytes)] * hours
        row += hours
    matrix = sparse.csr_matrix((np.concatenate(rows_v), (np.concatenate(rows_i), np.concatenate(rows_j))),
                               shape=(row, n_cols)) if rows_v else sparse.csr_matrix((0, n_cols))
    integer = np.zeros(n_cols, dtype=bool)
    integer[:n_x] = True
    return IlpArrays(np.concatenate(costs), integer, matrix, np.asarray(lower), np.asarray(upper),
                     x_pool, x_hour, x_size)


def _picks(arrays: IlpArrays, values: np.ndarray, models: list[PoolCacheModel]) -> dict[str, list[int]]:
    """Size index per pool and hour: the x column at 1 in each (pool, hour)."""
    x = values[:len(arrays.x_pool)]
    out = {m.pool: [0] * len(m.requests) for m in models}
    best = {}
    for i in np.flatnonzero(x > 0.5):
        best[(int(arrays.x_pool[i]), int(arrays.x_hour[i]))] = int(arrays.x_size[i])
    for (p, t), k in best.items():
        out[models[p].pool][t] = k
    return out


def solve_highs(arrays: IlpArrays, models: list[PoolCacheModel], *, time_limit_s: float
                ) -> tuple[dict[str, list[int]], str, float, float]:
    """(picks, status, objective, MIP gap) with HiGHS (highspy), proven optimal (mip_rel_gap 0)."""
    inf = highspy.kHighsInf
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("time_limit", float(time_limit_s))
    # HiGHS's presolve spent ~1 s per pool of the 168 h x 64 sizes bench reducing columns whose LP relaxation is
    # integral or nearly so at the root anyway: without it the 16 pools took 2.6 s of CPU instead of 7.3 s, same
    # proven optima. Optimality does not depend on it.
    h.setOptionValue("presolve", "off")
    # The feasibility-jump heuristic found the first incumbent in ~0.3 s per pool that the root LP then matched:
    # without it the 16 pools took 1.6 s of CPU instead of 2.7 s, same optima.
    h.setOptionValue("mip_heuristic_run_feasibility_jump", False)
    n = len(arrays.cost)
    empty_i = np.zeros(0, dtype=np.int32)
    h.addCols(n, arrays.cost, np.zeros(n), np.ones(n), 0, empty_i, empty_i, np.zeros(0))
    a = arrays.matrix
    h.addRows(a.shape[0], np.where(np.isinf(arrays.row_lower), -inf, arrays.row_lower),
              np.where(np.isinf(arrays.row_upper), inf, arrays.row_upper), a.nnz,
              a.indptr.astype(np.int32), a.indices.astype(np.int32), a.data.astype(np.float64))
    ints = np.flatnonzero(arrays.integer).astype(np.int32)
    # The LP relaxation first: when its optimum is integral it is the MIP's optimum, proven (the relaxation's
    # bound is attained by a feasible integer point: gap 0), and the MIP machinery (symmetry and clique detection,
    # two threads that a loaded host descheduled) is skipped. On the 168 h x 64 sizes x 16 pools bench with
    # restart charges every pool's relaxation was integral: 1.7 s of CPU instead of 4.4 s, 2.9 s wall instead of
    # 15.8 s (load 6), same optima. A fractional one goes on to the MIP.
    started = time.perf_counter()
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return {}, "Infeasible", math.nan, math.nan
    if status == highspy.HighsModelStatus.kOptimal and len(ints):
        x = np.asarray(h.getSolution().col_value)[ints]
        if np.all(np.minimum(np.abs(x), np.abs(1.0 - x)) <= INTEGRAL_TOLERANCE):
            values = np.asarray(h.getSolution().col_value)
            return _picks(arrays, values, models), "Optimal", float(h.getInfo().objective_function_value), 0.0
    if len(ints):
        h.setOptionValue("time_limit", max(float(time_limit_s) - (time.perf_counter() - started), 1e-3))
        h.changeColsIntegrality(len(ints), ints, np.full(len(ints), highspy.HighsVarType.kInteger))
        h.run()
        status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kOptimal:
        info = h.getInfo()
        values = np.asarray(h.getSolution().col_value)
        gap = float(info.mip_gap) if math.isfinite(info.mip_gap) else 0.0
        return _picks(arrays, values, models), "Optimal", float(info.objective_function_value), max(0.0, gap)
    if status == highspy.HighsModelStatus.kInfeasible:
        return {}, "Infeasible", math.nan, math.nan
    return {}, "Not Solved" if status != highspy.HighsModelStatus.kTimeLimit else "Time Limit", math.nan, math.nan


def solve_pulp(arrays: IlpArrays, models: list[PoolCacheModel], *, time_limit_s: float, solver: str = "highs"
               ) -> tuple[dict[str, list[int]], str, float, float]:
    """The same arrays through PuLP (``solver``: ``highs`` or ``cbc``), gap 0."""
    prob = pulp.LpProblem("greencache", pulp.LpMinimize)
    v = [prob.add_variable(f"v{i}", lowBound=0, upBound=1, cat=pulp.LpBinary if arrays.integer[i]
                           else pulp.LpContinuous) for i in range(len(arrays.cost))]
    a = arrays.matrix
    for r in range(a.shape[0]):
        lo, hi = a.indptr[r], a.indptr[r + 1]
        expr = pulp.LpAffineExpression([(v[j], float(c)) for j, c in zip(a.indices[lo:hi], a.data[lo:hi])])
        low, up = float(arrays.row_lower[r]), float(arrays.row_upper[r])
        if low == up:
            prob += expr == low, f"r{r}"
        else:
            if math.isfinite(low):
                prob += expr >= low, f"r{r}_lo"
            if math.isfinite(up):
                prob += expr <= up, f"r{r}_hi"
    prob += pulp.LpAffineExpression([(v[i], float(c)) for i, c in enumerate(arrays.cost)])
    if solver == "cbc":
        engine = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, gapRel=0.0)
    else:
        engine = pulp.HiGHS(msg=False, timeLimit=time_limit_s, gapRel=0.0)
    prob.solve(engine)
    status = pulp.LpStatus[prob.status]
    if status != "Optimal":
        return {}, status, math.nan, math.nan
    values = np.array([x.value() or 0.0 for x in v])
    return _picks(arrays, values, models), status, float(pulp.value(prob.objective) or 0.0), 0.0
