"""Tensor-parallel all-reduce cost on PCIe-only engines, INT8 tensor-core peak, and the read-or-recompute rules."""

from __future__ import annotations

import pytest

from greenserve.simulator.engine_profile import load_profile
from greenserve.simulator.perf_model import REUSE_RULES, PerfModel
from greenserve.simulator.replay import replay
from greenserve.simulator.replay_fleet import EngineSpec, FleetConfig
from greenserve.simulator.workloads import Workload


def test_int8_profile_uses_the_int8_tensor_rate_and_vllm_small_gpu_batch_default() -> None:
    p = load_profile("llama3-70b-int8@4xL40")
    assert p.peak_flops == pytest.approx(4 * 362.1e12)
    assert "INT8" in p.sources["peak_flops"]
    assert p.max_num_batched_tokens == 2048
    assert p.tp_link_bandwidth_bytes_per_s == pytest.approx(25e9)


def test_tp_allreduce_cost_is_derived_from_the_link() -> None:
    p = load_profile("llama3-70b-int8@4xL40")
    pm = PerfModel(p)
    compute_per_token = 2 * p.n_params / (p.peak_flops * p.prefill_mfu)
    comm_per_token = 2 * p.n_layers * (2 * 3 / 4) * p.hidden_size * 2 / p.tp_link_bandwidth_bytes_per_s
    # a long prefill is compute-bound: per token it costs the GEMMs plus the all-reduces
    n = 4096
    per_token = (pm.prefill_time_s(n) - pm.prefill_time_s(2048)) / 2048
    attn = 4 * p.n_layers * p.hidden_size * (0.5 * (n * n - 2048 * 2048) / 2048) / (p.peak_flops * p.prefill_mfu)
    expected = (compute_per_token + comm_per_token) + attn * (compute_per_token + comm_per_token) / compute_per_token
    assert per_token == pytest.approx(expected, rel=1e-6)
    # every step pays 2 all-reduce latencies per layer on top of the profile's overhead
    assert pm.decode_step_time_s(1, 100) - PerfModel(p.with_overrides(tp_allreduce_latency_s=0.0)).decode_step_time_s(
        1, 100) == pytest.approx(2 * p.n_layers * p.tp_allreduce_latency_s)
    # a faster link makes prefill faster; without a link the flat efficiency applies as before
    fast = PerfModel(p.with_overrides(tp_link_bandwidth_bytes_per_s=1e12))
    assert fast.prefill_time_s(4096) < pm.prefill_time_s(4096)
    flat = PerfModel(p.with_overrides(tp_link_bandwidth_bytes_per_s=0.0, tp_comm_efficiency=0.5))
    assert flat._prefill_rate == pytest.approx(p.peak_flops * p.prefill_mfu * 0.5)


def test_nvlink_profiles_are_unchanged() -> None:
    p = load_profile("llama3-70b@4xA100-80GB")
    pm = PerfModel(p)
    assert p.tp_link_bandwidth_bytes_per_s == 0.0
    assert pm._overhead_s == pytest.approx(p.step_overhead_s)
    assert pm._prefill_rate == pytest.approx(p.peak_flops * p.prefill_mfu)


def _slow_disk_model() -> PerfModel:
    # a disk slower than recomputing: 270 MB/s
    return PerfModel(load_profile("llama3-8b@A100-80GB").with_overrides(disk_bandwidth_bytes_per_s=2.7e8))


def test_reuse_rules_differ_on_a_tier_slower_than_compute() -> None:
    pm = _slow_disk_model()
    cached, n = 2047, 2048
    assert pm.load_time_s(cached, "disk") > pm.recompute_time_s(cached)
    latency = pm.plan_prefix_reuse(0, 0, cached, n, 0.0, "latency")
    assert latency.used_disk_tokens == 0 and latency.recompute_tokens == n
    always = pm.plan_prefix_reuse(0, 0, cached, n, 10.0, "always")  # nothing hidden even after a long queue
    assert always.used_disk_tokens == cached
    assert always.load_s == pytest.approx(pm.load_time_s(cached, "disk"))
    loose = pm.plan_prefix_reuse(0, 0, cached, n, 0.0, "energy", delay_budget_s=10.0)
    assert loose.used_disk_tokens == cached  # reads although slower: it saves energy and the budget allows it
    tight = pm.plan_prefix_reuse(0, 0, cached, n, 0.0, "energy", delay_budget_s=0.5 * pm.load_time_s(cached, "disk"))
    assert tight.used_disk_tokens == 0 and tight.skipped_tokens == cached
    # the latency rule hides a load behind queueing; 'always' does not
    hidden = pm.plan_prefix_reuse(0, 0, cached, n, 10.0, "latency")
    assert hidden.used_disk_tokens == cached and hidden.load_s == 0.0


def test_reuse_rule_is_validated() -> None:
    pm = _slow_disk_model()
    assert REUSE_RULES == ("latency", "always", "energy")
    with pytest.raises(ValueError, match="rule"):
        pm.plan_prefix_reuse(0, 0, 10, 20, 0.0, "greedy")
    with pytest.raises(ValueError, match="delay_budget_s"):
        pm.plan_prefix_reuse(0, 0, 10, 20, 0.0, "energy", delay_budget_s=0.0)
    with pytest.raises(ValueError, match="reuse_rule"):
        FleetConfig((EngineSpec("llama3-8b@A100-80GB", reuse_rule="greedy"),))
    with pytest.raises(ValueError, match="reuse_delay_budget_s"):
        FleetConfig((EngineSpec("llama3-8b@A100-80GB", reuse_delay_budget_s=-1.0),))


def test_replay_applies_the_engine_reuse_rule() -> None:
    profile = _slow_disk_model().profile
    # 20 requests with a 2,048-token prompt whose first 2,047 tokens are preloaded on the disk tier
    n = 20
    hashes = [tuple(range(1000 * i, 1000 * i + 8)) for i in range(n)]
    work = Workload("preloaded", [5.0 * i for i in range(n)], [2048] * n, [4] * n, hashes, 256)
    preload = [{"disk": [h for hs in hashes for h in hs[:7]]}]
    hits = {}
    for rule in ("latency", "always"):
        spec = EngineSpec(profile, disk_capacity_tokens=10_000_000, prefix_caching=False, reuse_rule=rule)
        result = replay(work, FleetConfig((spec,)), initial_contents=preload)
        hits[rule] = int(result.hit_disk_tokens.sum())
    assert hits["latency"] == 0  # slower than recomputing: recomputed
    assert hits["always"] == n * 7 * 256  # LMCache loads every hit
