"""Speculative decoding and DSD as GreenLLM reports them (issue 19 item 5): the acceptance rate read as accepted /
proposed, the draft's probabilities overlapped with verification (Fig. 2), and each GPU of a DSD pair charged its
own energy and embodied carbon."""

from __future__ import annotations

import pytest
from greenserve.simulator.engine_profile import load_profile
from greenserve.simulator.mode_configs import SpecDecodeConfig
from greenserve.simulator.perf_model import PerfModel
from greenserve.simulator.replay import replay
from greenserve.simulator.replay_fleet import EngineSpec, FleetConfig
from greenserve.simulator.workloads import Workload

TARGET = "llama2-7b@A100-40GB"


def test_tpot_is_round_time_over_one_plus_k_r() -> None:
    target = PerfModel(load_profile(TARGET))
    spec = SpecDecodeConfig(draft=load_profile("llama3.2-1b@A100-40GB"), num_speculative_tokens=3,
                            acceptance_rate=0.457)
    round_s = target.spec_decode_step_time_s(spec, 4, 2000)
    assert target.spec_decode_tpot_s(spec, 4, 2000) == pytest.approx(round_s / (1 + 3 * 0.457))
    # the per-token-probability reading would have given (1 - 0.457^4) / (1 - 0.457) = 1.76 tokens: a third slower
    assert (1 + 3 * 0.457) / ((1 - 0.457 ** 4) / (1 - 0.457)) == pytest.approx(1.346, abs=1e-3)


def test_dsd_probabilities_travel_while_the_target_verifies() -> None:
    target = PerfModel(load_profile(TARGET))
    draft = load_profile("llama3.2-1b@T4")
    fast = SpecDecodeConfig(draft=draft, disaggregated=True, link_bandwidth_bytes_per_s=2e9)  # GreenLLM's 16 Gbps
    d, v, link = target.spec_decode_round_parts_s(fast, 8, 4000)
    ids_s = 8 * 3 * 4 / 2e9
    probs_s = 8 * 3 * 32000 * 4 / 2e9
    assert probs_s < v  # hidden behind the verify step: only the token ids delay the round
    assert link == pytest.approx(ids_s)
    slow = SpecDecodeConfig(draft=draft, disaggregated=True, link_bandwidth_bytes_per_s=1e8)
    d2, v2, link2 = target.spec_decode_round_parts_s(slow, 8, 4000)
    assert (d2, v2) == pytest.approx((d, v))
    assert link2 == pytest.approx(8 * 3 * 4 / 1e8 + 8 * 3 * 32000 * 4 / 1e8 - v)  # what outlasts verification


def test_dsd_pair_is_charged_both_gpus_energy_and_embodied() -> None:
    draft = load_profile("llama3.2-1b@T4")
    w = Workload("dsd", [0.0, 5.0, 10.0], [160, 160, 160], [140, 140, 140])
    dsd = replay(w, FleetConfig((EngineSpec(TARGET, spec=SpecDecodeConfig(draft=draft, disaggregated=True)),)))
    a100 = load_profile(TARGET)
    # the T4 idles the whole time the pair is on, on top of the A100's idle draw
    assert dsd.fleet_energy_j >= (a100.idle_w + draft.idle_w) * dsd.makespan_s
    lifetime_s = 5 * 365 * 24 * 3600.0
    carbon = dsd.period_carbon(261.0, [26340.0 + 10300.0], lifetime_s=lifetime_s)
    assert carbon["embodied_g"] == pytest.approx(36640.0 * dsd.makespan_s / lifetime_s)
    assert carbon["operational_g"] == pytest.approx(dsd.fleet_energy_j / 3.6e6 * 261.0)
    assert carbon["per_token_g"] == pytest.approx(carbon["total_g"] / 420)
    with pytest.raises(ValueError, match="gpu_embodied_g_per_engine"):
        dsd.period_carbon(261.0, [1.0, 2.0])


def test_emulator_modes_pace_as_the_performance_model() -> None:
    from greenserve.simulator.emulator.modes import ModeSettings, ModeTimer

    target = PerfModel(load_profile(TARGET))
    draft = load_profile("llama3.2-1b@T4")
    dsd = ModeTimer(target, ModeSettings("dsd", "llama3.2-1b@T4"))
    spec = SpecDecodeConfig(draft=draft, disaggregated=True)
    duration, power = dsd.step([], 8, 2400)
    assert duration == pytest.approx(target.spec_decode_tpot_s(spec, 8, 2400))
    assert dsd.idle_power_w == pytest.approx(target.power_w(0.0) + draft.idle_w)  # the T4 idles beside the A100
    assert dsd.idle_power_w < power
    decode = PerfModel(load_profile("llama2-7b@V100"))
    dpd = ModeTimer(target, ModeSettings("dpd", decode_profile="llama2-7b@V100", link_bandwidth_bytes_per_s=2e9))
    prefill_s = target.step_time_s(target.prefill_flops(160, 1, 0), 0, 0, 0)
    link_s = 160 * target.profile.kv_bytes_per_token / 2e9
    assert dpd.step([(160, 0)], 8, 2400)[0] == pytest.approx(max(prefill_s + link_s,
                                                                  decode.decode_step_time_s(8, 2400)))
