"""`greenserve bench cache-plan`: the GreenCache ILP's solve time and optimality.

Two instances with the shape of real ones (attainment rising with cache size and falling with load, carbon the
energy at the hour's CI plus the storage's embodied carbon), seeded for reproducibility:

* the paper's decision: 24 h x 17 sizes x 1 pool (GreenCache: 7.03 s per decision), median of ``--repeat`` solves;
* a fleet week: 168 h x 64 sizes x 16 pools (``--fleet-limit-tb`` couples the pools by a storage limit).

The last line is one JSON object: ``small_solve_s`` (median), ``large_solve_s`` (and its CPU time), each instance's
status and gap, the 1-minute load average. ``--backend`` picks HiGHS through highspy (default) or the same model
through PuLP; ``--restart-g`` charges resizes as a DRAM pool's restarts are charged.
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
import sys
import time
from typing import TYPE_CHECKING

import numpy as np
from greenserve.common.cli_parser import Parser
from greenserve.common.strict_json import dumps
from greenserve.optimizer.solvers.cache_greencache import PoolCacheModel, solve_ilp
from greenserve.optimizer.solvers.cache_ilp import BACKENDS

if TYPE_CHECKING:
    from greenserve.optimizer.replay_trace import ReplayTrace

TB = 10**12


def synthetic_models(pools: int, hours: int, sizes: int, seed: int = 0, restart_g: float = 0.0) -> list[PoolCacheModel]:
    """Seeded instances; ``restart_g`` > 0 charges every resize that much times the size left (in TB), as a DRAM
    pool's restart charge, with size 0 in force before hour 0."""
    rng = np.random.default_rng(seed)
    models = []
    size_list = [int(k * 16 * TB / (sizes - 1)) for k in range(sizes)]
    frac = np.linspace(0.0, 1.0, sizes)
    for p in range(pools):
        load = 2.0 + 1.5 * np.sin(2 * np.pi * (np.arange(hours) + rng.uniform(0, 24)) / 24) + rng.uniform(0, 0.5, hours)
        ci = 150 + 100 * np.sin(2 * np.pi * (np.arange(hours) + 6) / 24) + rng.uniform(-20, 20, hours)
        carbon_rows, ttft_rows, tpot_rows = [], [], []
        for t in range(hours):
            pressure = load[t] / 4.0
            ttft = np.clip(0.99 - 0.4 * pressure * (1 - frac) ** 2 + rng.uniform(-0.01, 0.01, sizes), 0, 1)
            tpot = np.clip(0.995 - 0.2 * pressure * (1 - frac) + rng.uniform(-0.01, 0.01, sizes), 0, 1)
            energy_kwh = 1.2 * (1 + load[t]) * (1 - 0.25 * frac * pressure)
            storage_g = np.array(size_list) / TB * 3600 / (5 * 365 * 86400) * 30000
            carbon_rows.append(list(energy_kwh * ci[t] + storage_g))
            ttft_rows.append(list(ttft))
            tpot_rows.append(list(tpot))
        model = PoolCacheModel(f"pool{p}", "disk", size_list, list(load * 3600), carbon_rows, ttft_rows, tpot_rows,
                               0.9, "synthetic", list(ci))
        if restart_g > 0:
            model.restart_g = [[restart_g * z / TB for z in size_list] for _ in range(hours)]
            model.in_force_index = 0
        models.append(model)
    return models


def recorded_trace(shape: str, rate: float, seconds: float = 1800.0) -> ReplayTrace | None:
    """A recorded window of ``shape`` at ``rate`` requests/s as the router would have reported it
    (``replay_trace.router_accesses``), turned into a replay trace: ``multi-turn`` (GreenCache's conversations) or
    ``independent`` (Poisson arrivals, no shared prefixes)."""
    from greenserve.optimizer.replay_trace import build_trace, router_accesses
    from greenserve.simulator.workloads import multi_turn_workload, poisson_workload

    if shape == "multi-turn":
        wl = multi_turn_workload(int(rate / 4 * seconds), rate / 4, seed=11)
    else:
        wl = poisson_workload(int(rate * seconds), rate, seed=11)
    wl = wl.head(sum(1 for t in wl.arrival_s if t < seconds))
    start = 1_700_000_000.0
    return build_trace("chat", "yesterday", f"a recorded {shape} window (bench)", start,
                       router_accesses(wl, "chat", start), mean_output_tokens=250.0, output_source="the bench")


def kareto_figures(rate: float, with_grid: bool, history: str = "none", media: tuple[str, ...] = ()) -> dict:
    """The Kareto solver on one Llama-3 8B / A100-80GB pool (DRAM 0-64 GiB in 8 GiB steps x disk 0-512 GiB in
    32 GiB steps, FR CI 60 g/kWh) at ``rate`` requests/s: time, replays, choice; with ``with_grid`` also every grid
    point replayed and the hypervolume of the adaptive Pareto set over the grid's (Kareto Sec. 5.3.1). ``history``
    other than ``none``: the points replay a recorded window of that shape (``recorded_trace``) instead of the
    synthetic multi-turn shape. ``media``: the pool declares a disk of each (``Pool.disk_tiers``, each up to 512 GiB),
    so that the medium is searched too."""
    from greenserve.common.carbon_params import load_default_params
    from greenserve.optimizer.planning import PlanningInputs, SeriesForecast
    from greenserve.optimizer.solvers.cache_kareto import KaretoSearch
    from greenserve.optimizer.solvers.cache_pareto import (
        hypervolume,
        pareto_filter,
        reference_point,
    )
    from greenserve.v1 import common_pb2

    gib = 1 << 30
    pool = common_pb2.Pool(name="chat", model="meta-llama/Meta-Llama-3-8B-Instruct", region="FR",
                           slo=common_pb2.Slo(ttft_s=1.0, tpot_s=0.1, attainment_fraction=0.9),
                           engines=[common_pb2.Engine(id="e1", hardware="A100-80GB")],
                           max_cache_dram_bytes=64 * gib, max_cache_disk_bytes=512 * gib, cache_step_bytes=8 * gib,
                           disk_tiers=[common_pb2.CacheDiskTier(medium=m, path=f"/var/cache/lmcache-{m}")
                                       for m in media])
    flat = SeriesForecast((rate,), (rate,), (rate,))
    inputs = PlanningInputs(0.0, 1, common_pb2.FleetInventory(pools=[pool]), {"FR": SeriesForecast((60.0,), (60.0,),
                            (60.0,))}, {"chat": flat}, {}, load_default_params(), {})
    if history != "none":
        trace = recorded_trace(history, rate)
        if trace is not None:  # too few requests: no recorded window, as the solver reads a missing one
            inputs.traffic["chat"] = trace
    solver = KaretoSearch(time_limit_s=3600.0, max_evaluations=10_000)
    t0 = time.perf_counter()
    search = solver.search_pool(inputs, pool, time.perf_counter() + 3600.0)
    search_s = time.perf_counter() - t0
    assert search is not None
    out = {"rate_per_s": rate, "search_s": search_s, "evaluations": len(search.points), "rounds": search.rounds,
           "grid_points": search.grid_points, "pareto_points": len(search.pareto),
           "chosen_dram_bytes": int(search.chosen.x), "chosen_disk_bytes": int(search.chosen.y),
           "chosen_g_per_h": search.chosen.cost, "meets_slo": search.meets_slo, "traffic": search.traffic,
           "media": list(media), "chosen_disk_medium": search.chosen.tag,
           "evaluations_per_medium": {m: sum(1 for p in search.points if p.tag == m) for m in media}}
    if with_grid:
        # Every grid point through the same scoring (replays already made are reused from the cache).
        t0 = time.perf_counter()
        grid = solver.search_pool(inputs, pool, time.perf_counter() + 3600.0, full_grid=True)
        assert grid is not None
        ref = reference_point(grid.points + search.points)
        out.update({"grid_evaluations": len(grid.points), "grid_extra_s": time.perf_counter() - t0,
                    "hypervolume_ratio": hypervolume(search.pareto, ref) / max(hypervolume(
                        pareto_filter(grid.points), ref), 1e-300)})
    return out


def main(argv: list[str] | None = None, prog: str = "greenserve bench cache-plan") -> int:
    parser = Parser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="solves of the small instance (median reported)")
    parser.add_argument("--large-pools", type=int, default=16)
    parser.add_argument("--large-hours", type=int, default=168)
    parser.add_argument("--large-sizes", type=int, default=64)
    parser.add_argument("--fleet-limit-tb", type=float, default=0.0,
                        help="couple the large instance's pools by a fleet storage limit (TB; 0: none)")
    parser.add_argument("--backend", choices=BACKENDS, default="highs",
                        help="highs: the arrays handed to highspy; pulp-highs / pulp-cbc: the same model through PuLP")
    parser.add_argument("--restart-g", type=float, default=0.0,
                        help="charge each resize this many g per TB of the size left (a DRAM pool's restart charge)")
    parser.add_argument("--kareto-rate", type=float, default=0.0,
                        help="also time the Kareto solver on one pool at this many requests/s per engine (0: skip)")
    parser.add_argument("--kareto-grid", action="store_true",
                        help="with --kareto-rate: also replay the full grid and report the hypervolume ratio")
    parser.add_argument("--kareto-history", choices=("none", "multi-turn", "independent"), default="none",
                        help="with --kareto-rate: score the points on a recorded window of this shape (as the "
                        "router reports it) instead of the synthetic multi-turn shape")
    parser.add_argument("--kareto-media", default="",
                        help="with --kareto-rate: comma-separated disk media the pool declares (nvme, sata-ssd, hdd), "
                        "searched as a categorical axis; empty: the profile's disk, not searched")
    parser.add_argument("--json", action="store_true", help="accepted for symmetry; the last line is always JSON")
    ns = parser.parse_args(argv)
    from greenserve.common.carbon_params import DISK_MEDIA

    media = tuple(m for m in ns.kareto_media.split(",") if m)
    if any(m not in DISK_MEDIA for m in media) or len(set(media)) != len(media):
        parser.error(f"--kareto-media: distinct media among {', '.join(DISK_MEDIA)}")
    if ns.restart_g < 0 or not math.isfinite(ns.restart_g):
        parser.error("--restart-g must be a finite number >= 0")
    if ns.fleet_limit_tb < 0 or not math.isfinite(ns.fleet_limit_tb):  # before any solve, not after the small one
        parser.error("--fleet-limit-tb must be a finite number >= 0")
    if ns.kareto_rate < 0 or not math.isfinite(ns.kareto_rate):
        parser.error("--kareto-rate must be a finite number >= 0")
    if ns.repeat < 1 or min(ns.large_pools, ns.large_hours, ns.large_sizes) < 1 or ns.large_sizes < 2:
        parser.error("--repeat, --large-pools and --large-hours must be >= 1, --large-sizes >= 2")
    small = synthetic_models(1, 24, 17, restart_g=ns.restart_g)
    times, status, gap = [], "", 0.0
    for _ in range(ns.repeat):
        t0 = time.perf_counter()
        _, status, _, gap = solve_ilp(small, backend=ns.backend)
        times.append(time.perf_counter() - t0)
    print(f"small: 24 h x 17 sizes x 1 pool: median {statistics.median(times):.3f} s ({status}, gap {gap})",
          file=sys.stderr)
    large = synthetic_models(ns.large_pools, ns.large_hours, ns.large_sizes, seed=1, restart_g=ns.restart_g)
    limit = int(ns.fleet_limit_tb * TB)
    t0, c0 = time.perf_counter(), time.process_time()
    large_picks, large_status, _, large_gap = solve_ilp(large, fleet_limit_bytes=limit, time_limit_s=60.0,
                                                        backend=ns.backend)
    large_s, large_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    resizes = sum(sum(1 for a, b in itertools.pairwise(p) if a != b) for p in large_picks.values())
    print(f"large: {ns.large_hours} h x {ns.large_sizes} sizes x {ns.large_pools} pools: {large_s:.2f} s "
          f"({large_cpu_s:.2f} s CPU, {large_status}, gap {large_gap}, {resizes} resizes)", file=sys.stderr)
    kareto = kareto_figures(ns.kareto_rate, ns.kareto_grid, ns.kareto_history, media) if ns.kareto_rate > 0 else None
    if kareto:
        print(f"kareto: {kareto['evaluations']} replays of {kareto['grid_points']} grid points in "
              f"{kareto['search_s']:.2f} s", file=sys.stderr)
    print(dumps({"kareto": kareto, "small_solve_s": statistics.median(times), "small_solve_s_all": times, "small_status": status,
                 "small_gap": gap, "large_solve_s": large_s, "large_cpu_s": large_cpu_s, "large_resizes": resizes, "large_status": large_status, "large_gap": large_gap,
                 "large_shape": [ns.large_hours, ns.large_sizes, ns.large_pools],
                 "fleet_limit_tb": ns.fleet_limit_tb, "backend": ns.backend, "restart_g": ns.restart_g,
                 "load_average_1m": os.getloadavg()[0]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
