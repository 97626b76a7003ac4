"""GreenCache's carbon model (Eq. 1-5) for one hour of the server and its ILP (Eq. 6) over one grid's day: the sizes
the ILP picks from the profile at each hour's rate and CI, against Full Cache.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from greenserve.common import carbon
from greenserve.common.carbon_params import CarbonParams
from greenserve.common.embodied_carbon import amortised_embodied_g
from greenserve.evaluation.headlines.greencache_profile import CacheSizeProfile
from greenserve.evaluation.headlines.greencache_setting import (
    GPU_ONLY,
    HOUR_S,
    MAX_TB,
    OTHER_COMPONENTS,
    RHO,
    TB,
    PowerAccounting,
    day_ci,
    direct_ci_2022_07_06,
)
from greenserve.optimizer.solvers.cache_greencache import (
    PoolCacheModel,
    attainment,
    solve_ilp,
)

__all__ = ["grid_day", "hour_carbon_g", "implied_paper_power_w", "other_embodied_g_per_h"]


def other_embodied_g_per_h(params: CarbonParams) -> float:
    total = 0.0
    for name in OTHER_COMPONENTS:
        spec = params.component(name)
        total += amortised_embodied_g(duration_s=HOUR_S, lifetime_s=spec.lifetime_s, embodied_g=spec.embodied_g)
    return total


def hour_carbon_g(power_w: float, ci: float, size_tb: int, params: CarbonParams,
                  power: PowerAccounting = GPU_ONLY) -> dict[str, float]:
    """One hour of the server: operational (Eq. 2; ``power_w`` is the GPUs', ``power`` adds the host and the
    allocated SSD), the SSD allocated (Eq. 4) and the other components (Eq. 3)."""
    watts = power_w + power.host_w + power.ssd_w_per_tb * size_tb
    operational = carbon.operational_g(energy_kwh=watts * HOUR_S / 3.6e6, ci_g_per_kwh=ci, pue=params.pue)
    ssd = carbon.cache_tiers_embodied_g(dram_bytes=0, disk_bytes=size_tb * TB, duration_s=HOUR_S, params=params)
    other = other_embodied_g_per_h(params)
    return {"operational_g": operational, "ssd_embodied_g": ssd, "other_embodied_g": other,
            "total_g": operational + ssd + other}


def grid_day(profile: CacheSizeProfile, region: str, rates: list[float], params: CarbonParams,
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


def implied_paper_power_w(params: CarbonParams) -> float:
    """The server power GreenCache's best FR hour implies: 25.3 % saved at midnight (CarbonCast direct CI of that
    hour) by 15 TB less SSD, if the operational carbon barely changes between 1 and 16 TB at that load."""
    ci = direct_ci_2022_07_06()["FR"][0]
    ssd_saved = hour_carbon_g(0.0, 0.0, 15, params)["ssd_embodied_g"]
    full = ssd_saved / 0.253
    fixed = hour_carbon_g(0.0, 0.0, MAX_TB, params)
    operational = full - fixed["ssd_embodied_g"] - fixed["other_embodied_g"]
    return operational / ci * 1000.0
