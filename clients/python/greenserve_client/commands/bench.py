"""`greenserve bench NAME [ARGS...]`: run one benchmark.

Every benchmark prints progress to stderr and exactly one JSON object on the last line of stdout, so
that scripts can `tail -n1 | jq`. The benchmark code lives with the service it measures; this module
only maps names to `module:function` (imported lazily) and passes the remaining arguments on.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from greenserve.common.cli_parser import Parser

BENCHMARKS: dict[str, tuple[str, str]] = {
    "simulator": ("greenserve.bench.simulator:main", "virtual-time replay speed and latency percentiles"),
    "engine-sim": ("greenserve.bench.engine_sim:main", "concurrent streams and tokens/s one emulated engine sustains"),
    "forecaster": ("greenserve.bench.forecaster:main", "day-ahead CI and load MAPE vs seasonal naive"),
    "router": ("greenserve.bench.router:main", "added TTFT and throughput through the router vs direct"),
    "router-policy": ("greenserve.bench.router_policy:main",
                      "CPU per routing decision (RoutingPolicy.choose) for 2/8/32 engines, with and without plan/prefix"),
    "router-replicas": ("greenserve.bench.router_replicas:main",
                        "4 router replicas on one database: registration propagation, prefix hit rate vs 1"),
    "cache-policy": ("greenserve.bench.cache_manager:policy_main", "token hit rate of FIFO/LRU/LCS/LCS+TTL/Adaptive"),
    "cache-pareto": ("greenserve.optimizer.solvers.cache_pareto:bench_main",
                     "Kareto adaptive Pareto search vs full grid: evaluations and hypervolume"),
    "cache-eviction": ("greenserve.bench.cache_manager:eviction_main", "eviction choice latency over 1M entries"),
    "plan": ("greenserve.bench.optimizer_plan:main", "ComputePlan time (16 pools, 64 GPUs, 24 h) and WatchPlans delivery"),
    "coupled": ("greenserve.bench.optimizer_coupled:main", "coupled MILP solve time: 16 pools x 24 h (engines, DRAM, clocks)"),
    "cache-plan": ("greenserve.bench.optimizer_cache:main", "GreenCache ILP solve time: 24 h x 17 sizes, 168 h x 64 sizes x 16 pools"),
    "mig-plan": ("greenserve.bench.optimizer_mig:main", "variants on MIG: exact optimum (10 / 1,000 GPUs) vs CLOVER's SA and random search"),
    "profiler": ("greenserve.bench.profiler:main", "simulator sweep points/s; --agreement: engine vs emulator vs simulator"),
    "calibration": ("greenserve.bench.profiler_calibration:main",
                    "CPU step model fitted on a stored real-vLLM sweep: TTFT/TPOT error at held-back rates"),
    "headlines": ("greenserve.evaluation.headlines:main", "the seeds' headlines reproduced in their own settings (--quick)"),
}


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="greenserve bench",
        description="Run a benchmark; its last line of output is one JSON object.",
        epilog="benchmarks: " + "; ".join(f"{name}: {help_text}" for name, (_, help_text) in BENCHMARKS.items()),
    )
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of that benchmark (see NAME --help)")
    return parser


def main(argv: list[str]) -> int:
    ns = _parser().parse_args(argv)
    target, _ = BENCHMARKS[ns.name]
    module_name, function_name = target.split(":")
    function = getattr(importlib.import_module(module_name), function_name)
    return int(function(ns.args, prog=f"greenserve bench {ns.name}"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
