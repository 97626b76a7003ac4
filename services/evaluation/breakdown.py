"""Where a strategy-day's carbon goes: idle power, prefill, decode and embodied carbon, from an evaluation's JSON.

The replay charges each hour ``engines x idle power x 1 h`` (every GPU is held all hour, whatever its load or
layout) plus the requests' dynamic energy measured above idle (``day._measure_hour``); the JSON keeps the sum
(``energy_kwh``), the CI of the hour and the prefix-hit fraction. This module splits it again:

* **idle**: the pool's engines x the idle power of its simulator profile x the hours, as the replay charges it;
* **prefill** (an estimate from the performance model): per request, the compute-bound prefill of the prompt tokens
  no cache tier held (the workload's mean prompt x ``1 - prefix_hit_fraction`` of the hour, attending to the hit
  ones) at full utilisation, above idle: ``(max - idle power) x prefill FLOPs / compute rate``;
* **decode**: the rest of the dynamic energy (decode steps, and the step overheads prefill shares with them);
* **embodied**: the GPUs' (``embodied_compute_g``) and the cache DRAM's (``embodied_storage_g``) as recorded.

Energy turns into carbon at the hour's actual CI and the carbon parameters' PUE, as the replay does, so idle +
prefill + decode equals the recorded operational carbon. For MIG instances and speculative decoding the prefill
estimate uses the pool's whole-GPU profile (the split is then approximate; the totals are not).

``python -m greenserve.evaluation.breakdown evaluation-report/result.json`` prints one table per grid.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from greenserve.common.carbon_params import CarbonParams, load_default_params
from greenserve.common.cli_parser import Parser
from greenserve.evaluation.scenario import WORKLOAD_PROMPT_TOKENS
from greenserve.simulator.engine_profile import load_profile
from greenserve.simulator.perf_model import PerfModel

HOUR_S = 3600.0
J_PER_KWH = 3.6e6
COMPONENTS = ("idle_g", "prefill_g", "decode_g", "embodied_compute_g", "embodied_storage_g")


def _profile(pool: dict[str, Any]) -> PerfModel:
    return PerfModel(load_profile(f"{pool['simulator_model']}@{pool['hardware']}"))


def prefill_dynamic_j(model: PerfModel, prompt_tokens: float, hit_fraction: float) -> float:
    """Dynamic (above idle) energy of one request's prefill: the uncached prompt tokens computed at full
    utilisation, attending to the cached ones."""
    uncached = max(0, round(prompt_tokens * (1.0 - hit_fraction)))
    cached = max(0, round(prompt_tokens * hit_fraction))
    if uncached == 0:
        return 0.0
    _, compute_s = model.step_parts_s(model.prefill_flops(uncached, 1, cached), cached, 0, 0)
    return (model.power_w(1.0) - model.power_w(0.0)) * compute_s


def components(result: dict[str, Any], region: str, strategy: str,
               params: CarbonParams | None = None) -> dict[str, float]:
    """Grams of CO2e by component (``COMPONENTS``) and the energy behind them (``*_kwh``) over the strategy-day."""
    params = params or load_default_params()
    pools = result["scenario"]
    hours = result["grids"][region][strategy]["hours"]
    models = [_profile(p) for p in pools]
    peak = sum(p["peak_requests_per_s"] for p in pools) or 1.0
    idle_kwh_per_h = sum(p["engines"] * m.power_w(0.0) for p, m in zip(pools, models)) * HOUR_S / J_PER_KWH
    out = dict.fromkeys((*COMPONENTS, "idle_kwh", "prefill_kwh", "decode_kwh", "total_g", "operational_g"), 0.0)
    for h in hours:
        g_per_kwh = h["ci_actual_g_per_kwh"] * params.pue
        dynamic_kwh = max(0.0, h["energy_kwh"] - idle_kwh_per_h)
        requests = h["load_actual_requests_per_s"] * HOUR_S
        prefill_kwh = sum(requests * p["peak_requests_per_s"] / peak
                          * prefill_dynamic_j(m, WORKLOAD_PROMPT_TOKENS, h["prefix_hit_fraction"])
                          for p, m in zip(pools, models)) / J_PER_KWH
        prefill_kwh = min(prefill_kwh, dynamic_kwh)
        for name, kwh in (("idle", h["energy_kwh"] - dynamic_kwh), ("prefill", prefill_kwh),
                          ("decode", dynamic_kwh - prefill_kwh)):
            out[f"{name}_kwh"] += kwh
            out[f"{name}_g"] += kwh * g_per_kwh
        out["embodied_compute_g"] += h["embodied_compute_g"]
        out["embodied_storage_g"] += h["embodied_storage_g"]
        out["operational_g"] += h["operational_g"]
        out["total_g"] += h["total_g"]
    return out


def table(result: dict[str, Any], region: str) -> str:
    """A Markdown table of the components per strategy (kgCO2e and share of the strategy's total)."""
    lines = ["| strategy | idle | prefill | decode | embodied (GPU + DRAM) | total kgCO2e |",
             "|---|---:|---:|---:|---:|---:|"]
    for strategy in result["grids"][region]:
        c = components(result, region, strategy)
        total = c["total_g"] or 1.0
        cells = [f"{c[k] / 1000:.3f} ({c[k] / total:.0%})" for k in ("idle_g", "prefill_g", "decode_g")]
        embodied = c["embodied_compute_g"] + c["embodied_storage_g"]
        cells.append(f"{embodied / 1000:.3f} ({embodied / total:.0%})")
        lines.append(f"| {strategy} | {' | '.join(cells)} | {c['total_g'] / 1000:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m greenserve.evaluation.breakdown", description=__doc__.split("\n")[0])
    parser.add_argument("result", type=Path, help="result.json of greenserve evaluate")
    parser.add_argument("--grids", default="", help="comma-separated grids (default: all in the file)")
    args = parser.parse_args(argv)
    try:
        result = json.loads(args.result.read_text())
    except (OSError, ValueError) as exc:
        print(f"result: cannot read {args.result}: {exc}", file=sys.stderr)
        return 2
    wanted = [g for g in args.grids.split(",") if g] or list(result.get("grids", {}))
    for region in wanted:
        if region not in result.get("grids", {}):
            print(f"--grids: {region!r} is not in {args.result}", file=sys.stderr)
            return 2
        print(f"## {region}\n\n{table(result, region)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
