"""GreenCache's headline in its own setting (services/evaluation/headlines/greencache*.py): inputs and one quick run."""

from __future__ import annotations

import math

import pytest
from greenserve.common.carbon_params import load_default_params
from greenserve.evaluation.headlines import greencache as gc
from greenserve.evaluation.headlines import greencache_carbon as gc_carbon
from greenserve.evaluation.headlines import greencache_profile as gc_profile
from greenserve.evaluation.headlines import greencache_setting as gc_setting


def test_hit_rate_follows_greencache_table3() -> None:
    for size, rate in gc_setting.TABLE3_LCS.items():
        assert gc_setting.hit_rate(size) == pytest.approx(rate)
    assert gc_setting.hit_rate(0) == 0.0
    # log-linear between the table's points
    assert gc_setting.hit_rate(1) < gc_setting.hit_rate(3) < gc_setting.hit_rate(4)
    assert gc_setting.hit_rate(32) == pytest.approx(0.71)  # capped at the 16 TB figure
    with pytest.raises(ValueError, match="size_tb"):
        gc_setting.hit_rate(-1)


def test_azure_day_shape_is_24_hours_peaking_at_one() -> None:
    shape = gc_setting.azure_day_shape()
    assert len(shape) == 24
    assert max(shape) == pytest.approx(1.0)
    assert 0.3 < min(shape) < 1.0


def test_hour_carbon_charges_the_allocated_ssd_per_greencache_eq4() -> None:
    params = load_default_params()
    empty = gc_carbon.hour_carbon_g(800.0, 100.0, 0, params)
    full = gc_carbon.hour_carbon_g(800.0, 100.0, 16, params)
    assert empty["ssd_embodied_g"] == 0.0
    # 16 TB x 30 kgCO2e/TB over 5 years, for one hour
    assert full["ssd_embodied_g"] == pytest.approx(16 * 30_000.0 / (5 * 365 * 24), rel=1e-6)
    assert full["operational_g"] == pytest.approx(0.8 * 100.0)
    assert full["total_g"] == pytest.approx(full["operational_g"] + full["ssd_embodied_g"] + full["other_embodied_g"])


def test_replayed_hit_rate_tracks_the_cache_size() -> None:
    small = gc_profile._point(1, 0.2, 200, seed=3)
    large = gc_profile._point(16, 0.2, 200, seed=3)
    none = gc_profile._point(0, 0.2, 200, seed=3)
    assert none.hit_rate == 0.0
    assert 0.0 < small.hit_rate < large.hit_rate
    assert large.ttft_ok >= none.ttft_ok  # reuse shortens prefill


def test_quick_run_reports_the_convention_and_meets_the_slo(quick_run: dict) -> None:
    out = quick_run
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
    # the headline runs in the paper's setting: GreenCache's direct CI (CarbonCast: FR ~37 g/kWh that day)
    assert 30 < detail["per_grid"]["FR"]["ci_mean_g_per_kwh"] < 45
    assert detail["assumptions"]["paper"]["ci"] == "direct"
    # a lower CI makes the SSD's embodied carbon a larger share: FR's what-if at 33 g/kWh saves more
    assert detail["what_if"]["FR_ci_scaled_to_33_g_per_kwh"]["saved_vs_full_cache_pct"] >= \
        detail["per_grid"]["FR"]["saved_vs_full_cache_pct"]
    decomposition = {row["row"]: row for row in detail["decomposition"]}
    assert decomposition["paper_setting"]["saved_vs_full_cache_pct"]["FR"] == ours["carbon_saved_vs_full_cache_fr_mean_pct"]
    assert decomposition["ours"]["saved_vs_full_cache_pct"]["FR"] == ours["carbon_saved_fr_with_our_defaults_pct"]
    assert out["within_tolerance"] == all(detail["checks"].values())
    assert isinstance(out["within_tolerance"], bool)
    assert out["notes"] and all(isinstance(n, str) for n in out["notes"])
    assert math.isfinite(detail["peak_rate_prompts_per_s"]) and detail["peak_rate_prompts_per_s"] > 0


def test_direct_ci_is_greencache_source_for_every_grid() -> None:
    for region in gc_setting.REGIONS:
        direct, lifecycle = gc_setting.day_ci(region, "direct"), gc_setting.day_ci(region, "lifecycle")
        assert len(direct) == 24 and all(c > 0 for c in direct)
        assert sum(direct) < sum(lifecycle), region  # operational factors only: below the life-cycle CI
    assert gc_setting.day_ci("FR", "direct") == list(gc_setting.direct_ci_2022_07_06()["FR"])
    assert gc_setting.day_ci("FR", "direct")[0] == 26.59  # CarbonCast FR_direct_emissions.csv, 2022-07-06 00:00 UTC
    with pytest.raises(ValueError, match="kind"):
        gc_setting.day_ci("FR", "hourly")


def test_whole_server_power_adds_host_and_allocated_ssd_power() -> None:
    params = load_default_params()
    gpu = gc_carbon.hour_carbon_g(800.0, 100.0, 16, params, gc_setting.GPU_ONLY)
    whole = gc_carbon.hour_carbon_g(800.0, 100.0, 16, params, gc_setting.WHOLE_SERVER)
    watts = 800.0 + gc_setting.CPU_W + gc_setting.DRAM_W + 16 * gc_setting.SSD_W_PER_TB
    assert whole["operational_g"] == pytest.approx(watts / 1000.0 * 100.0)
    assert whole["operational_g"] > gpu["operational_g"]
    assert whole["ssd_embodied_g"] == gpu["ssd_embodied_g"]  # the embodied terms do not depend on the accounting


def test_azure_code_day_has_the_deeper_trough() -> None:
    code, conv = gc_setting.azure_day_shape("code"), gc_setting.azure_day_shape("conv")
    assert len(code) == 24 and max(code) == pytest.approx(1.0)
    assert min(code) < 0.2
    assert min(conv) > 0.4
    with pytest.raises(ValueError, match="service"):
        gc_setting.azure_day_shape("chat")


def test_paper_workload_reaches_table3_hit_rate_and_ours_does_not() -> None:
    ours, paper = gc_profile._turns(1, gc_setting.OURS_WORKLOAD), gc_profile._turns(1, gc_setting.PAPER_WORKLOAD)
    def reusable(t: gc_profile._Turns) -> float:
        return float(((t.prev_prompt // gc_setting.BLOCK_TOKENS) * gc_setting.BLOCK_TOKENS).sum() / t.prompt.sum())
    assert reusable(paper) >= gc_setting.TABLE3_LCS[16] > reusable(ours)
    assert (gc_profile.prompt_stats(gc_setting.PAPER_WORKLOAD)["p90_tokens"]
            < gc_profile.prompt_stats(gc_setting.OURS_WORKLOAD)["p90_tokens"])


@pytest.fixture(scope="module")
def quick_run() -> dict:
    return gc.run(quick=True)


def test_decomposition_rows_exist_and_each_assumption_changes_the_result(quick_run: dict) -> None:
    rows = {row["row"]: row for row in quick_run["detail"]["decomposition"]}
    singles = ("ci_direct", "power_whole_server", "workload_paper", "load_code_service")
    leave_one_out = ("paper_without_ci_direct", "paper_without_whole_server", "paper_without_workload",
                     "paper_without_code_service")
    assert set(rows) == {"ours", "paper_setting", *singles, *leave_one_out}
    for row in rows.values():
        assert set(row["saved_vs_full_cache_pct"]) == set(gc_setting.REGIONS)
        assert row["attainment_min"] >= gc_setting.RHO - 1e-9, row["row"]
        assert isinstance(row["fr_within_20pct_of_15.1"], bool)
    base = rows["ours"]["saved_vs_full_cache_pct"]
    paper = rows["paper_setting"]["saved_vs_full_cache_pct"]
    for key in singles:  # switched alone from ours, each assumption moves some grid's saving
        assert rows[key]["saved_vs_full_cache_pct"] != base, key
    for key in leave_one_out:  # and leaving it out of the paper's setting moves it too
        assert rows[key]["saved_vs_full_cache_pct"] != paper, key
    # the row's flag is the +-20 % test on FR's mean saving against the paper's 15.1 %
    for row in rows.values():
        assert row["fr_within_20pct_of_15.1"] == (abs(row["saved_vs_full_cache_pct"]["FR"] / 15.1 - 1) <= 0.2)
    # direct CI is lower than life-cycle CI on every grid, so the SSD weighs more and FR saves more
    assert rows["ci_direct"]["saved_vs_full_cache_pct"]["FR"] > base["FR"]


def test_paper_best_hour_implies_a_one_kilowatt_server() -> None:
    # 25.3 % saved by 15 TB less SSD (15 x 30 kgCO2e over 5 years per hour) at CarbonCast's 26.59 g/kWh
    params = load_default_params()
    ssd_h = 30_000.0 / (5 * 365 * 24)
    other_h = (4 * 26.6 + 9.3 + 30.8) * 1000.0 / (5 * 365 * 24)
    expected_w = (15 * ssd_h / 0.253 - 16 * ssd_h - other_h) / 26.59 * 1000.0
    assert gc_carbon.implied_paper_power_w(params) == pytest.approx(expected_w, rel=1e-6)
    assert 900 < expected_w < 1100


def test_profile_from_size_drops_the_small_sizes() -> None:
    profile = gc_profile.build_profile((0.1, 0.2), sizes_tb=(0, 8, 16), requests=40, seed=2)
    cut = gc_profile.profile_from_size(profile, 1)
    assert cut.sizes_tb == tuple(range(1, gc_setting.MAX_TB + 1))
    assert cut.points[0] == profile.points[1] and cut.points[-1] == profile.points[-1]
