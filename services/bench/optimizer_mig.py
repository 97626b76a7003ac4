"""`greenserve bench mig-plan`: the exact variants-on-MIG solver (``solvers/mig_variants.py``, its MILP in
``mig_milp.py``) against CLOVER's simulated annealing and random search (BLOVER) on the same instances.

Instance (CLOVER Sec. 5.1's setting, with an LLM): one pool serving the Llama-3.1 8B Instruct variants of the
catalogue (BF16 and GPTQ 4-bit, published quality) on A100-40GB GPUs (7 slices each: 10 GPUs = 70 slices), the
capability of every variant on every slice from the simulator (scaled from its closest profile where it has none),
load = 90 % of BASE's SLO capacity (BASE: BF16 on every GPU whole; CLOVER sets the load so that there is "neither
resource starvation nor idle GPUs"), CI of the hour ``--ci`` against the baseline ``--base-ci``, lambda
``--weight``. No configuration is in force and the change cost is 0 by default (``--change-s``): the three
methods optimise CLOVER's objective alone; no accuracy cap.

* ``small``: ``--gpus`` GPUs (10); the exact solver proves the optimum (MIP gap 0); ``solve_s`` is the MILP's wall
  time (model build + HiGHS; ``solve_cpu_s`` its CPU time, the honest figure on a loaded machine), the capability
  predictions are timed apart (``predict_s``, cached after the first).
* ``large``: ``--large-gpus`` GPUs (1,000) with ``--gap`` (1 %): the solution, HiGHS's dual bound and gap.
  ``objective`` is what the MILP maximises (f minus change costs and the 1e-4-per-change tie-break) and
  ``objective_bound`` HiGHS's bound on it; ``f`` is CLOVER's Eq. 3 of the configuration.
* ``sa`` / ``random``: CLOVER's SA (T = 1, cooling ``--cooling``, GED <= 4 neighbours, stop after 5 evaluations
  without a better configuration) over ``--seeds`` seeds, and random search with the same number of evaluations
  as SA used on each seed; the gap is ``f* - f`` in objective points (percent) and relative to ``|f*|``.
  ``random_wide``: random search with ``--random-budget`` evaluations (3 seeds) on the small instance.
* ``small_light``: the small instance at ``--light-load-fraction`` (50 %) of BASE's capacity, where random
  configurations can meet the SLA, with the same three methods.

Progress goes to stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from typing import Any

from greenserve.common import strict_json
from greenserve.common.cli_parser import Parser
from greenserve.optimizer.solvers import mig_patterns as mp
from greenserve.optimizer.solvers import mig_milp, mig_problem, mig_setup
from greenserve.bench import mig_search
from greenserve.v1 import common_pb2

GPU_MODEL = "A100-40GB"
FAMILY = "llama3.1-8b-instruct"


def _pool() -> common_pb2.Pool:
    pool = common_pb2.Pool(name="chat", model="meta-llama/Meta-Llama-3.1-8B-Instruct", region="CISO",
                           slo=common_pb2.Slo(ttft_s=2.0, tpot_s=0.1, attainment_fraction=0.9),
                           mean_prompt_tokens=1024, mean_output_tokens=256)
    pool.variants.extend(v.to_proto() for v in mp.family(FAMILY))
    return pool


def _setup(n: int) -> mig_setup.PoolSetup:
    pool = _pool()
    members = [(f"GPU-{i:05d}", GPU_MODEL, ()) for i in range(n)]
    return mig_setup.make_setup(pool, members, lambda m, p, v: mp.predicted_option(
        pool, m, p, v, v.simulator_model if v is not None else None, "bench"))


def _problem(setup: mig_setup.PoolSetup, ns: argparse.Namespace) -> mig_problem.Problem:
    best = mp.family(FAMILY)[0].name
    whole = max((p for c in mp.layout_classes(GPU_MODEL) for p in c), key=lambda p: int(p.split("g")[0]))
    per_gpu = ns.headroom * setup.options[(GPU_MODEL, whole, best)].capacity_requests_per_s
    base_cap = per_gpu * len(setup.groups[0].uuids)
    return mig_setup.problem_for(setup, None, ns.load_fraction * base_cap, ns.ci, ns.base_ci, ns.pue, ns.weight,
                                    headroom=ns.headroom, change_s=ns.change_s)


def _searches(problem: mig_problem.Problem, optimum: float, ns: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    sa_runs, rnd_runs = [], []
    for seed in range(ns.seeds):
        t = time.perf_counter()
        sa = mig_search.anneal(problem, seed=seed, cooling=ns.cooling)
        sa_s = time.perf_counter() - t
        t = time.perf_counter()
        rnd = mig_search.random_search(problem, sa.evaluations, seed=seed)
        rnd_s = time.perf_counter() - t
        sa_runs.append((sa, sa_s))
        rnd_runs.append((rnd, rnd_s))
    for name, runs in (("sa", sa_runs), ("random", rnd_runs)):
        gaps = [optimum - r.f for r, _ in runs if r.f is not None]
        out[name] = {
            "runs": len(runs),
            "found_feasible": len(gaps),
            "gap_points_median": statistics.median(gaps) if gaps else None,
            "gap_points_max": max(gaps) if gaps else None,
            "gap_relative_median": statistics.median(gaps) / abs(optimum) if gaps and optimum else None,
            "reached_optimum": sum(1 for g in gaps if g <= 1e-6),
            "evaluations_median": statistics.median(r.evaluations for r, _ in runs),
            "feasible_evaluation_share": (sum(r.feasible_evaluations for r, _ in runs)
                                          / max(1, sum(r.evaluations for r, _ in runs))),
            "wall_s_median": statistics.median(s for _, s in runs),
        }
    return out


def run(ns: argparse.Namespace) -> dict[str, Any]:
    t = time.perf_counter()
    setup = _setup(ns.gpus)
    predict_s = time.perf_counter() - t
    print(f"capabilities of {len(setup.options)} (variant, slice) pairs in {predict_s:.1f} s; "
          f"{len(setup.groups[0].patterns)} patterns", file=sys.stderr)
    small = _problem(setup, ns)
    sol = mig_milp.solve_exact(small, gap_rel=0.0)
    print(f"{ns.gpus} GPUs: f* = {sol.f:.3f} ({sol.status}, gap {sol.mip_gap}) in {sol.solve_s:.3f} s", file=sys.stderr)
    searches = _searches(small, sol.f, ns)
    t = time.perf_counter()
    wide = [mig_search.random_search(small, ns.random_budget, seed=seed) for seed in range(3)]
    searches["random_wide"] = {
        "runs": len(wide), "evaluations": ns.random_budget,
        "found_feasible": sum(r.f is not None for r in wide),
        "gap_points": [None if r.f is None else sol.f - r.f for r in wide],
        "feasible_evaluation_share": sum(r.feasible_evaluations for r in wide) / (len(wide) * ns.random_budget),
        "wall_s": (time.perf_counter() - t) / len(wide),
    }
    light = _problem(setup, argparse.Namespace(**{**vars(ns), "load_fraction": ns.light_load_fraction}))
    light_sol = mig_milp.solve_exact(light, gap_rel=0.0)
    light_searches = _searches(light, light_sol.f, ns)
    large_setup = _setup(ns.large_gpus)
    large = _problem(large_setup, ns)
    lsol = mig_milp.solve_exact(large, gap_rel=ns.gap)
    print(f"{ns.large_gpus} GPUs: f = {lsol.f:.3f}, bound {lsol.bound}, gap {lsol.mip_gap} in {lsol.solve_s:.3f} s",
          file=sys.stderr)
    large_searches = _searches(large, lsol.f, argparse.Namespace(**{**vars(ns), "seeds": ns.large_seeds})) \
        if ns.large_seeds else {}

    def describe(problem: mig_problem.Problem, s: mig_problem.Solution) -> dict[str, Any]:
        return {
            "gpus": sum(len(g.uuids) for g in problem.groups),
            "slices": 7 * sum(len(g.uuids) for g in problem.groups),
            "patterns": sum(len(g.patterns) for g in problem.groups),
            "load_requests_per_s": problem.load_rps,
            "status": s.status, "solve_s": s.solve_s, "solve_cpu_s": s.solve_cpu_s, "objective": s.objective,
            "f": s.f, "objective_bound": s.bound,
            "mip_gap": s.mip_gap, "d_carbon_percent": s.d_carbon, "d_accuracy_percent": s.d_accuracy,
            "configuration": {p.label(): n for (_, p), n in sorted(s.counts.items(), key=lambda kv: -kv[1])},
        }

    return {
        "bench": "mig-plan",
        "gpu_model": GPU_MODEL,
        "variants": [v.name for v in mp.family(FAMILY)],
        "weight": ns.weight, "ci_g_per_kwh": ns.ci, "base_ci_g_per_kwh": ns.base_ci,
        "capability_sources": sorted({o.source for o in setup.options.values()}),
        "predict_s": predict_s,
        "small": {**describe(small, sol), **searches},
        "small_light": {**describe(light, light_sol), **light_searches},
        "large": {**describe(large, lsol), **large_searches},
    }


def main(argv: list[str] | None = None, prog: str = "greenserve bench mig-plan") -> int:
    parser = Parser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON line on stdout")
    parser.add_argument("--gpus", type=int, default=10)
    parser.add_argument("--large-gpus", type=int, default=1000)
    parser.add_argument("--gap", type=float, default=0.01, help="relative MIP gap for the large instance")
    parser.add_argument("--weight", type=float, default=0.5, help="CLOVER's lambda")
    parser.add_argument("--ci", type=float, default=350.0)
    parser.add_argument("--base-ci", type=float, default=350.0, help="CLOVER's baseline CI of C_base")
    parser.add_argument("--change-s", type=float, default=0.0,
                        help="drain + start-up + warm-up per engine (0: CLOVER's objective alone)")
    parser.add_argument("--pue", type=float, default=1.5, help="CLOVER evaluates with PUE 1.5")
    parser.add_argument("--headroom", type=float, default=0.9)
    parser.add_argument("--load-fraction", type=float, default=0.9, help="load as a fraction of BASE's capacity")
    parser.add_argument("--light-load-fraction", type=float, default=0.5,
                        help="load of the small_light instance (same GPUs), as a fraction of BASE's capacity")
    parser.add_argument("--cooling", type=float, default=0.05)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--large-seeds", type=int, default=3)
    parser.add_argument("--random-budget", type=int, default=1000,
                        help="evaluations of the wider random search on the small instance (3 seeds)")
    ns = parser.parse_args(argv)
    if ns.gpus < 1 or ns.large_gpus < 1 or not 0 <= ns.weight <= 1 or not 0 < ns.headroom <= 1:
        parser.error("--gpus/--large-gpus >= 1, --weight in [0, 1], --headroom in (0, 1]")
    # The rest before any solve too: NaN or out-of-range numbers gave tracebacks, a hang or meaningless figures.
    ranges = {"gap": (0.0, 1.0, True), "ci": (0.0, 1e4, True), "base_ci": (0.0, 1e4, False), "pue": (1.0, 10.0, True),
              "change_s": (0.0, 3600.0, True), "load_fraction": (0.0, 10.0, False),
              "light_load_fraction": (0.0, 10.0, False), "cooling": (0.0, 1.0, False)}
    for name, (low, high, low_ok) in ranges.items():
        value = getattr(ns, name)
        if not (math.isfinite(value) and (low <= value if low_ok else low < value) and value <= high):
            parser.error(f"--{name.replace('_', '-')} must be in {'[' if low_ok else '('}{low:g}, {high:g}], got {value}")
    for name in ("seeds", "large_seeds", "random_budget"):
        if getattr(ns, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    # HiGHS prints its banner on the process's stdout (C++); keep stdout for the JSON line.
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        result = run(ns)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    if not ns.json:
        s, lg = result["small"], result["large"]
        print(f"{s['gpus']} GPUs ({s['slices']} slices): optimum f* {s['f']:.3f} proven in {s['solve_s']:.3f} s; "
              f"SA median gap {s['sa']['gap_points_median']} pts after {s['sa']['evaluations_median']} evaluations; "
              f"random median gap {s['random']['gap_points_median']} pts")
        print(f"{lg['gpus']} GPUs: objective {lg['objective']:.4f} (f {lg['f']:.3f}), bound {lg['objective_bound']}, "
              f"gap {lg['mip_gap']}, {lg['solve_s']:.3f} s")
    print(strict_json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
