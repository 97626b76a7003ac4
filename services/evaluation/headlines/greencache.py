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

``run(quick)`` returns the seeds' headline convention (``services/evaluation/headlines``): ``seed``, ``setting``,
``paper``, ``ours`` (the paper's figures under the same keys, then two of ours alone), ``within_tolerance``,
``notes``, and ``detail`` (per grid: hourly sizes, carbon, attainment, the ILP's status; the what-ifs; the checks). ``python -m greenserve.evaluation.headlines.greencache``
prints it as one line of JSON (``--quick`` for the short run).
"""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from greenserve.common import carbon
from greenserve.evaluation import grids
from greenserve.optimizer.solvers.cache_greencache import PoolCacheModel, attainment, solve_ilp
from greenserve.simulator.perf_model import PerfModel, load_profile
from greenserve.simulator.replay import EngineSpec, FleetConfig, replay
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
LADDER_LOW = 0.3  # profiled rates: 0.3 x peak .. peak (the Azure day's trough is ~0.55 x its peak)
# mean_turns=6 gives ~75 % of prompts over 1,000 tokens (GreenCache Fig. 4: 77.2 %), as in fidelity.py; 4 is the
# evaluation's default workload (shorter contexts: P90 4.7k tokens instead of 7.1k), a what-if
MEAN_TURNS = 6.0
SHORT_MEAN_TURNS = 4.0
FR_CI_PAPER_G_PER_KWH = 33.0

# GreenCache Sec. 6.1: "The training data and groundtruth CI come from the CarbonCast dataset [49]". CarbonCast's
# *direct* (operational) CI of 6 July 2022, hours 00-23 UTC, column carbon_intensity of GitHub carbonfirst/CarbonCast
# data/EU_DATA/FR/FR_direct_emissions.csv (commit 92ea600d), data/EU_DATA/FI/FI_direct_emissions.csv (2aed0db9),
# data/CISO/CISO_direct_emissions.csv (3b927b0d); rows 30768-30791. ES's direct file is not in the snapshot we read.
# FR's mean, 37.1 g/kWh, is close to the 33 g/kWh GreenCache quotes for FR; the shipped life-cycle series is 94.3.
CARBONCAST_DIRECT_2022_07_06: dict[str, tuple[float, ...]] = {
    "FR": (26.59, 27.35, 27.52, 29.09, 37.94, 39.53, 39.78, 39.98, 35.68, 29.19, 31.22, 33.08, 33.33, 32.8, 32.92,
           34.66, 36.58, 38.59, 43.11, 50.47, 50.23, 48.88, 47.24, 45.54),
    "FI": (41.38, 43.18, 43.6, 49.55, 60.3, 62.6, 57.56, 55.8, 56.5, 57.96, 58.26, 59.5, 61.15, 63.59, 62.21, 63.8,
           62.74, 62.01, 63.46, 59.94, 61.53, 64.97, 59.18, 56.56),
    "CISO": (102.37, 117.29, 156.75, 205.21, 218.66, 213.82, 200.28, 199.75, 186.48, 172.73, 166.73, 168.64, 174.77,
             193.2, 169.37, 102.66, 97.02, 98.11, 95.91, 93.69, 88.92, 87.64, 93.82, 102.55),
}  # GreenCache Sec. 3.2.2 / Fig. 2a: FR's average CI
HOUR_S = 3600.0
BLOCK_TOKENS = 256
AZURE_FILE = "azure2024_conv_requests_hourly.csv"
AZURE_DAY = "2024-05-13"  # the trace's first full weekday (a Monday)

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
    "slo_attainment_min": {"value": 0.9, "citation": "GreenCache Sec. 6.1 SLOs and Fig. 13: P90 TTFT <= 2.5 s and "
                                                     "P90 TPOT <= 0.2 s all day"},
}

SETTING: dict[str, Any] = {
    "model": "Llama-3 70B INT8 on 4 x L40 (simulator profile " + PROFILE + ")",
    "task": "multi-turn conversations (ShareGPT-like, 8k context window)",
    "cache": f"SSD (LMCache L2) 0-{MAX_TB} TB in 1 TB steps, hit rate of GreenCache Table 3 (LCS)",
    "load": f"Azure LLM inference trace 2024, conversation service, hourly shape of {AZURE_DAY}, peak scaled to "
            "the server's sustainable rate with the full cache",
    "ci": "6 July 2022, FR, FI, ES, CISO (life-cycle CI, Electricity Maps)",
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


def azure_day_shape() -> list[float]:
    """The 24 hourly request counts of ``AZURE_DAY`` in the shipped Azure 2024 conversation trace, divided by
    their maximum (peak = 1)."""
    resource = resources.files("greenserve.common").joinpath("data", "demo", AZURE_FILE)
    with resources.as_file(resource) as path, path.open(newline="", encoding="utf-8") as handle:
        rows = [(r["hour_start_utc"], float(r["requests"])) for r in csv.DictReader(handle)]
    day = [v for t, v in rows if t.startswith(AZURE_DAY)]
    if len(day) != 24:
        raise ValueError(f"{AZURE_FILE}: {AZURE_DAY} has {len(day)} hours, expected 24")
    peak = max(day)
    return [v / peak for v in day]


def day_ci(region: str) -> list[float]:
    """The 24 hourly CIs (gCO2e/kWh) of ``region`` on 6 July 2022 (shipped evaluation data)."""
    return list(grids.shipped()[region].window(int(DAY.timestamp()), 24))


# -----------------------------------------------------------------------------------------------------
# The profile: cache size x request rate -> attainment and power (GreenCache Sec. 5.2), by replay
# -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Turns:
    """Conversation turns to draw requests from: prompt, output and the previous turn's prompt (the context
    LMCache saved at that turn's prefill, which this turn can reuse)."""

    prompt: np.ndarray
    output: np.ndarray
    prev_prompt: np.ndarray


@lru_cache(maxsize=4)
def _turns(seed: int, mean_turns: float) -> _Turns:
    conv = multi_turn_workload(3000, 1.0, seed=seed, mean_turns=mean_turns, block_tokens=BLOCK_TOKENS)
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
              mean_turns: float = MEAN_TURNS) -> tuple[Workload, list[int]]:
    """``n`` turns drawn at random (GreenCache: a random conversation's next turn), Poisson arrivals at
    ``rate_per_s``; each request's previous-turn context is on the SSD with the probability that makes the token
    hit rate ``hit_rate(size_tb)``. Block ids are unique per request, so the only hits are the preloaded ones.
    Returns the workload and the blocks to preload on the disk tier."""
    turns = _turns(1, mean_turns)
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


def _point(size_tb: float, rate_per_s: float, n: int, seed: int, mean_turns: float = MEAN_TURNS) -> _Point:
    work, preload = _workload(rate_per_s, n, size_tb, seed, mean_turns)
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
                  seed: int = 7, mean_turns: float = MEAN_TURNS) -> Profile:
    points = tuple(tuple(_point(s, r, requests, seed, mean_turns) for r in rates_per_s) for s in sizes_tb)
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
                     mean_turns: float = MEAN_TURNS, resolution: float = 0.02) -> float:
    """Highest prompt rate at which the full cache (16 TB) still meets both SLOs for 90 % of requests (bisection
    on the replay to ``resolution`` prompts/s): the peak the Azure shape is scaled to (GreenCache Sec. 6.1)."""
    def ok(rate: float) -> bool:
        p = _point(MAX_TB, rate, requests, seed, mean_turns)
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


def hour_carbon_g(power_w: float, ci: float, size_tb: int, params: carbon.CarbonParams) -> dict[str, float]:
    """One hour of the server: operational (Eq. 2), the SSD allocated (Eq. 4) and the other components (Eq. 3)."""
    operational = carbon.operational_g(energy_kwh=power_w * HOUR_S / 3.6e6, ci_g_per_kwh=ci, pue=params.pue)
    ssd = carbon.cache_tiers_embodied_g(dram_bytes=0, disk_bytes=size_tb * TB, duration_s=HOUR_S, params=params)
    other = _other_embodied_g_per_h(params)
    return {"operational_g": operational, "ssd_embodied_g": ssd, "other_embodied_g": other,
            "total_g": operational + ssd + other}


def _grid_day(profile: Profile, region: str, rates: list[float], params: carbon.CarbonParams,
              ci: list[float] | None = None) -> dict[str, Any]:
    ci = day_ci(region) if ci is None else ci
    sizes = profile.sizes_tb
    rows_c, rows_a, rows_b = [], [], []
    for h in range(24):
        row_c, row_a, row_b = [], [], []
        for k, s in enumerate(sizes):
            a, b, w = profile.at(k, rates[h])
            row_c.append(hour_carbon_g(w, ci[h], s, params)["total_g"])
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
        "full_cache_g": round(sum(full_h), 1),
        "saved_vs_full_cache_pct": round(100.0 * (sum(full_h) - sum(gc_h)) / sum(full_h), 2),
        "max_hour_saved_pct": round(100.0 * max(hourly_saving), 2),
        "attainment_greencache": round(attainment(model, picks), 4),
        "attainment_full_cache": round(attainment(model, full), 4),
        "min_hour_attainment_greencache": round(min(min(rows_a[h][k], rows_b[h][k]) for h, k in enumerate(picks)), 4),
        "ilp": {"status": status, "gap": gap},
    }


def run(quick: bool = False) -> dict[str, Any]:
    """Reproduce GreenCache's headline (see the module docstring). ``quick``: fewer replayed requests and sizes
    (the others interpolated in size), for tests; the full run replays every 1 TB size."""
    requests = 300 if quick else 1500
    sizes = (0, 2, 4, 8, 12, 16) if quick else tuple(range(MAX_TB + 1))
    shape = azure_day_shape()

    def setup(mean_turns: float) -> tuple[float, list[float], Profile]:
        peak = sustainable_rate(requests=requests, mean_turns=mean_turns, resolution=0.05 if quick else 0.02)
        ladder = tuple(float(x) for x in np.linspace(LADDER_LOW * peak, peak, 3 if quick else 6))
        return peak, [peak * s for s in shape], build_profile(ladder, sizes_tb=sizes, requests=requests,
                                                                mean_turns=mean_turns)

    peak, rates, profile = setup(MEAN_TURNS)
    params = carbon.load_default_params()
    per_grid = {region: _grid_day(profile, region, rates, params) for region in REGIONS}
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
        "SLO attainment >= 90 % on every grid":
            all(g["attainment_greencache"] >= RHO for g in per_grid.values()),
    }
    # What-ifs on the assumptions that differ most (not the headline): FR at the CI GreenCache quotes for it, and
    # the Azure peak at 80 % of the sustainable rate (slack the SLO leaves to a smaller cache).
    fr_ci = day_ci("FR")
    scaled = [c * FR_CI_PAPER_G_PER_KWH / float(np.mean(fr_ci)) for c in fr_ci]
    what_if = {
        "FR_ci_scaled_to_33_g_per_kwh": _brief(_grid_day(profile, "FR", rates, params, ci=scaled)),
        "FR_peak_at_0.8_sustainable": _brief(_grid_day(profile, "FR", [0.8 * r for r in rates], params)),
        "FR_peak_at_0.8_and_ci_33": _brief(_grid_day(profile, "FR", [0.8 * r for r in rates], params, ci=scaled)),
    }
    for region, series in CARBONCAST_DIRECT_2022_07_06.items():
        day = _grid_day(profile, region, rates, params, ci=list(series))
        what_if[f"{region}_carboncast_direct_ci"] = {"ci_mean_g_per_kwh": day["ci_mean_g_per_kwh"], **_brief(day)}
    if not quick:  # shorter conversations: a second profile (the evaluation's default workload)
        short_peak, short_rates, short_profile = setup(SHORT_MEAN_TURNS)
        key = f"FR_conversations_mean_{SHORT_MEAN_TURNS:g}_turns"
        what_if[key] = {"peak_rate_prompts_per_s": round(short_peak, 3),
                        **_brief(_grid_day(short_profile, "FR", short_rates, params))}
        what_if[key + "_and_ci_33"] = _brief(_grid_day(short_profile, "FR", short_rates, params, ci=scaled))
    saved = {region: g["saved_vs_full_cache_pct"] for region, g in per_grid.items()}
    # the paper's figures, ours under the same keys (the headline table pairs them), then ours alone
    ours: dict[str, Any] = {
        "carbon_saved_vs_full_cache_fr_mean_pct": fr["saved_vs_full_cache_pct"],
        "carbon_saved_vs_full_cache_fr_max_hour_pct": fr["max_hour_saved_pct"],
        "carbon_saved_vs_full_cache_per_grid_range_pct": [min(saved.values()), max(saved.values())],
        "carbon_saved_vs_full_cache_mean_of_grids_pct": round(float(np.mean(list(saved.values()))), 2),
        "slo_attainment_min": min(g["attainment_greencache"] for g in per_grid.values()),
        "carbon_saved_vs_full_cache_by_grid_pct": saved,
        "carbon_saved_fr_with_carboncast_direct_ci_pct": what_if["FR_carboncast_direct_ci"]["saved_vs_full_cache_pct"],
    }
    detail = {
        "per_grid": per_grid,
        "what_if": what_if,
        "peak_rate_prompts_per_s": round(peak, 3),
        "rates_prompts_per_s": [round(r, 3) for r in rates],
        "hit_rate_replayed_by_size": {str(s): round(profile.points[i][-1].hit_rate, 3)
                                      for i, s in enumerate(profile.sizes_tb) if s in (0, 1, 2, 4, 8, 16)},
        "checks": checks,
    }
    notes = _notes(per_grid, params, peak)
    return {"seed": "GreenCache", "setting": SETTING, "paper": PAPER, "ours": ours, "detail": detail,
            "within_tolerance": all(checks.values()), "notes": notes}


def _brief(day: dict[str, Any]) -> dict[str, Any]:
    return {k: day[k] for k in ("saved_vs_full_cache_pct", "max_hour_saved_pct", "attainment_greencache",
                                "cache_tb_by_hour")}


def _notes(per_grid: dict[str, Any], params: carbon.CarbonParams, peak: float) -> list[str]:
    ssd_full = hour_carbon_g(0.0, 0.0, MAX_TB, params)["ssd_embodied_g"]
    other = _other_embodied_g_per_h(params)
    pm = PerfModel(load_profile(PROFILE))
    notes = [
        f"Hit rate per size is GreenCache's Table 3 (LCS), not simulated: its ShareGPT pool (200k prompts of "
        f"warm-up) is not shipped.",
        f"Full Cache's SSD costs {ssd_full:.1f} gCO2e/h (16 TB x 30 kgCO2e/TB over 5 years) against "
        f"{other:.1f} g/h for the GPUs, CPU and DRAM (Table 1): the saving is bounded by the SSD's share of the "
        f"hour's total, which falls as CI rises.",
        "CI: the shipped series is Electricity Maps' life-cycle CI; on 6 July 2022 FR averages "
        f"{per_grid['FR']['ci_mean_g_per_kwh']} g/kWh and FI {per_grid['FI']['ci_mean_g_per_kwh']} g/kWh. "
        "GreenCache took its CI from CarbonCast (Sec. 6.1) and quotes FR at 33 g/kWh; CarbonCast's direct CI of the "
        "day averages 37.1 (FR), 57.8 (FI), 146.1 (CISO) g/kWh (ours.what_if *_carboncast_direct_ci): a lower CI "
        "makes the SSD a larger share of the hour and the saving larger.",
        f"Operational energy is the GPUs' modelled power only (idle {pm.profile.idle_w:.0f} W to "
        f"{pm.profile.max_w:.0f} W for the 4 GPUs); GreenCache also measured the CPU (RAPL) and used DRAM/SSD "
        "datasheet power, constant terms that would lower every relative saving.",
        f"The Azure shape is peak-scaled to {peak:.2f} prompts/s, the highest rate at which the 16 TB cache meets "
        "both SLOs for 90 % of requests in the replay (GreenCache: 'the peak rate is still within our system's "
        "sustainable throughput').",
        "Forecasts are the actual rate and CI (oracle); GreenCache Sec. 6.5 measures forecast and profile errors at "
        "< 1 % of the saving.",
    ]
    return notes


def main(argv: list[str] | None = None) -> int:
    quick = bool(argv and "--quick" in argv)
    print(json.dumps(run(quick=quick)))  # one JSON object on the last line (HiGHS may print a banner first)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
