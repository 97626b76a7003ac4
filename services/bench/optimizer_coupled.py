"""`greenserve bench coupled`: how long the coupled decision takes for 16 pools x 24 hours.

Each pool has four Llama-3 8B engines on A100-80GB with up to 64 GiB of DRAM cache each, its own region (CI a daily
sine between 50 and 650 g/kWh, a different phase per pool) and its own load (a daily sine peaking between 6 and
14 req/s) with a learned margin; the prefix reuse measured is 0.55. The capacity predictions (the simulator's
replays, one per DRAM size x clock) are made once and cached, as in the optimizer, where every later plan reuses
them: ``cold_s`` is the first solve with them, ``solve_s`` the median of the next ``--repetitions`` solves (model and
MILP, the figure the optimizer adds to every plan) and ``milp_s`` the MILPs alone.

Progress goes to stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import math
import statistics
import sys
import time

from greenserve.common import strict_json
from greenserve.common.carbon_params import load_default_params
from greenserve.common.cli_parser import Parser
from greenserve.optimizer import capacity
from greenserve.optimizer.planning import PlanningInputs, SeriesForecast
from greenserve.optimizer.solvers.coupled import CoupledSolver
from greenserve.v1 import common_pb2

GIB = 1 << 30
SLO = common_pb2.Slo(ttft_s=2.0, tpot_s=0.15, attainment_fraction=0.9)
PROMPT, OUTPUT = 1909, 256
HITS = 0.55


def fleet_and_inputs(pools: int, hours: int) -> PlanningInputs:
    fleet = common_pb2.FleetInventory()
    ci: dict[str, SeriesForecast] = {}
    load: dict[str, SeriesForecast] = {}
    cap = capacity.predict("llama3-8b@A100-80GB", SLO.ttft_s, SLO.tpot_s, SLO.attainment_fraction, PROMPT, OUTPUT,
                           HITS, 0)
    caps = {}
    for p in range(pools):
        region = f"R{p}"
        pool = fleet.pools.add(name=f"pool{p}", model="meta-llama/Meta-Llama-3-8B-Instruct", region=region, slo=SLO,
                               max_cache_dram_bytes=64 * GIB, cache_step_bytes=8 * GIB, mean_prompt_tokens=PROMPT,
                               mean_output_tokens=OUTPUT)
        for e in range(4):
            engine = pool.engines.add(id=f"pool{p}-{e}", url=f"http://sim/{p}/{e}", pool=pool.name,
                                      hardware="A100-80GB", kind=common_pb2.ENGINE_KIND_SIMULATED)
            caps[engine.id] = cap
        phase = 2 * math.pi * p / pools
        series = tuple(350 + 300 * math.sin(2 * math.pi * h / 24 + phase) for h in range(hours))
        ci[region] = SeriesForecast(series, series, series)
        peak = 6.0 + 8.0 * p / max(pools - 1, 1)
        mean = tuple(peak * (0.55 + 0.45 * math.sin(2 * math.pi * (h - 6) / 24 + phase)) for h in range(hours))
        load[pool.name] = SeriesForecast(mean, mean, tuple(v * 1.5 for v in mean))
    return PlanningInputs(
        start_s=1_656_460_800.0, horizon_hours=hours, fleet=fleet, ci=ci, load=load, capabilities=caps,
        params=load_default_params(), gpu_platform={},
        prefix_hit_fraction={p.name: HITS for p in fleet.pools}, load_margin={p.name: 1.14 for p in fleet.pools})


def main(argv: list[str] | None = None, prog: str = "greenserve bench coupled") -> int:
    parser = Parser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="(the last line is always JSON; kept for symmetry)")
    parser.add_argument("--pools", type=int, default=16, help="pools of four engines each")
    parser.add_argument("--horizon-hours", type=int, default=24, help="hourly intervals per plan")
    parser.add_argument("--repetitions", type=int, default=7, help="timed solves after the first")
    ns = parser.parse_args(argv)
    if not 1 <= ns.pools <= 256 or not 1 <= ns.horizon_hours <= 168 or not 1 <= ns.repetitions <= 100:
        parser.error("--pools in 1..256, --horizon-hours in 1..168, --repetitions in 1..100")
    inputs = fleet_and_inputs(ns.pools, ns.horizon_hours)
    solver = CoupledSolver()
    print(f"{prog}: {ns.pools} pools x {ns.horizon_hours} h, first solve (capacity predictions)", file=sys.stderr)
    started = time.perf_counter()
    solver.solve_knobs(inputs)
    cold_s = time.perf_counter() - started
    solves, milps = [], []
    for _ in range(ns.repetitions):
        started = time.perf_counter()
        answers = solver.solve_knobs(inputs)
        solves.append(time.perf_counter() - started)
        # a pool the model does not cover (no engines, unlike engines) has none: the MILP timing leaves it out
        models = [m for pool in inputs.fleet.pools if (m := solver.pool_model(inputs, pool)) is not None]
        started = time.perf_counter()
        for m in models:
            solver.solve_pool(m)
        milps.append(time.perf_counter() - started)
    detail = answers["routing_weights"].detail
    print(strict_json.dumps({
        "benchmark": "coupled", "pools": ns.pools, "horizon_hours": ns.horizon_hours, "cold_s": round(cold_s, 3),
        "solve_s": round(statistics.median(solves), 4), "milp_s": round(statistics.median(milps), 4),
        "detail": detail}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
