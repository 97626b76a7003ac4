"""Performance model: units, monotonicity, KV budget, tier-reload rule, modes, data-file sources."""

from __future__ import annotations

import tomllib

import pytest
from greenserve.simulator.engine_profile import DATA_FILE, DEFAULT_PROFILE, data_version, list_profiles, load_profile
from greenserve.simulator.mode_configs import DisaggConfig, SpecDecodeConfig
from greenserve.simulator.perf_model import PerfModel


@pytest.fixture(scope="module")
def model() -> PerfModel:
    return PerfModel(load_profile(DEFAULT_PROFILE))


def test_every_profile_loads_and_has_a_kv_pool() -> None:
    names = list_profiles()
    for required in ("llama3-70b-int8@4xL40", "llama3-8b@A100-80GB", "llama3-70b@4xA100-80GB",
                     "llama3-8b@H100-80GB", "llama3-70b@4xH100-80GB", "llama3-8b@A100-80GB-MIG-3g.40gb"):
        assert required in names
    assert DEFAULT_PROFILE in names
    for name in names:
        profile = load_profile(name)
        assert profile.name == name
        assert profile.block_size_tokens == 16
        assert PerfModel(profile).kv_cache_blocks() > 0, name
    assert data_version()


def test_every_number_in_the_data_file_cites_a_source() -> None:
    with open(DATA_FILE, "rb") as handle:
        document = tomllib.load(handle)
    tables = [("gpus." + k, v) for k, v in document["gpus"].items()]
    tables += [("models." + k, v) for k, v in document["models"].items()]
    tables += [("profiles." + k, v) for k, v in document["profiles"].items()]
    tables.append(("engine_defaults", document["engine_defaults"]))
    for where, table in tables:
        sources = table.get("sources", {})
        for key, value in table.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert sources.get(key, "").strip(), f"{where}.{key} has no source"


def test_loaded_profile_carries_sources_for_its_fields() -> None:
    profile = load_profile("llama3-70b-int8@4xL40")
    assert "INT8" in profile.sources["weight_bytes_per_param"]
    assert "L40" in profile.sources["peak_flops"]
    assert profile.weight_bytes_per_param == 1.0
    assert profile.gpu_count == 4
    # W8A8 INT8 on the L40's INT8 tensor cores: 4 x 362.1 TOPS from the L40 datasheet
    assert profile.peak_flops == pytest.approx(4 * 362.1e12)


def test_unknown_profile_is_a_clear_key_error() -> None:
    with pytest.raises(KeyError, match="known profiles"):
        load_profile("gpt-5@abacus")


def test_profile_validation_names_the_field() -> None:
    profile = load_profile(DEFAULT_PROFILE)
    with pytest.raises(ValueError, match="prefill_mfu"):
        profile.with_overrides(prefill_mfu=1.5)
    with pytest.raises(ValueError, match="decode_mbu"):
        profile.with_overrides(decode_mbu=float("nan"))
    with pytest.raises(ValueError, match="bogus"):
        profile.with_overrides(bogus=1)


def test_kv_bytes_per_token_matches_llama3_architecture() -> None:
    # 2 (K,V) x 32 layers x 8 kv heads x 128 head dim x 2 bytes = 128 KiB for Llama-3 8B
    assert load_profile("llama3-8b@A100-80GB").kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    # 320 KiB for Llama-3 70B
    assert load_profile("llama3-70b@4xA100-80GB").kv_bytes_per_token == 2 * 80 * 8 * 128 * 2


def test_kv_budget_follows_memory_minus_weights(model: PerfModel) -> None:
    p = model.profile
    expected = (0.9 * p.memory_bytes - p.n_params * 2 - p.non_kv_reserve_bytes_per_gpu) // (p.kv_bytes_per_token * 16)
    assert model.kv_cache_blocks() == int(expected)
    # a MIG slice with half the memory holds far fewer blocks
    mig = PerfModel(load_profile("llama3-8b@A100-80GB-MIG-3g.40gb"))
    assert 0 < mig.kv_cache_blocks() < model.kv_cache_blocks() / 2
    # weights that do not fit leave no KV pool
    tiny = PerfModel(p.with_overrides(memory_bytes=10e9))
    assert tiny.kv_cache_blocks() == 0


def test_prefill_grows_with_uncached_tokens_and_is_superlinear(model: PerfModel) -> None:
    times = [model.prefill_time_s(n) for n in (128, 512, 2048, 8192)]
    assert times == sorted(times) and len(set(times)) == 4
    # quadratic attention: 4x the tokens costs more than 4x the compute part
    assert model.prefill_flops(8192) > 4 * model.prefill_flops(2048)
    assert model.prefill_time_s(0) == 0.0
    # attending to a cached prefix costs something, but far less than recomputing it
    cold = model.prefill_time_s(4096)
    warm = model.prefill_time_s(256, cached_tokens=3840)
    assert warm < cold / 4
    # same tokens split over more sequences: less attention work
    assert model.prefill_time_s(4096, batch_size=8) < model.prefill_time_s(4096, batch_size=1)


def test_prefill_seconds_match_a_hand_roofline(model: PerfModel) -> None:
    p = model.profile
    n = 2000
    flops = n * (2 * p.n_params + 4 * p.n_layers * p.hidden_size * n / 2)
    expected = p.step_overhead_s + flops / (p.peak_flops * p.prefill_mfu)
    assert model.prefill_time_s(n) == pytest.approx(expected, rel=1e-12)


def test_decode_step_grows_with_batch_and_context(model: PerfModel) -> None:
    assert model.decode_step_time_s(1, 1000) < model.decode_step_time_s(1, 100_000)
    assert model.decode_step_time_s(1, 1000) <= model.decode_step_time_s(32, 1000)
    # memory-bound: batch 1 costs at least the weights read once
    p = model.profile
    assert model.decode_step_time_s(1, 0) >= p.weight_bytes / p.hbm_bandwidth_bytes_per_s
    # batching amortises the weight read: per-token time falls with batch size
    assert model.decode_step_time_s(64, 64 * 1000) / 64 < model.decode_step_time_s(1, 1000)
    assert model.decode_step_time_s(0, 0) == 0.0
    with pytest.raises(ValueError):
        model.decode_step_time_s(-1, 0)


def test_faster_hardware_is_faster() -> None:
    a100 = PerfModel(load_profile("llama3-8b@A100-80GB"))
    h100 = PerfModel(load_profile("llama3-8b@H100-80GB"))
    mig = PerfModel(load_profile("llama3-8b@A100-80GB-MIG-3g.40gb"))
    assert h100.prefill_time_s(2048) < a100.prefill_time_s(2048) < mig.prefill_time_s(2048)
    assert h100.decode_step_time_s(8, 8000) < a100.decode_step_time_s(8, 8000) < mig.decode_step_time_s(8, 8000)


def test_tier_load_times_order_and_units(model: PerfModel) -> None:
    tokens = 2000
    assert model.load_time_s(tokens, "hbm") == 0.0
    dram, disk = model.load_time_s(tokens, "dram"), model.load_time_s(tokens, "disk")
    assert 0 < dram < disk
    p = model.profile
    assert dram == pytest.approx(p.dram_latency_s + tokens * p.kv_bytes_per_token / p.dram_bandwidth_bytes_per_s)
    with pytest.raises(ValueError, match="tier"):
        model.load_time_s(10, "tape")
    with pytest.raises(ValueError, match="tokens"):
        model.load_time_s(-1, "dram")


def test_reuse_rule_reloads_dram_and_recomputes_slow_disk_without_queueing() -> None:
    slow_disk = PerfModel(load_profile(DEFAULT_PROFILE).with_overrides(disk_bandwidth_bytes_per_s=0.35e9))
    plan = slow_disk.plan_prefix_reuse(hbm_tokens=512, dram_tokens=1024, disk_tokens=2048, prompt_tokens=4000)
    assert plan.used_hbm_tokens == 512 and plan.used_dram_tokens == 1024
    # a disk read at 350 MB/s is slower than recompute, and no queueing hides it
    assert slow_disk.load_time_s(2048, "disk") > slow_disk.recompute_time_s(2048, 1536)
    assert plan.used_disk_tokens == 0 and plan.skipped_tokens == 2048
    assert plan.recompute_tokens == 4000 - 1536
    # the same reload fits in a long queueing wait (Kareto Obs. 4): then it is used and fully hidden
    waited = slow_disk.plan_prefix_reuse(512, 1024, 2048, 4000, queue_wait_s=10.0)
    assert waited.used_disk_tokens == 2048 and waited.load_s == 0.0
    assert waited.recompute_tokens == 4000 - 512 - 1024 - 2048


def test_reuse_rule_uses_fast_disk_and_reports_exposed_load() -> None:
    model = PerfModel(load_profile(DEFAULT_PROFILE))
    plan = model.plan_prefix_reuse(0, 0, 4096, 5000)
    assert plan.used_disk_tokens == 4096
    assert plan.load_s == pytest.approx(model.load_time_s(4096, "disk"))
    with pytest.raises(ValueError, match="prompt_tokens"):
        model.plan_prefix_reuse(0, 0, 5001, 5000)


def test_power_is_linear_between_idle_and_max(model: PerfModel) -> None:
    p = model.profile
    assert model.power_w(0.0) == p.idle_w
    assert model.power_w(1.0) == p.max_w
    assert model.power_w(0.5) == pytest.approx((p.idle_w + p.max_w) / 2)
    with pytest.raises(ValueError, match="utilisation"):
        model.power_w(1.2)
    small = model.decode_utilisation(1, 1000)
    big = model.decode_utilisation(256, 256 * 100)
    assert 0 < small < big <= 1.0
    assert model.step_energy_j(2.0, 1.0) == pytest.approx(2.0 * p.max_w)


def test_spec_decode_expected_tokens_and_speedup() -> None:
    assert PerfModel.expected_tokens_per_verify(3, 0.0) == 1.0
    # accepted / proposed (GreenLLM Sec. V-A): k = 3 proposals at r = 0.5 yield 1 + 3 x 0.5 tokens per round
    assert PerfModel.expected_tokens_per_verify(3, 0.5) == pytest.approx(2.5)
    assert PerfModel.expected_tokens_per_verify(3, 1.0) == pytest.approx(4.0)
    target = PerfModel(load_profile("llama2-7b@A100-40GB"))
    spec = SpecDecodeConfig(draft=load_profile("llama3.2-1b@A100-40GB"), num_speculative_tokens=3, acceptance_rate=0.9)
    plain = target.decode_step_time_s(1, 500)
    assert target.spec_decode_tpot_s(spec, 1, 500) < plain  # high acceptance: faster
    bad = SpecDecodeConfig(draft=load_profile("llama3.2-1b@A100-40GB"), acceptance_rate=0.0)
    assert target.spec_decode_tpot_s(bad, 1, 500) > plain  # nothing accepted: pure overhead
    dsd = SpecDecodeConfig(draft=load_profile("llama3.2-1b@T4"), acceptance_rate=0.457, disaggregated=True,
                           link_bandwidth_bytes_per_s=2e9)
    local = SpecDecodeConfig(draft=load_profile("llama3.2-1b@T4"), acceptance_rate=0.457)
    assert target.spec_decode_step_time_s(dsd, 4, 2000) > target.spec_decode_step_time_s(local, 4, 2000)
    with pytest.raises(ValueError, match="acceptance_rate"):
        SpecDecodeConfig(draft=load_profile("llama3.2-1b@T4"), acceptance_rate=1.5)


def test_disaggregation_ships_kv_over_the_link() -> None:
    config = DisaggConfig(prefill=load_profile("llama2-7b@A100-40GB"), decode=load_profile("llama2-7b@V100"),
                          link_bandwidth_bytes_per_s=2e9, link_latency_s=0.0)
    ttft, tpot, transfer = PerfModel.disagg_request_latency_s(config, 1000, 200)
    # 1000 tokens x 512 KiB (Llama-2 7B, no GQA) over 2 GB/s
    assert transfer == pytest.approx(1000 * 524288 / 2e9)
    assert ttft > 0 and tpot > 0
    fast = DisaggConfig(prefill=config.prefill, decode=config.decode, link_bandwidth_bytes_per_s=50e9)
    assert PerfModel.disagg_request_latency_s(fast, 1000, 200)[2] < transfer
    with pytest.raises(ValueError, match="decode"):
        DisaggConfig(prefill=config.prefill, decode=load_profile("llama3.2-1b@T4"))
