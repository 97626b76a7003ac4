"""Trace replay: exactness on single requests, caching, KV budget, modes, policies, determinism, carbon."""

from __future__ import annotations

import math

import numpy as np
import pytest
from greenserve.simulator.engine_profile import DEFAULT_PROFILE, load_profile
from greenserve.simulator.mode_configs import SpecDecodeConfig
from greenserve.simulator.perf_model import PerfModel
from greenserve.simulator.replay import replay
from greenserve.simulator.replay_fleet import AutoscaleConfig, EngineSpec, FleetConfig
from greenserve.simulator.replay_routing import (
    LeastLoaded,
    PrefixAffinity,
    RoundRobin,
    WeightedRandom,
    make_policy,
)
from greenserve.simulator.workloads import (
    Workload,
    multi_turn_workload,
    poisson_workload,
    zipf_document_workload,
)

PM = PerfModel(load_profile(DEFAULT_PROFILE))


def test_single_request_matches_the_perf_model() -> None:
    res = replay(Workload("one", [0.0], [1000], [101]), FleetConfig.uniform(1))
    assert res.ttft_s[0] == pytest.approx(PM.prefill_time_s(1000), rel=1e-9)
    # 100 decode steps with the context growing 1001..1100: mean step at the mean context (linear regime)
    assert res.tpot_s[0] == pytest.approx(PM.decode_step_time_s(1, 1001 + 49) + 0.5 * PM.decode_step_time_s(1, 1)
                                          - 0.5 * PM.decode_step_time_s(1, 0), rel=1e-6)
    assert res.e2e_s[0] == pytest.approx(res.ttft_s[0] + 100 * res.tpot_s[0])
    # energy of the lone request = all active energy; fleet also pays no idle time here (no gaps)
    assert res.energy_j[0] == pytest.approx(res.fleet_energy_j, rel=1e-9)
    assert PM.power_w(0.0) * res.e2e_s[0] < res.energy_j[0] < PM.power_w(1.0) * res.e2e_s[0]


def test_repeated_prefix_hits_hbm_and_cuts_ttft() -> None:
    w = Workload("two", [0.0, 10.0], [2048, 2048], [10, 10], [(1, 2, 3, 4), (1, 2, 3, 4)], 512)
    res = replay(w, FleetConfig.uniform(1))
    assert res.hit_hbm_tokens.tolist() == [0, 2047]
    assert res.ttft_s[1] < res.ttft_s[0] / 5
    off = replay(w, FleetConfig((EngineSpec(prefix_caching=False),)))
    assert off.hit_hbm_tokens.tolist() == [0, 0]
    assert off.ttft_s[1] == pytest.approx(off.ttft_s[0])


def test_dram_and_disk_tiers_serve_hits_when_hbm_is_off() -> None:
    w = Workload("tiers", [0.0, 10.0, 20.0], [4096] * 3, [5] * 3, [tuple(range(8))] * 3, 512)
    res = replay(w, FleetConfig((EngineSpec(dram_capacity_tokens=8 * 512, prefix_caching=False),)))
    assert res.hit_dram_tokens.tolist() == [0, 4095, 4095]
    res = replay(w, FleetConfig((EngineSpec(disk_capacity_tokens=8 * 512, prefix_caching=False),)))
    assert res.hit_disk_tokens.tolist() == [0, 4095, 4095]
    # exposed disk load is added to TTFT (no queueing to hide it)
    load = PM.load_time_s(4095, "disk")
    assert res.ttft_s[1] == pytest.approx(PM.prefill_time_s(1, 1, 4095) + load, rel=1e-6)


def test_slow_disk_is_skipped_without_queueing_and_used_with_it() -> None:
    slow = load_profile(DEFAULT_PROFILE).with_overrides(disk_bandwidth_bytes_per_s=0.05e9)
    hashes = [tuple(range(16))] * 2
    w = Workload("slow", [0.0, 100.0], [8192, 8192], [2, 2], hashes, 512)
    res = replay(w, FleetConfig((EngineSpec(slow, disk_capacity_tokens=10**6, prefix_caching=False),)))
    assert res.hit_disk_tokens[1] == 0 and res.skipped_reload_tokens[1] == 8191
    # a burst: the second request waits behind the first, long enough to prefetch from disk
    burst = Workload("burst", [0.0, 100.0, 100.0], [8192, 8192, 8192], [2, 2, 2], [tuple(range(16))] * 3, 512)
    slow_many = slow.with_overrides(max_num_batched_tokens=8192, prefill_mfu=0.01)
    res = replay(burst, FleetConfig((EngineSpec(slow_many, disk_capacity_tokens=10**6, prefix_caching=False),)))
    assert res.queue_s[2] > PerfModel(slow_many).load_time_s(8191, "disk")
    assert res.hit_disk_tokens[2] == 8191


def test_kv_budget_limits_concurrency_and_rejects_oversized() -> None:
    small = load_profile(DEFAULT_PROFILE).with_overrides(memory_bytes=21.7e9)
    cap = PerfModel(small).kv_cache_tokens()
    assert 0 < cap < 4000
    w = Workload("kv", [0.0, 0.0, 0.0], [1000, 1000, 100_000], [500, 500, 10])
    res = replay(w, FleetConfig((EngineSpec(small),)))
    assert res.rejected.tolist() == [False, False, True]
    # the two requests do not fit together: the second waits for the first to finish
    assert res.queue_s[1] >= res.e2e_s[0] - 1e-9
    big = replay(w.head(2), FleetConfig.uniform(1))
    assert big.queue_s[1] < res.queue_s[1]


def test_speculative_decoding_mode_changes_tpot() -> None:
    target = "llama2-7b@A100-40GB"
    w = Workload("spec", [0.0], [500], [200])
    plain = replay(w, FleetConfig((EngineSpec(target),)))
    good = SpecDecodeConfig(draft=load_profile("llama3.2-1b@A100-40GB"), acceptance_rate=0.9)
    fast = replay(w, FleetConfig((EngineSpec(target, spec=good),)))
    assert fast.tpot_s[0] < plain.tpot_s[0]
    assert fast.ttft_s[0] == pytest.approx(plain.ttft_s[0])


def test_disaggregated_fleet_transfers_kv_and_decodes_elsewhere() -> None:
    fleet = FleetConfig((EngineSpec("llama2-7b@A100-40GB", role="prefill"), EngineSpec("llama2-7b@V100", role="decode")),
                        kv_link_bandwidth_bytes_per_s=2e9, kv_link_latency_s=0.0)
    w = Workload("pd", [0.0], [1000], [50])
    res = replay(w, fleet)
    assert res.engine[0] == 1  # finished on the decode engine
    assert res.kv_transfer_s[0] == pytest.approx(1000 * 524288 / 2e9)
    assert res.ttft_s[0] == pytest.approx(PerfModel(load_profile("llama2-7b@A100-40GB")).prefill_time_s(1000))
    assert res.e2e_s[0] > res.ttft_s[0] + res.kv_transfer_s[0]
    slow_link = FleetConfig(fleet.engines, kv_link_bandwidth_bytes_per_s=0.2e9)
    assert replay(w, slow_link).e2e_s[0] > res.e2e_s[0]
    with pytest.raises(ValueError, match="role"):
        FleetConfig((EngineSpec(role="prefill"),))


def test_replay_is_deterministic_for_a_seed() -> None:
    w = multi_turn_workload(80, 0.5, seed=3)
    fleet = FleetConfig.uniform(3, policy="prefix_affinity", dram_capacity_tokens=50_000)
    a, b = replay(w, fleet), replay(w, fleet)
    for name in ("ttft_s", "tpot_s", "e2e_s", "energy_j", "engine", "hit_hbm_tokens", "hit_dram_tokens"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert a.fleet_energy_j == b.fleet_energy_j
    w2 = multi_turn_workload(80, 0.5, seed=4)
    assert len(w2) != len(w) or w2.arrival_s != w.arrival_s
    weighted = FleetConfig.uniform(3, policy=WeightedRandom([1, 2, 3], seed=5))
    c = replay(w, weighted)
    d = replay(w, FleetConfig.uniform(3, policy=WeightedRandom([1, 2, 3], seed=5)))
    np.testing.assert_array_equal(c.engine, d.engine)


def test_policies_spread_and_prefix_affinity_raises_hits() -> None:
    w = zipf_document_workload(600, 4.0, n_documents=60, alpha=0.7, seed=2)
    counts = {}
    hits = {}
    for name in ("round_robin", "least_loaded", "prefix_affinity"):
        res = replay(w, FleetConfig.uniform(4, policy=name))
        counts[name] = np.bincount(res.engine, minlength=4)
        hits[name] = int(res.hit_hbm_tokens.sum())
    assert counts["round_robin"].tolist() == [150, 150, 150, 150]
    assert (counts["least_loaded"] > 0).all()
    assert hits["prefix_affinity"] > hits["round_robin"]
    assert isinstance(make_policy("round_robin"), RoundRobin)
    assert isinstance(make_policy("least_loaded"), LeastLoaded)
    assert isinstance(make_policy("prefix_affinity"), PrefixAffinity)
    with pytest.raises(ValueError, match="policy"):
        make_policy("random-walk")


def test_more_engines_lower_latency_under_load() -> None:
    w = poisson_workload(400, 20.0, seed=1)
    one = replay(w, FleetConfig.uniform(1))
    four = replay(w, FleetConfig.uniform(4))
    assert np.nanmean(four.ttft_s) < np.nanmean(one.ttft_s)
    assert four.slo_attainment(2.0, 0.1)["both"] >= one.slo_attainment(2.0, 0.1)["both"]


def test_autoscaler_switches_engines_on_under_load_and_saves_idle_energy() -> None:
    w = poisson_workload(600, 15.0, seed=2)
    auto = AutoscaleConfig(min_engines=1, interval_s=5.0, scale_up_outstanding=4, scale_down_outstanding=1,
                           cold_start_s=2.0)
    scaled = replay(w, FleetConfig.uniform(4, autoscale=auto))
    used = np.bincount(scaled.engine, minlength=4)
    assert used[0] > 0 and (used[1:] > 0).any()
    quiet = poisson_workload(50, 0.2, seed=2)
    always_on = replay(quiet, FleetConfig.uniform(4))
    scaled_quiet = replay(quiet, FleetConfig.uniform(4, autoscale=auto))
    assert scaled_quiet.fleet_energy_j < always_on.fleet_energy_j


def test_summary_slo_and_carbon() -> None:
    w = poisson_workload(200, 2.0, seed=0)
    res = replay(w, FleetConfig.uniform(2))
    s = res.summary(2.0, 0.1)
    assert s["requests"] == 200 and s["completed"] == 200
    assert set(s["ttft_s"]) == {"p50", "p90", "p99"}
    assert 0.0 <= s["slo_attainment"]["both"] <= s["slo_attainment"]["ttft"] <= 1.0
    assert s["fleet_energy_j"] >= np.nansum(res.energy_j)
    c = res.carbon([100.0, 400.0], ci_step_s=50.0)
    expected = res.energy_j / 3.6e6 * np.where(res.arrival_s < 50.0, 100.0, 400.0)
    np.testing.assert_allclose(c["per_request_operational_g"], expected, rtol=1e-9)
    assert c["total_g"] > c["per_request_operational_g"].sum()
    emb = res.carbon(200.0, embodied_g_per_engine=26_340.0)
    assert (emb["per_request_embodied_g"] > 0).all()
    with pytest.raises(ValueError, match="ci_g_per_kwh"):
        res.carbon([-1.0])
    with pytest.raises(ValueError, match="ttft_slo_s"):
        res.slo_attainment(0.0, 0.1)


def test_bad_fleet_inputs() -> None:
    with pytest.raises(ValueError, match="engines"):
        FleetConfig(())
    with pytest.raises(ValueError, match="dram_capacity_tokens"):
        FleetConfig((EngineSpec(dram_capacity_tokens=-1),))
    with pytest.raises(ValueError, match="scale_down_outstanding"):
        AutoscaleConfig(scale_up_outstanding=1, scale_down_outstanding=2)
    with pytest.raises(TypeError, match="workload"):
        replay([1, 2, 3], FleetConfig.uniform(1))  # type: ignore[arg-type]
    assert math.isnan(replay(Workload("empty", [], [], []), FleetConfig.uniform(1)).summary()["mean_ttft_s"])
