"""`greenserve bench simulator`: virtual-time replay speed and latency percentiles on the shipped traces.

Replays the Mooncake FAST'25 conversation hour (12,031 requests with 512-token prefix-block hashes) and the
first hour of the Azure LLM 2023 conversation trace (19,366 requests) through a fleet of engines (default 4 x
``llama3-8b@H100-80GB`` with LMCache DRAM and disk tiers, prefix-affinity routing). The figure of merit is
simulated requests per wall-clock second on one core; the latency figures are what the model predicts for
that fleet. Progress goes to stderr, one JSON object is the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from greenserve.common import strict_json
from greenserve.common.cli_parser import Parser
from greenserve.simulator.engine_profile import list_profiles
from greenserve.simulator.replay import replay
from greenserve.simulator.replay_fleet import FleetConfig
from greenserve.simulator.workloads import (
    Workload,
    load_azure_csv,
    load_mooncake_jsonl,
    trace_path,
)


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = Parser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="accepted for symmetry; the last line is always JSON")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests of each trace")
    parser.add_argument("--engines", type=int, default=4, help="engines in the fleet (default 4)")
    parser.add_argument("--profile", default="llama3-8b@H100-80GB", help="engine profile (see --list-profiles)")
    parser.add_argument("--policy", default="prefix_affinity",
                        choices=["round_robin", "least_loaded", "prefix_affinity"], help="routing policy")
    parser.add_argument("--dram-tokens", type=int, default=2_000_000, help="LMCache L1 capacity per engine (tokens)")
    parser.add_argument("--disk-tokens", type=int, default=20_000_000, help="LMCache L2 capacity per engine (tokens)")
    parser.add_argument("--ttft-slo-s", type=float, default=2.0, help="TTFT SLO for the attainment figure")
    parser.add_argument("--tpot-slo-s", type=float, default=0.1, help="TPOT SLO for the attainment figure")
    parser.add_argument("--repeat", type=int, default=1, help="replays per trace; the fastest wall time counts")
    parser.add_argument("--list-profiles", action="store_true", help="print the profile names and exit")
    return parser


def main(argv: list[str], prog: str = "greenserve bench simulator") -> int:
    parser = _parser(prog)
    ns = parser.parse_args(argv)
    if ns.list_profiles:
        print(json.dumps({"profiles": list_profiles()}))
        return 0
    if ns.limit is not None and ns.limit < 1:
        parser.error("--limit: must be >= 1")
    if ns.engines < 1 or ns.repeat < 1:
        parser.error("--engines and --repeat: must be >= 1")
    if ns.profile not in list_profiles():
        parser.error(f"--profile: unknown profile {ns.profile!r}; known: {', '.join(list_profiles())}")
    if ns.dram_tokens < 0 or ns.disk_tokens < 0:
        parser.error("--dram-tokens/--disk-tokens: must be >= 0")
    if ns.ttft_slo_s <= 0 or ns.tpot_slo_s <= 0:
        parser.error("--ttft-slo-s/--tpot-slo-s: must be > 0")

    try:
        paths = {"mooncake_conversation_1h": trace_path("mooncake"), "azure_conv_2023_1h": trace_path("azure-conv")}
    except FileNotFoundError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    traces: dict[str, Workload] = {
        "mooncake_conversation_1h": load_mooncake_jsonl(paths["mooncake_conversation_1h"], limit=ns.limit,
                                                        max_seconds=3600.0),
        "azure_conv_2023_1h": load_azure_csv(paths["azure_conv_2023_1h"], limit=ns.limit, max_seconds=3600.0),
    }
    parse_s = time.perf_counter() - t0
    print(f"parsed {sum(len(w) for w in traces.values())} requests in {parse_s:.2f} s", file=sys.stderr)

    fleet = FleetConfig.uniform(ns.engines, ns.profile, policy=ns.policy, dram_capacity_tokens=ns.dram_tokens,
                                disk_capacity_tokens=ns.disk_tokens)
    per_trace: dict[str, Any] = {}
    total_requests = 0
    total_wall = 0.0
    ttft_all: list[Any] = []
    tpot_all: list[Any] = []
    import numpy as np

    for name, workload in traces.items():
        best = math.inf
        result = None
        for _ in range(ns.repeat):
            t = time.perf_counter()
            result = replay(workload, fleet)
            best = min(best, time.perf_counter() - t)
        assert result is not None
        summary = result.summary(ns.ttft_slo_s, ns.tpot_slo_s)
        summary["wall_seconds"] = best
        summary["simulated_requests_per_second"] = len(workload) / best if best > 0 else math.inf
        summary["events"] = result.events
        per_trace[name] = summary
        total_requests += len(workload)
        total_wall += best
        ttft_all.append(result.ttft_s)
        tpot_all.append(result.tpot_s)
        print(f"{name}: {len(workload)} requests in {best:.3f} s "
              f"({summary['simulated_requests_per_second']:.0f} req/s), p50 TTFT {summary['ttft_s']['p50']:.3f} s",
              file=sys.stderr)

    ttft = np.concatenate(ttft_all)
    tpot = np.concatenate(tpot_all)

    def pct(v: np.ndarray) -> dict[str, float]:
        v = v[np.isfinite(v)]
        if not len(v):
            return {"p50": math.nan, "p90": math.nan, "p99": math.nan}
        p = np.percentile(v, [50, 90, 99])
        return {"p50": float(p[0]), "p90": float(p[1]), "p99": float(p[2])}

    out = {
        "benchmark": "simulator",
        "requests": total_requests,
        "wall_seconds": total_wall,
        "simulated_requests_per_second": total_requests / total_wall if total_wall > 0 else math.inf,
        "parse_seconds": parse_s,
        "fleet": {"engines": ns.engines, "profile": ns.profile, "policy": ns.policy,
                  "dram_tokens_per_engine": ns.dram_tokens, "disk_tokens_per_engine": ns.disk_tokens},
        "ttft_s": pct(ttft),
        "tpot_s": pct(tpot),
        "slo_s": {"ttft": ns.ttft_slo_s, "tpot": ns.tpot_slo_s},
        "per_trace": per_trace,
        "data_version": next(iter(per_trace.values()))["data_version"] if per_trace else "",
    }
    print(strict_json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="python -m greenserve.bench.simulator"))
