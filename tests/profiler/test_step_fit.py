"""The CPU step model: PerfModel's linear step, its fit on the stored real-vLLM sweep, the held-back error the
calibration reaches (the figure of docs/simulator.md, "Real engine"), and a measured profile carrying the fit."""

from __future__ import annotations

import json
import math

import pytest

from greenserve.bench import profiler_calibration as bench_calibration
from greenserve.profiler import step_fit
from greenserve.simulator import engine_profile
from greenserve.simulator.perf_model import PerfModel
from greenserve.v1 import common_pb2

STORED = bench_calibration.STORED_SWEEP / bench_calibration.DEFAULT_RUN


def test_linear_step_model_is_overhead_plus_tokens_sequences_and_context() -> None:
    engine = engine_profile.tiny_llama_cpu_profile().with_overrides(
        step_overhead_s=1e-3, step_per_prefill_token_s=3e-5, step_per_sequence_s=2e-4, step_per_context_token_s=1e-7)
    pm = PerfModel(engine)
    assert pm.prefill_time_s(100) == pytest.approx(1e-3 + 100 * 3e-5)
    assert pm.prefill_time_s(100, cached_tokens=1000) == pytest.approx(1e-3 + 100 * 3e-5)  # linear: no attention
    assert pm.decode_step_time_s(4, 2000) == pytest.approx(1e-3 + 4 * 2e-4 + 2000 * 1e-7)
    flops = pm.prefill_flops(50, 1, 0)
    assert pm.step_time_s(flops, 0, 3, 300) == pytest.approx(1e-3 + 50 * 3e-5 + 3 * 2e-4 + 300 * 1e-7)
    # the GPU profiles keep the roofline: the decode step grows with the KV context read
    gpu = PerfModel(engine_profile.load_profile("llama3-8b@A100-80GB"))
    assert not gpu.linear and gpu.decode_step_time_s(8, 512_000) > 3 * gpu.decode_step_time_s(8, 0)
    with pytest.raises(ValueError, match="step_per_sequence_s"):
        engine.with_overrides(step_per_sequence_s=0.0)


def test_calibration_on_the_stored_sweep_predicts_held_back_rates(capsys: pytest.CaptureFixture[str]) -> None:
    """The figure of docs/simulator.md, "Real engine": fitted on the client-side p50s at 1, 3 and 5 req/s of the
    stored sweep (the rates it was calibrated on), the replay predicts 2 and 4 req/s within 10 % (TTFT and TPOT
    p50); the sweep's split-half spread at those rates is carried along."""
    assert bench_calibration.main([]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["target"] == "client-p50"
    sweep = out["sweeps"][0]
    assert sweep["sweep"] == bench_calibration.DEFAULT_RUN and sweep["fit_rates"] == [1.0, 3.0, 5.0]
    rows = sweep["rows"]
    assert sorted({r["rate_per_s"] for r in rows if r["held_back"]}) == [2.0, 4.0]
    worst = out["max_abs_error_held_back"]
    assert worst["ttft_p50_s"] < 0.10 and worst["tpot_p50_s"] < 0.10
    spread = out["max_split_half_held_back"]
    assert 0 < spread["ttft_p50_s"] < 1 and 0 < spread["tpot_p50_s"] < 1
    # queueing comes from the replay: longbench's predicted TPOT grows with the rate (the batch) as the engine's
    longbench = [r["predicted_tpot_p50_s"] for r in rows if r["workload"] == "longbench"]
    assert longbench == sorted(longbench) and longbench[-1] > 1.2 * longbench[0]


def test_a_measured_profile_carries_the_fit_and_becomes_an_engine() -> None:
    profiles, engine_side = bench_calibration.load_sweep(STORED)
    observations = [step_fit.Observation(p, r, q, engine_side[(w, r)][f"engine_{q}"])
                    for w, p in profiles.items() for r in (1.0, 5.0) for q in ("ttft_mean_s", "tpot_mean_s")]
    fit = step_fit.fit_step_model(observations)
    assert all(math.isfinite(v) and v >= 0 for v in fit.coefficients.values())
    stored = step_fit.with_fitted_facts(profiles["humaneval"], fit, "test fit")
    engine = engine_profile.engine_profile_from_measured(stored)
    assert engine.step_per_prefill_token_s == pytest.approx(fit.coefficients["step_per_prefill_token_s"])
    assert PerfModel(engine).linear and engine.model == "tiny-llama"
    with pytest.raises(ValueError, match=r"profile\.facts: no fitted step_overhead_s"):
        engine_profile.engine_profile_from_measured(profiles["humaneval"])
    simulated = common_pb2.Profile()
    simulated.CopyFrom(stored)
    simulated.source = common_pb2.PROFILE_SOURCE_SIMULATED
    with pytest.raises(ValueError, match=r"profile\.source"):
        engine_profile.engine_profile_from_measured(simulated)
    with pytest.raises(ValueError, match="observations"):
        step_fit.fit_step_model([])


def test_bench_rejects_bad_rates_and_folders(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_calibration.main(["--fit-rates=two"])
    assert exc.value.code != 0 and "--fit-rates" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        bench_calibration.main([f"--sweep={tmp_path}"])
    assert exc.value.code != 0 and "no profile-*.json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        bench_calibration.main(["--fit-rates=1,7"])  # the stored sweep measured 1..5 req/s
    err = capsys.readouterr().err
    assert exc.value.code != 0 and "--fit-rates" in err and "not 7" in err
