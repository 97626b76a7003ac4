"""GreenCache's headline reproduced in the simulator, in GreenCache's own setting (issue 18, "Figures").

The setting (GreenCache Sec. 6.1-6.2): Llama-3 70B INT8 on one 4 x L40 server (``llama3-70b-int8@4xL40``), the
multi-turn conversation task (ShareGPT-like, 8k window), an SSD cache of 0-16 TB in 1 TB steps on LMCache (every
hit is loaded: ``reuse_rule="always"``), a 24 h Azure request-rate shape scaled so that its peak is the server's
sustainable rate with the full cache, the CI of 6 July 2022 on FR, FI, ES and CISO, SLOs TTFT 2.5 s and TPOT 0.2 s
at 90 % attainment, GreenCache's carbon model (Eq. 1-5: operational energy x CI, the server's embodied carbon of
Table 1 over 5 years, the allocated SSD at 30 kgCO2e/TB) and its ILP (Eq. 6, global rho = 0.9), solved by the
optimizer's solver (``solvers/cache_greencache.solve_ilp``) against Full Cache (16 TB every hour).

How it is computed, as GreenCache does it (Sec. 5.2, 5.4): a profile of cache size x request rate (TTFT and TPOT
attainment, server power), here predicted by replaying the simulator; the ILP picks one size per hour from the
profile at the hour's rate and CI; the day's carbon of the chosen sizes and of Full Cache is read from the same
profile at the actual rate (forecasts = actuals: GreenCache Sec. 6.5 measures the forecast errors' cost at < 1 %).

What is GreenCache's and not modelled: the hit rate of each cache size is GreenCache's own measurement (Table 3,
LCS column, interpolated in log size), because it depends on GreenCache's ShareGPT pool (the cache was initialised
with 200k prompts of it), which the project does not ship. In the replay a request's previous-turn context is on
the SSD with the probability that gives that token hit rate, and it is loaded from there.

Where the product's defaults and GreenCache's setting differ, the paper's is a named assumption of this module
(``Assumptions``; ``OURS`` and ``PAPER_SETTING``), never a change of the product's defaults: the CI (life-cycle vs
GreenCache's direct CI), the power accounting (the GPUs vs the whole server), the conversation shape
(``WorkloadShape``) and the Azure service whose day shapes the load. The headline runs in ``PAPER_SETTING``;
``detail.decomposition`` switches the assumptions one at a time from ours (and leaves each out of the paper's).

``run(quick)`` returns the seeds' headline convention (``services/evaluation/headlines``): ``seed``, ``setting``,
``paper``, ``ours`` (the paper's figures under the same keys, then two of ours alone), ``within_tolerance``,
``notes``, and ``detail`` (per grid: hourly sizes, carbon, attainment, the ILP's status; the decomposition; the
what-ifs; the checks). ``python -m greenserve.evaluation.headlines.greencache`` prints it as one line of JSON (``--quick`` for the short run).
"""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np
from greenserve.common import carbon
from greenserve.evaluation import grids
from greenserve.optimizer.solvers.cache_greencache import (
    PoolCacheModel,
    attainment,
    solve_ilp,
)
from greenserve.simulator.engine_profile import load_profile
from greenserve.simulator.perf_model import PerfModel
from greenserve.simulator.replay import replay
from greenserve.simulator.replay_fleet import EngineSpec, FleetConfig
from greenserve.simulator.workloads import Workload, multi_turn_workload

__all__ = ["PAPER", "SETTING", "azure_day_shape", "hit_rate", "run"]

PROFILE = "llama3-70b-int8@4xL40"
REGIONS = ("FR", "FI", "ES", "CISO")
DAY = datetime(2022, 7, 6, tzinfo=UTC)
TB = 10**12
MAX_TB = 16
TTFT_SLO_S = 2.5
TPOT_SLO_S = 0.2
RHO = 0.9
TOLERANCE = 0.20  # +-20 % relative (issue 18)
LADDER_LOW = 0.3  # profiled rates: 0.3 x peak .. peak (the Azure conv day's trough is ~0.55 x its peak)
LADDER_FLOOR = 0.1  # and one at 0.1 x peak (the Azure code day's trough)
# mean_turns=6 gives ~75 % of prompts over 1,000 tokens (GreenCache Fig. 4: 77.2 %), as in fidelity.py; 4 is the
# evaluation's default workload (shorter contexts: P90 4.7k tokens instead of 7.1k), a what-if
MEAN_TURNS = 6.0
SHORT_MEAN_TURNS = 4.0
FR_CI_PAPER_G_PER_KWH = 33.0

# GreenCache Sec. 6.1: "The training data and groundtruth CI come from the CarbonCast dataset [49]". The *direct*
# (operational) CI of 6 July 2022, hours 00-23 UTC, ships in ``DIRECT_CI_FILE`` (sources per region in the data
# folder's SOURCE.md): CarbonCast's for FR, FI and CISO; CarbonCast's ES series ends in 2021, so ES is Electricity
# Maps' direct CI of the same day. FR's mean, 37.1 g/kWh, is close to the 33 g/kWh GreenCache quotes for FR (Sec.
# 3.2.2 / Fig. 2a); the shipped life-cycle series is 94.3.
DIRECT_CI_FILE = "ci_2022-07-06_direct.csv"
HOUR_S = 3600.0
BLOCK_TOKENS = 256
AZURE_FILE = "azure2024_conv_requests_hourly.csv"
AZURE_DAY = "2024-05-13"  # the trace's first full weekday (a Monday)

# The Azure LLM inference trace 2024's *code* service, hourly request counts of AZURE_DAY (00-23 UTC), shipped in
# ``AZURE_CODE_FILE`` (source in the data folder's SOURCE.md). Its trough is 0.10 of its peak (conv: 0.55).
AZURE_CODE_FILE = "azure2024_code_requests_2024-05-13.csv"


def _data_rows(name: str) -> list[dict[str, str]]:
    """The rows of the evaluation data file ``name`` (``greenserve/evaluation/data``)."""
    resource = resources.files("greenserve.evaluation").joinpath("data", name)
    with resources.as_file(resource) as path, path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@lru_cache(maxsize=1)
def direct_ci_2022_07_06() -> dict[str, tuple[float, ...]]:
    """Region -> the 24 hourly direct CIs (gCO2e/kWh) of 6 July 2022 from ``DIRECT_CI_FILE``."""
    out: dict[str, list[float]] = {}
    for row in _data_rows(DIRECT_CI_FILE):
        out.setdefault(row["region"], []).append(float(row["ci_direct_g_per_kwh"]))
    bad = sorted(r for r, v in out.items() if len(v) != 24)
    if bad or set(out) != set(REGIONS):
        raise ValueError(f"{DIRECT_CI_FILE}: expected 24 hours of each of {REGIONS}, got {sorted(out)} ({bad})")
    return {r: tuple(v) for r, v in out.items()}


@lru_cache(maxsize=1)
def azure_code_day() -> tuple[int, ...]:
    """The 24 hourly request counts of the Azure code service on ``AZURE_DAY`` from ``AZURE_CODE_FILE``."""
    day = tuple(int(r["requests"]) for r in _data_rows(AZURE_CODE_FILE) if r["hour_start_utc"].startswith(AZURE_DAY))
    if len(day) != 24:
        raise ValueError(f"{AZURE_CODE_FILE}: {AZURE_DAY} has {len(day)} hours, expected 24")
    return day


# GreenCache Table 3, Llama-3 70B, ShareGPT, LCS: token hit rate at 1, 2, 4, 8, 16 TB.
TABLE3_LCS = {1: 0.08, 2: 0.17, 4: 0.28, 8: 0.47, 16: 0.71}

# GreenCache Table 1: embodied carbon of the server's other components (kgCO2e), amortised over 5 years (Sec. 2.3).
OTHER_COMPONENTS = ("gpu.L40", "gpu.L40", "gpu.L40", "gpu.L40", "cpu.EPYC-7453", "dram.DDR4-512GB")

PAPER: dict[str, Any] = {
    "carbon_saved_vs_full_cache_fr_mean_pct": {
        "value": 15.1, "citation": "GreenCache Sec. 6.2 'Timelines' (Fig. 14a): FR, multi-turn, average 15.1 %"},
    "carbon_saved_vs_full_cache_fr_max_hour_pct": {
        "value": 25.3, "citation": "GreenCache Sec. 6.2 'Timelines': FR, up to 25.3 % (12 AM, 15 TB less SSD)"},
    "carbon_saved_vs_full_cache_per_grid_range_pct": {
        "value": [6.9, 20.4], "citation": "GreenCache Sec. 6.2 'Timelines': 6.9-20.4 % over Full Cache in "
                                          "multi-turn conversation (the four grids' range)"},
    "carbon_saved_vs_full_cache_mean_of_grids_pct": {
        "value": 12.6, "citation": "GreenCache Sec. 6.2 'Carbon Emissions' (Fig. 12a): 70B multi-turn, 12.6 % on "
                                   "average over FR, FI, ES, CISO"},
    "carbon_saved_vs_full_cache_ciso_max_pct": {
        "value": 6.91, "citation": "GreenCache Sec. 1 (contributions): 'can still achieve up to a 6.91% reduction in "
                                   "higher-CI grids like CISO' (Llama-3 70B); compared with CISO's best hour"},
    "slo_attainment_min": {"value": 0.9, "citation": "GreenCache Sec. 6.1 SLOs and Fig. 13: P90 TTFT <= 2.5 s and "
                                                     "P90 TPOT <= 0.2 s all day"},
}

SETTING: dict[str, Any] = {
    "model": "Llama-3 70B INT8 on 4 x L40 (simulator profile " + PROFILE + ")",
    "task": "multi-turn conversations (ShareGPT-like, 8k context window; PAPER_WORKLOAD: 10 turns of 150-token "
            "questions and 100-token answers, so that Table 3's hit rates are reachable)",
    "cache": f"SSD (LMCache L2) 0-{MAX_TB} TB in 1 TB steps, hit rate of GreenCache Table 3 (LCS)",
    "load": f"Azure LLM inference trace 2024, code service (trough 0.10 of peak), hourly shape of {AZURE_DAY}, "
            "peak scaled to the server's sustainable rate with the full cache",
    "ci": "6 July 2022, FR, FI, ES, CISO, direct CI (CarbonCast; ES: Electricity Maps direct)",
    "power": "whole server: the GPUs' modelled power + CPU + DRAM + allocated SSD (assumed typical power)",
    "slo": {"ttft_s": TTFT_SLO_S, "tpot_s": TPOT_SLO_S, "attainment": RHO},
    "solver": "GreenCache ILP (Eq. 6, global rho), PuLP + HiGHS, vs Full Cache (16 TB every hour)",
}


def hit_rate(size_tb: float) -> float:
    """Token hit rate of an SSD cache of ``size_tb`` (GreenCache Table 3, LCS; linear in log2 size between its
    points, 0 at 0 TB, proportional below 1 TB)."""
    if size_tb < 0:
        raise ValueError("size_tb: must be >= 0")
    if size_tb == 0:
        return 0.0
    if size_tb < 1:
        return TABLE3_LCS[1] * size_tb
    xs = np.log2(list(TABLE3_LCS))
    return float(np.interp(math.log2(min(size_tb, MAX_TB)), xs, list(TABLE3_LCS.values())))


def azure_day_shape(service: str = "conv") -> list[float]:
    """The 24 hourly request counts of ``AZURE_DAY`` in the Azure 2024 trace's ``service`` (``conv``: the shipped
    conversation trace; ``code``: ``AZURE_CODE_FILE``), divided by their maximum (peak = 1)."""
    if service == "code":
        code = azure_code_day()
        return [v / max(code) for v in code]
    if service != "conv":
        raise ValueError(f"service: must be 'conv' or 'code', got {service!r}")
    resource = resources.files("greenserve.common").joinpath("data", "demo", AZURE_FILE)
    with resources.as_file(resource) as path, path.open(newline="", encoding="utf-8") as handle:
        rows = [(r["hour_start_utc"], float(r["requests"])) for r in csv.DictReader(handle)]
    day = [v for t, v in rows if t.startswith(AZURE_DAY)]
    if len(day) != 24:
        raise ValueError(f"{AZURE_FILE}: {AZURE_DAY} has {len(day)} hours, expected 24")
    peak = max(day)
    return [v / peak for v in day]


def day_ci(region: str, kind: str = "lifecycle") -> list[float]:
    """The 24 hourly CIs (gCO2e/kWh) of ``region`` on 6 July 2022: ``lifecycle`` (the shipped evaluation data,
    Electricity Maps) or ``direct`` (GreenCache's source, CarbonCast's direct CI; ES: Electricity Maps' direct CI)."""
    if kind == "lifecycle":
        return list(grids.shipped()[region].window(int(DAY.timestamp()), 24))
    if kind == "direct":
        return list(direct_ci_2022_07_06()[region])
    raise ValueError(f"kind: must be 'lifecycle' or 'direct', got {kind!r}")


# -----------------------------------------------------------------------------------------------------
# The profile: cache size x request rate -> attainment and power (GreenCache Sec. 5.2), by replay
# -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadShape:
    """The conversation generator's parameters (``simulator.workloads.multi_turn_workload``): turns per conversation
    (geometric), user-message and answer tokens (log-normal means)."""

    name: str
    mean_turns: float
    mean_user_tokens: float = 300.0
    mean_output_tokens: float = 250.0


# Ours: mean_turns=6 gives ~75 % of prompts over 1,000 tokens (GreenCache Fig. 4: 77.2 %), P90 7.1k tokens.
OURS_WORKLOAD = WorkloadShape("ShareGPT-like, 6 turns x 300-token messages", MEAN_TURNS)
SHORT_WORKLOAD = WorkloadShape("ShareGPT-like, 4 turns x 300-token messages", SHORT_MEAN_TURNS)
PAPER_WORKLOAD = WorkloadShape("ShareGPT-like, 10 turns x 150-token questions, 100-token answers", 10.0, 150.0, 100.0)


@dataclass(frozen=True)
class PowerAccounting:
    """What the operational energy counts: the GPUs' modelled power, plus ``host_w`` (CPU and DRAM, constant) and
    ``ssd_w_per_tb`` of the allocated SSD."""

    name: str
    host_w: float = 0.0
    ssd_w_per_tb: float = 0.0


GPU_ONLY = PowerAccounting("GPUs only (simulator power model)")
# GreenCache Sec. 5.2: CPU power by RAPL, GPU power by pyNVML, "SSD and DRAM ... follow the typical power in their
# specifications". The paper does not print the figures; these are assumptions of ours, stated as such: CPU (EPYC
# 7453, 225 W TDP) at half its TDP while it only schedules; 512 GB DDR4 as 16 x 32 GB RDIMMs at ~4 W each; SSD at
# ~2 W per allocated TB (a 3.84 TB data-centre NVMe drive averages ~8 W between idle and active).
CPU_W = 0.5 * 225.0
DRAM_W = 16 * 4.0
SSD_W_PER_TB = 2.0
WHOLE_SERVER = PowerAccounting("whole server: GPUs + CPU + DRAM + allocated SSD", CPU_W + DRAM_W, SSD_W_PER_TB)


@dataclass(frozen=True)
class Assumptions:
    """The reproduction's assumptions where ours and GreenCache's differ (``OURS`` and ``PAPER_SETTING``); the
    decomposition switches them one at a time."""

    ci_kind: str = "lifecycle"
    power: PowerAccounting = GPU_ONLY
    workload: WorkloadShape = OURS_WORKLOAD
    azure_service: str = "conv"


OURS = Assumptions()
PAPER_SETTING = Assumptions("direct", WHOLE_SERVER, PAPER_WORKLOAD, "code")


@dataclass(frozen=True)
class _Turns:
    """Conversation turns to draw requests from: prompt, output and the previous turn's prompt (the context
    LMCache saved at that turn's prefill, which this turn can reuse)."""

    prompt: np.ndarray
    output: np.ndarray
    prev_prompt: np.ndarray


@lru_cache(maxsize=4)
def _turns(seed: int, shape: WorkloadShape) -> _Turns:
    conv = multi_turn_workload(3000, 1.0, seed=seed, mean_turns=shape.mean_turns,
                               mean_user_tokens=shape.mean_user_tokens, mean_output_tokens=shape.mean_output_tokens,
                               block_tokens=BLOCK_TOKENS)
    last: dict[int, int] = {}
    prompt, output, prev = [], [], []
    order = np.argsort(conv.arrival_s, kind="stable")
    for i in order:
        sid = conv.session_ids[i]
        p = conv.prompt_tokens[i]
        # a truncated (8k) prompt changed its prefix: nothing of the previous turn is reusable
        before = last.get(sid, 0)
        prompt.append(p)
        output.append(conv.output_tokens[i])
        prev.append(before if p < 8192 else 0)
        last[sid] = p
    return _Turns(np.asarray(prompt), np.asarray(output), np.asarray(prev))


def _workload(rate_per_s: float, n: int, size_tb: float, seed: int,
              shape: WorkloadShape | None = None) -> tuple[Workload, list[int]]:
    """``n`` turns drawn at random (GreenCache: a random conversation's next turn), Poisson arrivals at
    ``rate_per_s``; each request's previous-turn context is on the SSD with the probability that makes the token
    hit rate ``hit_rate(size_tb)``. Block ids are unique per request, so the only hits are the preloaded ones.
    Returns the workload and the blocks to preload on the disk tier."""
    turns = _turns(1, shape or OURS_WORKLOAD)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(turns.prompt), size=n)
    prompt, output, prev = turns.prompt[pick], turns.output[pick], turns.prev_prompt[pick]
    reusable = (prev // BLOCK_TOKENS) * BLOCK_TOKENS
    target = hit_rate(size_tb) * float(prompt.sum())
    q = min(1.0, target / float(reusable.sum())) if reusable.sum() > 0 else 0.0
    hit = rng.random(n) < q
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, size=n))
    hashes: list[tuple[int, ...]] = []
    preload: list[int] = []
    next_id = 1
    for i in range(n):
        blocks = int(prompt[i]) // BLOCK_TOKENS
        ids = tuple(range(next_id, next_id + blocks))
        next_id += blocks
        hashes.append(ids)
        if hit[i]:
            preload.extend(ids[: int(reusable[i]) // BLOCK_TOKENS])
    work = Workload(f"greencache-turns-{rate_per_s:g}rps", arrivals.tolist(), prompt.tolist(), output.tolist(),
                    hashes, BLOCK_TOKENS)
    return work, preload


@dataclass(frozen=True)
class _Point:
    ttft_ok: float
    tpot_ok: float
    power_w: float
    hit_rate: float


def _point(size_tb: float, rate_per_s: float, n: int, seed: int, shape: WorkloadShape | None = None) -> _Point:
    work, preload = _workload(rate_per_s, n, size_tb, seed, shape)
    # room for the preloaded contexts and every prompt written through during the replay: nothing is evicted, so
    # the hit rate is the one the preload sets (the cache size acts through it and through the SSD's carbon)
    capacity = (len(preload) + sum(len(h) for h in work.block_hashes) + 1) * BLOCK_TOKENS
    spec = EngineSpec(PROFILE, disk_capacity_tokens=capacity, prefix_caching=False, reuse_rule="always")
    result = replay(work, FleetConfig((spec,), seed=seed), initial_contents=[{"disk": preload}])
    warm = np.asarray(result.arrival_s) >= work.arrival_s[0] + 0.2 * work.duration_s  # drop the first fifth
    done = result.completed[warm]
    ttft = np.nan_to_num(result.ttft_s[warm], nan=math.inf)
    tpot = np.where(result.output_tokens[warm] <= 1, 0.0, np.nan_to_num(result.tpot_s[warm], nan=math.inf))
    power = result.fleet_energy_j / result.makespan_s if result.makespan_s > 0 else 0.0
    hits = float(result.hit_disk_tokens.sum()) / float(result.prompt_tokens.sum())
    return _Point(float(((ttft <= TTFT_SLO_S) & done).mean()), float(((tpot <= TPOT_SLO_S) & done).mean()),
                  float(power), hits)


@dataclass(frozen=True)
class Profile:
    sizes_tb: tuple[int, ...]
    rates_per_s: tuple[float, ...]
    points: tuple[tuple[_Point, ...], ...]  # [size][rate]

    def at(self, k: int, rate_per_s: float) -> tuple[float, float, float]:
        """(TTFT attainment, TPOT attainment, power W) of size index ``k`` at ``rate_per_s`` (linear in rate)."""
        row = self.points[k]
        r = self.rates_per_s
        return (float(np.interp(rate_per_s, r, [p.ttft_ok for p in row])),
                float(np.interp(rate_per_s, r, [p.tpot_ok for p in row])),
                float(np.interp(rate_per_s, r, [p.power_w for p in row])))


def build_profile(rates_per_s: tuple[float, ...], *, sizes_tb: tuple[int, ...], requests: int,
                  seed: int = 7, shape: WorkloadShape | None = None) -> Profile:
    points = tuple(tuple(_point(s, r, requests, seed, shape) for r in rates_per_s) for s in sizes_tb)
    if sizes_tb != tuple(range(MAX_TB + 1)):  # interpolate the missing 1 TB sizes (smooth in the hit rate)
        full_sizes = tuple(range(MAX_TB + 1))
        pts = []
        for size in full_sizes:
            row = []
            for c in range(len(rates_per_s)):
                vals = [[getattr(points[i][c], f) for i in range(len(sizes_tb))]
                        for f in ("ttft_ok", "tpot_ok", "power_w", "hit_rate")]
                row.append(_Point(*(float(np.interp(size, sizes_tb, v)) for v in vals)))
            pts.append(tuple(row))
        return Profile(full_sizes, rates_per_s, tuple(pts))
    return Profile(sizes_tb, rates_per_s, points)


def sustainable_rate(*, requests: int, seed: int = 7, lo: float = 0.05, hi: float = 4.0,
                     shape: WorkloadShape | None = None, resolution: float = 0.02) -> float:
    """Highest prompt rate at which the full cache (16 TB) still meets both SLOs for 90 % of requests (bisection
    on the replay to ``resolution`` prompts/s): the peak the Azure shape is scaled to (GreenCache Sec. 6.1)."""
    def ok(rate: float) -> bool:
        p = _point(MAX_TB, rate, requests, seed, shape)
        return p.ttft_ok >= RHO and p.tpot_ok >= RHO
    if not ok(lo):
        return lo
    while hi - lo > resolution:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


# -----------------------------------------------------------------------------------------------------
# Carbon (GreenCache Eq. 1-5) and the ILP
# -----------------------------------------------------------------------------------------------------


def _other_embodied_g_per_h(params: carbon.CarbonParams) -> float:
    total = 0.0
    for name in OTHER_COMPONENTS:
        spec = params.component(name)
        total += carbon.amortised_embodied_g(duration_s=HOUR_S, lifetime_s=spec.lifetime_s, embodied_g=spec.embodied_g)
    return total


def hour_carbon_g(power_w: float, ci: float, size_tb: int, params: carbon.CarbonParams,
                  power: PowerAccounting = GPU_ONLY) -> dict[str, float]:
    """One hour of the server: operational (Eq. 2; ``power_w`` is the GPUs', ``power`` adds the host and the
    allocated SSD), the SSD allocated (Eq. 4) and the other components (Eq. 3)."""
    watts = power_w + power.host_w + power.ssd_w_per_tb * size_tb
    operational = carbon.operational_g(energy_kwh=watts * HOUR_S / 3.6e6, ci_g_per_kwh=ci, pue=params.pue)
    ssd = carbon.cache_tiers_embodied_g(dram_bytes=0, disk_bytes=size_tb * TB, duration_s=HOUR_S, params=params)
    other = _other_embodied_g_per_h(params)
    return {"operational_g": operational, "ssd_embodied_g": ssd, "other_embodied_g": other,
            "total_g": operational + ssd + other}


def _grid_day(profile: Profile, region: str, rates: list[float], params: carbon.CarbonParams,
              ci: list[float] | None = None, power: PowerAccounting = GPU_ONLY) -> dict[str, Any]:
    ci = day_ci(region) if ci is None else ci
    sizes = profile.sizes_tb
    rows_c, rows_a, rows_b = [], [], []
    for h in range(24):
        row_c, row_a, row_b = [], [], []
        for k, s in enumerate(sizes):
            a, b, w = profile.at(k, rates[h])
            row_c.append(hour_carbon_g(w, ci[h], s, params, power)["total_g"])
            row_a.append(a)
            row_b.append(b)
        rows_c.append(row_c)
        rows_a.append(row_a)
        rows_b.append(row_b)
    model = PoolCacheModel(region, "disk", [s * TB for s in sizes], [r * HOUR_S for r in rates], rows_c, rows_a,
                           rows_b, RHO, "simulator profile", ci)
    chosen, status, _, gap = solve_ilp([model], time_limit_s=30.0)
    if not chosen:
        raise RuntimeError(f"{region}: the ILP found no size plan meeting the SLO ({status})")
    picks = chosen[region]
    full = [len(sizes) - 1] * 24
    gc_h = [rows_c[h][k] for h, k in enumerate(picks)]
    full_h = [rows_c[h][k] for h, k in enumerate(full)]
    hourly_saving = [(f - g) / f for f, g in zip(full_h, gc_h)]
    return {
        "ci_mean_g_per_kwh": round(float(np.mean(ci)), 1),
        "cache_tb_by_hour": [sizes[k] for k in picks],
        "greencache_g": round(sum(gc_h), 1),
        "greencache_g_by_hour": [round(g, 2) for g in gc_h],
        "full_cache_g_by_hour": [round(f, 2) for f in full_h],
        "full_cache_g": round(sum(full_h), 1),
        "saved_vs_full_cache_pct": round(100.0 * (sum(full_h) - sum(gc_h)) / sum(full_h), 2),
        "max_hour_saved_pct": round(100.0 * max(hourly_saving), 2),
        "attainment_greencache": round(attainment(model, picks), 4),
        "attainment_full_cache": round(attainment(model, full), 4),
        "min_hour_attainment_greencache": round(min(min(rows_a[h][k], rows_b[h][k]) for h, k in enumerate(picks)), 4),
        "ilp": {"status": status, "gap": gap},
    }


def _from_size(profile: Profile, min_tb: int) -> Profile:
    """The profile without the sizes below ``min_tb`` (GreenCache's sweeps start at 1 TB: Sec. 3.1.3)."""
    keep = [i for i, s in enumerate(profile.sizes_tb) if s >= min_tb]
    return Profile(tuple(profile.sizes_tb[i] for i in keep), profile.rates_per_s, tuple(profile.points[i] for i in keep))


# the decomposition: ours -> the paper's setting, one assumption at a time (issue 18)
DECOMPOSITION: tuple[tuple[str, str, Assumptions], ...] = (
    ("ours", "ours: life-cycle CI, GPU power, 6-turn conversations", OURS),
    ("ci_direct", "ours + GreenCache's CI (direct, CarbonCast)", replace(OURS, ci_kind="direct")),
    ("power_whole_server", "ours + whole-server power", replace(OURS, power=WHOLE_SERVER)),
    ("workload_paper", "ours + the paper's workload shape", replace(OURS, workload=PAPER_WORKLOAD)),
    ("load_code_service", "ours + the Azure code service's day", replace(OURS, azure_service="code")),
    ("paper_without_ci_direct", "the paper's setting, but life-cycle CI", replace(PAPER_SETTING, ci_kind="lifecycle")),
    ("paper_without_whole_server", "the paper's setting, but GPU power only", replace(PAPER_SETTING, power=GPU_ONLY)),
    ("paper_without_workload", "the paper's setting, but our workload", replace(PAPER_SETTING, workload=OURS_WORKLOAD)),
    ("paper_without_code_service", "the paper's setting, but the conv service's day",
     replace(PAPER_SETTING, azure_service="conv")),
    ("paper_setting", "the paper's setting (all four)", PAPER_SETTING),
)


def _prompt_stats(shape: WorkloadShape) -> dict[str, float]:
    p = _turns(1, shape).prompt
    return {"mean_tokens": round(float(p.mean())), "p90_tokens": round(float(np.percentile(p, 90))),
            "share_over_1000_tokens": round(float((p > 1000).mean()), 3)}


def run(quick: bool = False) -> dict[str, Any]:
    """Reproduce GreenCache's headline (see the module docstring). ``quick``: fewer replayed requests and sizes
    (the others interpolated in size), for tests; the full run replays every 1 TB size."""
    requests = 300 if quick else 1500
    sizes = (0, 2, 4, 8, 12, 16) if quick else tuple(range(MAX_TB + 1))
    setups: dict[WorkloadShape, tuple[float, Profile]] = {}

    def setup(shape: WorkloadShape, service: str = "conv") -> tuple[float, list[float], Profile]:
        if shape not in setups:
            peak = sustainable_rate(requests=requests, shape=shape, resolution=0.05 if quick else 0.02)
            ladder = (LADDER_FLOOR * peak,
                      *(float(x) for x in np.linspace(LADDER_LOW * peak, peak, 3 if quick else 6)))
            setups[shape] = (peak, build_profile(ladder, sizes_tb=sizes, requests=requests, shape=shape))
        peak, profile = setups[shape]
        return peak, [peak * s for s in azure_day_shape(service)], profile

    params = carbon.load_default_params()

    def days(a: Assumptions) -> dict[str, dict[str, Any]]:
        _, rates, profile = setup(a.workload, a.azure_service)
        return {r: _grid_day(profile, r, rates, params, ci=day_ci(r, a.ci_kind), power=a.power) for r in REGIONS}

    decomposition = []
    runs: dict[str, dict[str, dict[str, Any]]] = {}
    for key, label, a in DECOMPOSITION:
        runs[key] = per = days(a)
        saved = {r: g["saved_vs_full_cache_pct"] for r, g in per.items()}
        decomposition.append({
            "row": key, "label": label, "ci": a.ci_kind, "power": a.power.name, "workload": a.workload.name,
            "azure_service": a.azure_service,
            "saved_vs_full_cache_pct": saved,
            "fr_max_hour_saved_pct": per["FR"]["max_hour_saved_pct"],
            "mean_of_grids_pct": round(float(np.mean(list(saved.values()))), 2),
            "fr_cache_tb_mean": round(float(np.mean(per["FR"]["cache_tb_by_hour"])), 1),
            "attainment_min": min(g["attainment_greencache"] for g in per.values()),
            "fr_within_20pct_of_15.1": abs(saved["FR"] / 15.1 - 1.0) <= TOLERANCE,
        })
    per_grid = runs["paper_setting"]
    peak, rates, profile = setup(PAPER_SETTING.workload, PAPER_SETTING.azure_service)
    fr = per_grid["FR"]
    lo, hi = PAPER["carbon_saved_vs_full_cache_per_grid_range_pct"]["value"]
    checks = {
        "FR mean saving within +-20 % of 15.1 %":
            abs(fr["saved_vs_full_cache_pct"] / 15.1 - 1.0) <= TOLERANCE,
        "FR max-hour saving within +-20 % of 25.3 %":
            abs(fr["max_hour_saved_pct"] / 25.3 - 1.0) <= TOLERANCE,
        "every grid's saving within the paper's range 6.9-20.4 % widened by 20 %":
            all(lo * (1 - TOLERANCE) <= g["saved_vs_full_cache_pct"] <= hi * (1 + TOLERANCE) for g in per_grid.values()),
        "mean of the grids within +-20 % of 12.6 %":
            abs(float(np.mean([g["saved_vs_full_cache_pct"] for g in per_grid.values()])) / 12.6 - 1.0) <= TOLERANCE,
        "CISO best hour within +-20 % of 6.91 %":
            abs(per_grid["CISO"]["max_hour_saved_pct"] / 6.91 - 1.0) <= TOLERANCE,
        "SLO attainment >= 90 % on every grid":
            all(g["attainment_greencache"] >= RHO for g in per_grid.values()),
    }
    # What-ifs around the paper's setting (not the headline): FR at the CI GreenCache quotes for it, and the Azure
    # peak at 80 % of the sustainable rate (slack the SLO leaves to a smaller cache).
    power = PAPER_SETTING.power
    fr_ci = day_ci("FR", PAPER_SETTING.ci_kind)
    scaled = [c * FR_CI_PAPER_G_PER_KWH / float(np.mean(fr_ci)) for c in fr_ci]
    what_if = {
        "FR_ci_scaled_to_33_g_per_kwh": _brief(_grid_day(profile, "FR", rates, params, ci=scaled, power=power)),
        "FR_peak_at_0.8_sustainable": _brief(_grid_day(profile, "FR", [0.8 * r for r in rates], params, ci=fr_ci,
                                                       power=power)),
        "FR_sizes_1_to_16_tb": _brief(_grid_day(_from_size(profile, 1), "FR", rates, params, ci=fr_ci, power=power)),
    }
    if not quick:  # the evaluation's default conversations (4 turns), in the paper's CI and power
        short_peak, short_rates, short_profile = setup(SHORT_WORKLOAD, PAPER_SETTING.azure_service)
        what_if["FR_conversations_4_turns"] = {
            "peak_rate_prompts_per_s": round(short_peak, 3),
            **_brief(_grid_day(short_profile, "FR", short_rates, params, ci=fr_ci, power=power))}
    saved = {region: g["saved_vs_full_cache_pct"] for region, g in per_grid.items()}
    # the paper's figures, ours (in the paper's setting) under the same keys (the headline table pairs them)
    ours: dict[str, Any] = {
        "carbon_saved_vs_full_cache_fr_mean_pct": fr["saved_vs_full_cache_pct"],
        "carbon_saved_vs_full_cache_fr_max_hour_pct": fr["max_hour_saved_pct"],
        "carbon_saved_vs_full_cache_per_grid_range_pct": [min(saved.values()), max(saved.values())],
        "carbon_saved_vs_full_cache_mean_of_grids_pct": round(float(np.mean(list(saved.values()))), 2),
        "carbon_saved_vs_full_cache_ciso_max_pct": per_grid["CISO"]["max_hour_saved_pct"],
        "slo_attainment_min": min(g["attainment_greencache"] for g in per_grid.values()),
        "carbon_saved_vs_full_cache_by_grid_pct": saved,
        "carbon_saved_fr_with_our_defaults_pct": runs["ours"]["FR"]["saved_vs_full_cache_pct"],
    }
    detail = {
        "per_grid": per_grid,
        "decomposition": decomposition,
        "assumptions": {"ours": _describe(OURS), "paper": _describe(PAPER_SETTING)},
        "what_if": what_if,
        "peak_rate_prompts_per_s": round(peak, 3),
        "peak_rate_prompts_per_s_by_workload": {s.name: round(v[0], 3) for s, v in setups.items()},
        "azure_trough_over_peak": {s: round(min(azure_day_shape(s)), 3) for s in ("conv", "code")},
        "rates_prompts_per_s": [round(r, 3) for r in rates],
        "hit_rate_replayed_by_size": {str(s): round(profile.points[i][-1].hit_rate, 3)
                                      for i, s in enumerate(profile.sizes_tb) if s in (0, 1, 2, 4, 8, 16)},
        "implied_paper_server_power_w": round(_implied_paper_power_w(params), 0),
        "fr_best_hour": _best_hour(per_grid["FR"], profile, rates, fr_ci),
        "checks": checks,
    }
    notes = _notes(per_grid, runs["ours"], params, peak)
    return {"seed": "GreenCache", "setting": SETTING, "paper": PAPER, "ours": ours, "detail": detail,
            "within_tolerance": all(checks.values()), "notes": notes}


def _describe(a: Assumptions) -> dict[str, Any]:
    return {"ci": a.ci_kind, "azure_service": a.azure_service, "power": {"name": a.power.name, "host_w": a.power.host_w,
                                       "ssd_w_per_tb": a.power.ssd_w_per_tb},
            "workload": {"name": a.workload.name, "mean_turns": a.workload.mean_turns,
                         "mean_user_tokens": a.workload.mean_user_tokens,
                         "mean_output_tokens": a.workload.mean_output_tokens, **_prompt_stats(a.workload)}}


def _best_hour(day: dict[str, Any], profile: Profile, rates: list[float], ci: list[float]) -> dict[str, Any]:
    """FR's best hour in the paper's setting: its rate, CI, size and the modelled server power with Full Cache
    (to set against the ~1 kW GreenCache's best hour implies)."""
    saved = [(f - g) / f for f, g in zip(day["full_cache_g_by_hour"], day["greencache_g_by_hour"])]
    h = int(np.argmax(saved))
    gpu_w = profile.at(len(profile.sizes_tb) - 1, rates[h])[2]
    server_w = gpu_w + PAPER_SETTING.power.host_w + PAPER_SETTING.power.ssd_w_per_tb * MAX_TB
    return {"hour_utc": h, "rate_prompts_per_s": round(rates[h], 3), "ci_g_per_kwh": ci[h],
            "cache_tb": day["cache_tb_by_hour"][h], "server_power_w_full_cache": round(server_w)}


def _implied_paper_power_w(params: carbon.CarbonParams) -> float:
    """The server power GreenCache's best FR hour implies: 25.3 % saved at midnight (CarbonCast direct CI of that
    hour) by 15 TB less SSD, if the operational carbon barely changes between 1 and 16 TB at that load."""
    ci = direct_ci_2022_07_06()["FR"][0]
    ssd_saved = hour_carbon_g(0.0, 0.0, 15, params)["ssd_embodied_g"]
    full = ssd_saved / 0.253
    fixed = hour_carbon_g(0.0, 0.0, MAX_TB, params)
    operational = full - fixed["ssd_embodied_g"] - fixed["other_embodied_g"]
    return operational / ci * 1000.0


def _brief(day: dict[str, Any]) -> dict[str, Any]:
    return {k: day[k] for k in ("saved_vs_full_cache_pct", "max_hour_saved_pct", "attainment_greencache",
                                "cache_tb_by_hour")}


def _notes(per_grid: dict[str, Any], ours_grid: dict[str, Any], params: carbon.CarbonParams,
           peak: float) -> list[str]:
    ssd_full = hour_carbon_g(0.0, 0.0, MAX_TB, params)["ssd_embodied_g"]
    other = _other_embodied_g_per_h(params)
    pm = PerfModel(load_profile(PROFILE))
    ours_w, paper_w = _prompt_stats(OURS_WORKLOAD), _prompt_stats(PAPER_WORKLOAD)
    notes = [
        ("The headline (per_grid, ours) runs in the paper's setting (assumptions.paper); our product defaults are "
        "the decomposition's first row, and each other row switches one assumption (detail.decomposition)."),
        ("Hit rate per size is GreenCache's Table 3 (LCS), not simulated: its ShareGPT pool (200k prompts of "
        "warm-up) is not shipped."),
        (f"Full Cache's SSD costs {ssd_full:.1f} gCO2e/h (16 TB x 30 kgCO2e/TB over 5 years) against "
        f"{other:.1f} g/h for the GPUs, CPU and DRAM (Table 1): the saving is bounded by the SSD's share of the "
        "hour's total, which falls as CI rises."),
        ("CI: the product ships Electricity Maps' life-cycle CI (FR "
        f"{ours_grid['FR']['ci_mean_g_per_kwh']} g/kWh on 6 July 2022); GreenCache took CarbonCast's (Sec. 6.1), "
        f"direct CI: FR {per_grid['FR']['ci_mean_g_per_kwh']}, FI {per_grid['FI']['ci_mean_g_per_kwh']}, CISO "
        f"{per_grid['CISO']['ci_mean_g_per_kwh']} g/kWh that day (GreenCache quotes FR at 33). CarbonCast's ES "
        f"direct file ends in 2021: ES uses Electricity Maps' direct CI of the day ({per_grid['ES']['ci_mean_g_per_kwh']}"
        " g/kWh)."),
        (f"Power: the simulator models the 4 GPUs (idle {pm.profile.idle_w:.0f} W to {pm.profile.max_w:.0f} W); the "
        f"paper's accounting (Sec. 5.2) adds the CPU (RAPL) and DRAM/SSD datasheet power; its figures are not "
        f"printed, so WHOLE_SERVER assumes {CPU_W:.0f} W CPU + {DRAM_W:.0f} W DRAM + {SSD_W_PER_TB:g} W per "
        f"allocated SSD TB. GreenCache's best FR hour (25.3 % by 15 TB less at CarbonCast's {direct_ci_2022_07_06()['FR'][0]} g/kWh) "
        f"implies a server of ~{_implied_paper_power_w(params):.0f} W at its midnight load."),
        ("Workload: the paper pins its ShareGPT sample by three figures: 77.2 % of prompts over 1,000 tokens (Fig. 4), "
        "a token hit rate of 0.71 at 16 TB (Table 3, so at least 71 % of prompt tokens are earlier turns), and a "
        "1 TB cache meeting the 2.5 s TTFT SLO at FR's quiet hours (Fig. 14a), which needs the P90 prompt to prefill "
        "in under ~2.5 s (about 6k tokens on this profile). Our generator (geometric turns) cannot meet all three: "
        f"ours (6 turns x 300/250 tokens) has {ours_w['share_over_1000_tokens']:.1%} over 1,000 tokens, P90 "
        f"{ours_w['p90_tokens']} tokens and its reusable share caps the hit rate at ~0.60; PAPER_WORKLOAD (10 turns "
        f"x 150/100 tokens) has {paper_w['share_over_1000_tokens']:.1%}, P90 {paper_w['p90_tokens']} and reaches "
        "0.71. GreenCache's own sample is not shipped."),
        ("Load: the paper names 'the Azure LLM trace' without the service. The conversation service's day has its "
        "trough at 0.55 of its peak; the code service's at 0.10. With the conv day no hour is quiet enough for a "
        "1-2 TB cache under a Table-3 hit curve (decomposition row paper_without_code_service), which the paper's "
        "FR timeline shows; the code day is that inference, not a stated fact of the paper."),
        (f"The Azure shape is peak-scaled to {peak:.2f} prompts/s (paper's setting), the highest rate at which the "
        "16 TB cache meets both SLOs for 90 % of requests in the replay (GreenCache: 'the peak rate is still within "
        "our system's sustainable throughput')."),
        ("Forecasts are the actual rate and CI (oracle); GreenCache Sec. 6.5 measures forecast and profile errors at "
        "< 1 % of the saving."),
    ]
    return notes


def main(argv: list[str] | None = None) -> int:
    quick = bool(argv and "--quick" in argv)
    print(json.dumps(run(quick=quick)))  # one JSON object on the last line (HiGHS may print a banner first)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
