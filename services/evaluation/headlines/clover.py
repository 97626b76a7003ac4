"""CLOVER's headline, its LLM analogue reproduced with the optimizer's exact solver.

CLOVER (Sec. 5.1-5.2) serves one application's model variants on 10 A100 GPUs partitioned with MIG, over 48 h of
CISO's carbon intensity, and reports operational carbon saved against BASE (the highest-quality variant on every
GPU, not partitioned) at an accuracy loss of 2-4 %, within 5 % of ORACLE. The LLM analogue here:

* variants: Llama-3.1 8B Instruct in BF16 and GPTQ 4-bit (the optimizer's catalogue, quality from the published
  model card: 67.57 vs 69.32, a 2.5 % loss when every request goes to the 4-bit model), each on every A100-40GB
  MIG slice it fits, its SLO capacity, idle power and energy per request predicted by the simulator;
* 10 A100-40GB (70 slices), one pool (SLO TTFT 2 s, TPOT 100 ms at 90 %, 1,024 / 256 tokens), a constant load of
  90 % of BASE's SLO capacity (CLOVER: "neither resource starvation nor idle GPUs"), PUE 1.5 (CLOVER's);
* 48 h of real CI: CISO, 5-6 July 2022 (``services/evaluation/data``, the evaluation's shipped slice);
* each hour solved by the exact MILP (``mig_milp.solve_exact``: CLOVER's Eq. 3 with lambda 0.5, an accuracy-loss
  cap of 4 %, the change cost of restarted engines from the previous hour's configuration), which proves the
  optimum: this is ORACLE by construction (CLOVER's ORACLE is the best configuration found offline);
* BASE: BF16 on every GPU whole carrying the same load at the same hour's CI (CLOVER keeps CI equal, Sec. 3).

Carbon is operational, as in CLOVER (Sec. 2: "carbon refers to the operational carbon by default"): idle power of
every GPU (an empty slice saves nothing) plus each request's dynamic energy, at the hour's CI.

``run(quick)`` returns the seeds' headline convention (``services/evaluation/headlines``); quick solves 6 hours.
``python -m greenserve.evaluation.headlines.clover`` prints it as JSON.
"""

from __future__ import annotations

import json
import math
import sys
import time
from datetime import UTC, datetime
from typing import Any

from greenserve.common.cli_parser import Parser
from greenserve.evaluation import grids
from greenserve.optimizer.solvers import mig_patterns as mp
from greenserve.optimizer.solvers.mig_milp import solve_exact
from greenserve.optimizer.solvers.mig_problem import DEFAULT_CHANGE_S
from greenserve.optimizer.solvers.mig_setup import base_carbon_g, make_setup, problem_for, to_layouts
from greenserve.v1 import common_pb2

GPU_MODEL = "A100-40GB"
GPUS = 10
FAMILY = "llama3.1-8b-instruct"
REGION = "CISO"
START = datetime(2022, 7, 5, tzinfo=UTC)
HOURS, QUICK_HOURS = 48, 6
WEIGHT = 0.5  # lambda
MAX_ACCURACY_LOSS = 0.04
LOAD_FRACTION = 0.9
HEADROOM = 0.9
PUE = 1.5  # CLOVER Sec. 5.2.1
PAPER_SAVING_PCT = 75.0  # CLOVER Sec. 5.2.1: "over 75 %"
TOLERANCE = 0.20

PAPER = {
    "operational carbon saved vs BASE (%)": {
        "value": "> 75 (80 with all three applications)",
        "source": "CLOVER Sec. 5.2.1, Fig. 9: 48 h of CISO CI, BERT / YOLO / ResNet variants on 10 A100 GPUs"},
    "accuracy loss (%)": {"value": "2-4", "source": "CLOVER Sec. 5.2.1, Fig. 9"},
    "gap to ORACLE (%)": {"value": "< 5", "source": "CLOVER Sec. 1 and 5.2.2 (simulated annealing)"},
}

SETTING = (f"Llama-3.1 8B Instruct BF16 + GPTQ 4-bit on {GPUS} x {GPU_MODEL} with MIG, 48 h of {REGION} CI "
           f"({START:%Y-%m-%d} + 2 days), load {LOAD_FRACTION:.0%} of BASE's SLO capacity, lambda {WEIGHT:g}, "
           f"accuracy loss <= {MAX_ACCURACY_LOSS:.0%}, PUE {PUE:g}; simulator capabilities, exact MILP per hour")


def _pool() -> common_pb2.Pool:
    pool = common_pb2.Pool(name="chat", model="meta-llama/Meta-Llama-3.1-8B-Instruct", region=REGION,
                           slo=common_pb2.Slo(ttft_s=2.0, tpot_s=0.1, attainment_fraction=0.9),
                           mean_prompt_tokens=1024, mean_output_tokens=256)
    pool.variants.extend(v.to_proto() for v in mp.family(FAMILY))
    return pool


def run(quick: bool = False) -> dict[str, Any]:
    started = time.perf_counter()
    hours = QUICK_HOURS if quick else HOURS
    ci = list(grids.shipped()[REGION].window(int(START.timestamp()), hours))
    pool = _pool()
    setup = make_setup(pool, [(f"GPU-{i:02d}", GPU_MODEL, ()) for i in range(GPUS)],
                       lambda m, p, v: mp.predicted_option(
                           pool, m, p, v, v.simulator_model if v is not None else None, "clover headline"))
    best = pool.variants[0].name
    whole = max((p for c in mp.layout_classes(GPU_MODEL) for p in c), key=lambda p: int(p.split("g")[0]))
    base_capacity = HEADROOM * setup.options[(GPU_MODEL, whole, best)].capacity_requests_per_s * GPUS
    load = LOAD_FRACTION * base_capacity
    base_ci = sum(ci) / len(ci)
    states = None
    ours_g = base_g = 0.0
    served = quality = 0.0
    statuses: dict[str, int] = {}
    restarts = 0
    configs: dict[str, int] = {}
    for _h, ci_h in enumerate(ci):
        problem = problem_for(setup, states, load, ci_h, base_ci, PUE, WEIGHT, headroom=HEADROOM,
                              max_accuracy_loss=MAX_ACCURACY_LOSS, change_s=DEFAULT_CHANGE_S)
        solution = solve_exact(problem)
        _, states = to_layouts(setup, problem, solution)
        ours_g += solution.carbon_g + solution.change_g
        base_g += base_carbon_g(setup, load, ci_h, PUE)  # BASE at the same hour's CI
        served += solution.served_rps
        quality += solution.served_rps * (1 + solution.d_accuracy / 100.0)
        statuses[solution.status] = statuses.get(solution.status, 0) + 1
        restarts += solution.restarts
        label = ", ".join(sorted((f"{n}x {p.label()}" for (_, p), n in solution.counts.items()), reverse=True))
        configs[label] = configs.get(label, 0) + 1
    saved = 100.0 * (base_g - ours_g) / base_g
    loss = 100.0 * (1 - quality / served) if served else math.nan
    ours = {
        "operational carbon saved vs BASE (%)": {"value": saved, "ours_g": ours_g, "base_g": base_g,
                                                 "hours": hours},
        "accuracy loss (%)": {"value": loss},
        "gap to ORACLE (%)": {"value": 0.0, "why": f"each hour proven optimal by HiGHS ({statuses})"},
        "load (req/s)": {"value": load, "BASE capacity": base_capacity},
        "configurations (hours)": configs,
        "engine restarts": restarts,
        "solve_s": time.perf_counter() - started,
    }
    required = bool(loss <= 100 * MAX_ACCURACY_LOSS + 1e-9 and saved > 0 and set(statuses) == {"optimal"})
    ours["the reproduction's conditions (loss <= 4 %, a saving, optimum = ORACLE)"] = required
    within = required and abs(saved - PAPER_SAVING_PCT) <= TOLERANCE * PAPER_SAVING_PCT
    notes = [
        f"an LLM analogue, not CLOVER's models: the 8B's 4-bit variant keeps 97.5 % of BF16's quality, so the "
        f"accuracy cap of {MAX_ACCURACY_LOSS:.0%} never binds and the saving is what 4-bit weights on MIG slices "
        f"save in energy per request; CLOVER's >75 % comes from vision/NLP variants of very different cost",
        "every GPU's idle power is charged whatever its layout (an empty slice saves nothing): only the dynamic "
        "energy per request can be saved at a fixed load",
        "capabilities of each variant on each slice are simulator predictions (scaled from the closest profile), "
        "not measurements",
        "within tolerance means the saving is within +-20 % of CLOVER's 75 % with the reproduction's conditions met "
        "(accuracy loss <= 4 %, every hour proven optimal = ORACLE); those conditions are reported apart",
    ]
    if quick:
        notes.append(f"quick: the first {QUICK_HOURS} of the 48 hours")
    return {"seed": "CLOVER (004)", "setting": SETTING, "paper": PAPER, "ours": ours, "within_tolerance": within,
            "notes": notes}


def main(argv: list[str] | None = None) -> int:
    """Print the headline as JSON."""
    parser = Parser(prog="python -m greenserve.evaluation.headlines.clover",
                    description="CLOVER's headline (MIG layouts with model variants) reproduced, printed as JSON")
    parser.add_argument("--quick", action="store_true", help="solve 6 hours instead of 48 (tests, CI)")
    ns = parser.parse_args(argv)
    json.dump(run(quick=ns.quick), sys.stdout, indent=1, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
