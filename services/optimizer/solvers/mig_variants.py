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
* change cost: each engine a GPU must (re)start to go from its state to the pattern is charged
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
from collections import Counter
from dataclasses import dataclass

from greenserve.optimizer.planning import KnobPlan, PlanningInputs
from greenserve.optimizer.solvers import mig_patterns as mp
from greenserve.optimizer.solvers.keep_current import _mig_layouts as in_force_layouts
from greenserve.optimizer.solvers.mig_milp import solve_exact
from greenserve.optimizer.solvers.mig_problem import DEFAULT_CHANGE_S, Problem, Solution
from greenserve.optimizer.solvers.mig_setup import graph_of, problem_for, setup_pool, to_layouts
from greenserve.v1 import common_pb2


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
                    lines.append(explain_line(pool.name, h, problem, solution, previous, PoolLoad(
                        fc.mean[h] if fc else 0.0, load, self.load_bound, setup.fixed_capacity_rps, base_ci)))
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


@dataclass(frozen=True)
class PoolLoad:
    """What an hour's MIG line says of the pool beside the MIG problem: its load (the forecast's mean, and the bound
    planned for), the load its engines on other GPUs carry first, and the CI BASE is priced at."""

    mean_rps: float
    planned_rps: float
    bound: str  # "upper" or "mean": which of the forecast's figures ``planned_rps`` is
    fixed_capacity_rps: float
    base_ci: float


def explain_line(pool: str, hour: int, problem: Problem, solution: Solution, previous: Solution | None,
                 load: PoolLoad | None = None) -> str:
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
    if load is None:
        served = f"load {solution.served_rps:.2f} req/s"
    else:  # the pool's load first: the MIG GPUs take what its other engines leave (0 when they carry it all)
        served = (f"pool load {load.mean_rps:.2f} req/s (planned for {load.planned_rps:.2f}, the forecast's "
                  f"{load.bound}), {solution.served_rps:.2f} req/s of it on the MIG GPUs"
                  + (f" (the pool's other engines carry up to {load.fixed_capacity_rps:.2f} req/s first)"
                     if load.fixed_capacity_rps > 0 else ""))
    base = (f" at the horizon's mean CI {load.base_ci:.0f} g/kWh" if load is not None else "")
    return (f"pool {pool}, hour {hour}: {'; '.join(parts)}; CI {problem.ci_g_per_kwh:.0f} g/kWh, {served}: "
            f"MIG GPUs {_grams(solution.carbon_g)}/h vs BASE {_grams(problem.base_carbon_g)}/h{base}, carbon "
            f"{solution.d_carbon:+.1f} % vs BASE, accuracy {solution.d_accuracy:+.2f} % (objective "
            f"{solution.f:.2f}, lambda {problem.weight:g}){change}; {solution.status}; capacities "
            f"{', '.join(sources)}")


def _grams(g: float) -> str:
    """Grams to three significant digits (4.47 g, 0.00342 g: never 0.0 g for a small figure)."""
    return f"{g:.0f} g" if abs(g) >= 100 else f"{g:.3g} g"
