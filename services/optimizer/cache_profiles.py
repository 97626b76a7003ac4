"""Cache profiles for the GreenCache ILP: per cache size and request rate, TTFT and TPOT attainment and power.

GreenCache profiles a grid of cache size x request rate (Sec. 5.2: 500 prompts per point after the cache is warm).
Where the profiler has measured such a grid for a pool's model (profiles whose config has a cache size), it is used;
otherwise the simulator predicts it: GreenCache's multi-turn conversation workload (``multi_turn_workload``) is
replayed through one engine of the pool's performance model with a KV tier of each size, the first half of the
requests warming the cache and the second half measured. Predictions are cached per (performance profile, tier,
sizes, rates, SLO), so a fleet of similar pools costs one grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from greenserve.simulator.engine_profile import load_profile
from greenserve.simulator.perf_model import PerfModel
from greenserve.simulator.replay import replay
from greenserve.simulator.replay_fleet import EngineSpec, FleetConfig
from greenserve.simulator.workloads import multi_turn_workload

MEAN_TURNS = 4.0
MEASURED_REQUESTS = 240  # at least this many measured requests per point
WINDOW_MIN_S = 600.0  # conversations span minutes (30 s think time per turn): steady state needs a long window
MAX_REQUESTS = 3000
PREDICTED_SIZES = 6  # sizes replayed; the others are interpolated (attainment and power are smooth in size)


@dataclass(frozen=True)
class CacheGrid:
    """Attainment and power of one engine over sizes (rows) x rates (columns)."""

    sizes_bytes: tuple[int, ...]
    rates_per_s: tuple[float, ...]
    ttft_attainment: tuple[tuple[float, ...], ...]
    tpot_attainment: tuple[tuple[float, ...], ...]
    power_w: tuple[tuple[float, ...], ...]
    source: str

    def at(self, size_index: int, rate_per_s: float) -> tuple[float, float, float]:
        """(TTFT attainment, TPOT attainment, power) at ``rate_per_s``, interpolated in rate; beyond the grid's
        highest rate attainment falls as (highest rate / rate) and power stays at its last value."""
        rates = self.rates_per_s
        row = size_index
        if rate_per_s <= rates[0]:
            return self.ttft_attainment[row][0], self.tpot_attainment[row][0], self.power_w[row][0]
        if rate_per_s >= rates[-1]:
            scale = rates[-1] / rate_per_s
            return (self.ttft_attainment[row][-1] * scale, self.tpot_attainment[row][-1] * scale,
                    self.power_w[row][-1])
        return (float(np.interp(rate_per_s, rates, self.ttft_attainment[row])),
                float(np.interp(rate_per_s, rates, self.tpot_attainment[row])),
                float(np.interp(rate_per_s, rates, self.power_w[row])))


def _point(profile: str, tier: str, size_bytes: int, rate: float, slo: tuple[float, float],
           seed: int) -> tuple[float, float, float]:
    """One grid point: conversations arrive for a window long enough to reach steady state (the first third, the
    warm-up, is not measured); power = idle + measured energy per request x rate."""
    model = PerfModel(load_profile(profile))
    tokens = int(size_bytes / max(model.profile.kv_bytes_per_token, 1.0))
    window_s = min(max(WINDOW_MIN_S, MEASURED_REQUESTS * 1.5 / rate), MAX_REQUESTS / rate)
    n_conversations = max(4, int(rate / MEAN_TURNS * window_s))
    workload = multi_turn_workload(n_conversations, rate / MEAN_TURNS, seed=seed, mean_turns=MEAN_TURNS)
    spec = EngineSpec(profile, dram_capacity_tokens=tokens if tier == "dram" else 0,
                      disk_capacity_tokens=tokens if tier == "disk" else 0)
    result = replay(workload, FleetConfig((spec,), seed=seed))
    arrivals = np.asarray(result.arrival_s)
    measured = np.flatnonzero((arrivals >= window_s / 3.0) & (arrivals < window_s))
    if len(measured) == 0:
        return 0.0, 0.0, model.power_w(0.0)
    ttft = np.nan_to_num(result.ttft_s[measured], nan=math.inf)
    tpot = np.where(result.output_tokens[measured] <= 1, 0.0, np.nan_to_num(result.tpot_s[measured], nan=math.inf))
    done = result.completed[measured]
    ttft_ok = float(((ttft <= slo[0]) & done).mean())
    tpot_ok = float(((tpot <= slo[1]) & done).mean())
    energy = result.energy_j[measured][done]
    per_request_j = float(np.mean(energy)) if len(energy) else 0.0
    return ttft_ok, tpot_ok, float(model.power_w(0.0) + per_request_j * rate)


@lru_cache(maxsize=64)
def predict_grid(profile: str, tier: str, sizes_bytes: tuple[int, ...], rates_per_s: tuple[float, ...],
                 ttft_s: float, tpot_s: float) -> CacheGrid:
    """Simulator prediction of the grid (deterministic): up to PREDICTED_SIZES sizes replayed (the smallest, the
    largest and evenly between), the rest interpolated in size."""
    if tier not in ("dram", "disk"):
        raise ValueError("tier: must be 'dram' or 'disk'")
    idx = sorted({int(round(i)) for i in np.linspace(0, len(sizes_bytes) - 1, min(PREDICTED_SIZES, len(sizes_bytes)))})
    replayed = {i: [_point(profile, tier, sizes_bytes[i], rate, (ttft_s, tpot_s), seed=11) for rate in rates_per_s]
                for i in idx}
    xs = [sizes_bytes[i] for i in idx]
    ttft_rows, tpot_rows, power_rows = [], [], []
    for size in sizes_bytes:
        cols = [[float(np.interp(size, xs, [replayed[i][c][m] for i in idx])) for c in range(len(rates_per_s))]
                for m in range(3)]
        ttft_rows.append(tuple(cols[0]))
        tpot_rows.append(tuple(cols[1]))
        power_rows.append(tuple(cols[2]))
    return CacheGrid(sizes_bytes, rates_per_s, tuple(ttft_rows), tuple(tpot_rows), tuple(power_rows),
                     f"predicted by the simulator ({profile}, multi-turn conversations, {tier} tier, "
                     f"{len(idx)} sizes replayed)")


def rate_ladder(capacity_per_s: float, peak_per_s: float, n: int = 6) -> tuple[float, ...]:
    """Rates to profile: geometric from a tenth of the larger of capacity and peak up to 1.5 times it."""
    top = max(capacity_per_s, peak_per_s, 0.05) * 1.5
    low = top / 15.0
    return tuple(float(x) for x in np.geomspace(low, top, n))
