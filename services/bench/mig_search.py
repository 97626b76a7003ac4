"""CLOVER's own searches on the same model as the exact solver, for the bench (``greenserve bench mig-plan``).

* ``anneal``: simulated annealing in the configuration-graph space (CLOVER Sec. 4.2): a configuration is how many
  GPUs take each pattern; a neighbour moves one GPU to a pattern within graph edit distance 4 of its own (one
  instance's variant swapped costs 2, one copy moved to another slice type 2). T = 1, cooled by ``cooling`` per
  evaluation down to 0.1 (Eq. 7 acceptance), stopped after ``patience`` = 5 evaluations without a better
  configuration. The energy is ``-f`` for a configuration that meets the SLA and ``INFEASIBLE + shortfall`` for one
  that does not: CLOVER's Eq. 6 (``-f x min(1, L_tail / L)``) would score a violating configuration *better*
  whenever ``f < 0`` (``clover_energy`` keeps that formula so a test can show it).
* ``random_search``: BLOVER, random configurations in the original space (each GPU a random maximal layout, each
  instance a random fitting variant), the same evaluation.

Both count evaluations (each one a deployment-and-measurement in CLOVER; a model evaluation here).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass

from greenserve.optimizer.solvers import mig_patterns as mp
from greenserve.optimizer.solvers.mig_problem import Problem, evaluate, instances_of, max_servable

INFEASIBLE = 1e6
Config = dict[tuple[int, mp.Pattern], int]


@dataclass
class SearchResult:
    counts: Config
    f: float | None  # None: no SLA-meeting configuration found
    evaluations: int
    feasible_evaluations: int


def clover_energy(f: float, latency_s: float, tail_s: float) -> float:
    """CLOVER's Eq. 6 as printed: h = -f x min(1, L_tail / L). Not used to search (see the module docstring)."""
    return -f * min(1.0, tail_s / latency_s)


def energy(problem: Problem, counts: Config) -> tuple[float, float | None]:
    """(SA energy, f or None) of a configuration: SLA-violating ones always rank below every feasible one."""
    result = evaluate(problem, counts)
    if result is None:
        cap = sum(problem.headroom * problem.options[k].capacity_requests_per_s * n
                  for k, n in instances_of(problem, counts).items())
        shortfall = max(0.0, problem.load_rps - cap) / max(problem.load_rps, 1e-9)
        return INFEASIBLE + shortfall, None
    return -result[0], result[0]


def base_config(problem: Problem) -> Config:
    """BASE: every GPU whole with the best variant that fits (CLOVER's default configuration)."""
    out: Config = {}
    for gi, group in enumerate(problem.groups):
        single = [p for p in group.patterns if len(p.kinds) == 1 and p.kinds[0][1]]
        best = max(single, key=lambda p: problem.options[(group.gpu_model, *p.kinds[0])].quality_fraction) \
            if single else group.patterns[0]
        out[(gi, best)] = len(group.uuids)
    return out


def _neighbours(problem: Problem) -> dict[tuple[int, mp.Pattern], list[mp.Pattern]]:
    out = {}
    for gi, group in enumerate(problem.groups):
        for p in group.patterns:
            out[(gi, p)] = [q for q in group.patterns if q != p and mp.ged(p.counts, q.counts) <= 4]
    return out


def anneal(problem: Problem, *, seed: int = 0, cooling: float = 0.05, patience: int = 5, t0: float = 1.0,
           t_min: float = 0.1, start: Config | None = None, max_evaluations: int = 100_000) -> SearchResult:
    rng = random.Random(seed)
    neigh = _neighbours(problem)
    current = dict(start if start is not None else base_config(problem))
    h, f = energy(problem, current)
    evaluations, feasible = 1, int(f is not None)
    best, best_h, best_f = dict(current), h, f
    temperature = t0
    since_better = 0
    while since_better < patience and evaluations < max_evaluations:
        used = [k for k, n in current.items() if n > 0 and neigh[k]]
        if not used:
            break
        src = rng.choices(used, weights=[current[k] for k in used])[0]
        dst = (src[0], rng.choice(neigh[src]))
        cand = dict(current)
        cand[src] -= 1
        if cand[src] == 0:
            del cand[src]
        cand[dst] = cand.get(dst, 0) + 1
        h2, f2 = energy(problem, cand)
        evaluations += 1
        feasible += int(f2 is not None)
        if h2 <= h or rng.random() < math.exp(-(h2 - h) / temperature):
            current, h = cand, h2
        if h2 < best_h:
            best, best_h, best_f = cand, h2, f2
            since_better = 0
        else:
            since_better += 1
        temperature = max(t_min, temperature - cooling)
    return SearchResult(best, best_f, evaluations, feasible)


def random_search(problem: Problem, evaluations: int, *, seed: int = 0) -> SearchResult:
    rng = random.Random(seed)
    fitting: dict[tuple[str, str], list[str]] = {}
    for model, prof, v in problem.options:
        fitting.setdefault((model, prof), []).append(v)
    best: Config = {}
    best_h, best_f, feasible = math.inf, None, 0
    by_kinds = {(gi, p.profiles, p.kinds): p for gi, g in enumerate(problem.groups) for p in g.patterns}
    for _ in range(evaluations):
        counts: Counter[tuple[int, mp.Pattern]] = Counter()
        for gi, group in enumerate(problem.groups):
            layouts = [(cls, lay) for cls, lays in mp.layout_classes(group.gpu_model).items() for lay in lays]
            for _gpu in group.uuids:
                cls, layout = rng.choice(layouts)
                kinds = [(p.profile, rng.choice(fitting.get((group.gpu_model, p.profile), [mp.NO_VARIANT])))
                         for p in layout]
                counts[(gi, by_kinds[(gi, cls, tuple(sorted(kinds)))])] += 1
        h, f = energy(problem, dict(counts))
        feasible += int(f is not None)
        if h < best_h:
            best, best_h, best_f = dict(counts), h, f
    return SearchResult(best, best_f, evaluations, feasible)


__all__ = ["INFEASIBLE", "SearchResult", "anneal", "base_config", "clover_energy", "energy", "max_servable",
           "random_search"]
