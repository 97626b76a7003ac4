"""GreenCache's headline in its own setting (services/evaluation/headlines/greencache.py): inputs and one quick run."""

from __future__ import annotations

import math

import pytest

from greenserve.common import carbon
from greenserve.evaluation.headlines import greencache as gc


def test_hit_rate_follows_greencache_table3() -> None:
    for size, rate in gc.TABLE3_LCS.items():
        assert gc.hit_rate(size) == pytest.approx(rate)
    assert gc.hit_rate(0) == 0.0
    assert gc.hit_rate(1) < gc.hit_rate(3) < gc.hit_rate(4)  # log-linear between the table's points
    assert gc.hit_rate(32) == pytest.approx(0.71)  # capped at the 16 TB figure
    with pytest.raises(ValueError, match="size_tb"):
        gc.hit_rate(-1)


def test_azure_day_shape_is_24_hours_peaking_at_one() -> None:
    shape = gc.azure_day_shape()
    assert len(shape) == 24
    assert max(shape) == pytest.approx(1.0)
    assert 0.3 < min(shape) < 1.0


def test_hour_carbon_charges_the_allocated_ssd_per_greencache_eq4() -> None:
    params = carbon.load_default_params()
    empty = gc.hour_carbon_g(800.0, 100.0, 0, params)
    full = gc.hour_carbon_g(800.0, 100.0, 16, params)
    assert empty["ssd_embodied_g"] == 0.0
    # 16 TB x 30 kgCO2e/TB over 5 years, for one hour
    assert full["ssd_embodied_g"] == pytest.approx(16 * 30_000.0 / (5 * 365 * 24), rel=1e-6)
    assert full["operational_g"] == pytest.approx(0.8 * 100.0)
    assert full["total_g"] == pytest.approx(full["operational_g"] + full["ssd_embodied_g"] + full["other_embodied_g"])


def test_replayed_hit_rate_tracks_the_cache_size() -> None:
    small = gc._point(1, 0.2, 200, seed=3)
    large = gc._point(16, 0.2, 200, seed=3)
    none = gc._point(0, 0.2, 200, seed=3)
    assert none.hit_rate == 0.0
    assert 0.0 < small.hit_rate < large.hit_rate
    assert large.ttft_ok >= none.ttft_ok  # reuse shortens prefill


def test_quick_run_reports_the_convention_and_meets_the_slo() -> None:
    out = gc.run(quick=True)
    assert out["seed"] == "GreenCache"
    assert set(out) >= {"seed", "setting", "paper", "ours", "within_tolerance", "notes"}
    assert out["paper"]["carbon_saved_vs_full_cache_fr_mean_pct"]["value"] == 15.1
    assert "Sec. 6.2" in out["paper"]["carbon_saved_vs_full_cache_fr_mean_pct"]["citation"]
    ours, detail = out["ours"], out["detail"]
    # every paper figure has ours under the same key (the headline table pairs them)
    assert set(out["paper"]) <= set(ours)
    assert set(detail["per_grid"]) == {"FR", "FI", "ES", "CISO"}
    for region, day in detail["per_grid"].items():
        assert len(day["cache_tb_by_hour"]) == 24
        assert all(0 <= s <= 16 for s in day["cache_tb_by_hour"])
        # the ILP never does worse than Full Cache, which is one of its feasible plans
        assert day["greencache_g"] <= day["full_cache_g"] + 1e-6, region
        assert day["saved_vs_full_cache_pct"] >= 0.0
        assert day["attainment_greencache"] >= 0.9 - 1e-9, region
        assert day["ilp"]["status"] == "Optimal"
    assert ours["slo_attainment_min"] >= 0.9 - 1e-9
    assert ours["carbon_saved_vs_full_cache_fr_mean_pct"] == detail["per_grid"]["FR"]["saved_vs_full_cache_pct"]
    # a lower CI makes the SSD's embodied carbon a larger share: FR's what-if at 33 g/kWh saves more
    assert detail["what_if"]["FR_ci_scaled_to_33_g_per_kwh"]["saved_vs_full_cache_pct"] >= \
        detail["per_grid"]["FR"]["saved_vs_full_cache_pct"]
    # GreenCache's own CI source (CarbonCast, direct CI): FR averages ~37 g/kWh there, and the saving is larger
    cc = detail["what_if"]["FR_carboncast_direct_ci"]
    assert 30 < cc["ci_mean_g_per_kwh"] < 45
    assert cc["saved_vs_full_cache_pct"] >= detail["per_grid"]["FR"]["saved_vs_full_cache_pct"]
    assert out["within_tolerance"] == all(detail["checks"].values())
    assert isinstance(out["within_tolerance"], bool)
    assert out["notes"] and all(isinstance(n, str) for n in out["notes"])
    assert math.isfinite(detail["peak_rate_prompts_per_s"]) and detail["peak_rate_prompts_per_s"] > 0
