"""The profiler on a real engine (issue 34 item 4): scripts/real_engine_profile.py sweeps one real vLLM (CPU build,
tiny random Llama) through the profiler's engine backend, stores each workload's ladder as a MEASURED profile,
calibrates the simulator on part of the ladder and predicts the held-back rate.

What is asserted is the path (every point measured, the profile valid and MEASURED, the calibration and the
prediction finite), not the 10 % figure: on 2 shared cores vLLM's API server at times streams a whole completion at
once (client-side TPOT ~0, TTFT = the whole generation), so the errors of a short CI run are noise. The figures of
a longer run are in docs/profiler.md ("Real engine"). About 1.5 min, an engine start included.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from google.protobuf import json_format

from greenserve.simulator import engine_profile
from greenserve.v1 import common_pb2

from .conftest import start_vllm

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "real_engine_profile.py"


def test_a_real_engines_measured_profile_calibrates_the_simulator(tiny_model: Path, tmp_path: Path) -> None:
    engine = start_vllm(tiny_model, tmp_path, "vllm-profile")
    out = tmp_path / "out"
    try:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), f"--out={out}", f"--engine-url={engine.url}", "--workloads=humaneval",
             "--rates=2,4,6", "--fit-rates=2,6", "--duration-s=6", "--warmup-s=1"],
            capture_output=True, text=True, timeout=180)
    finally:
        engine.stop()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    profile = json_format.Parse((out / "profile-humaneval.json").read_text(), common_pb2.Profile())
    assert profile.source == common_pb2.PROFILE_SOURCE_MEASURED
    assert profile.config_key == "tiny-llama@CPU|workload=humaneval"
    assert [p.request_rate_per_s for p in profile.points] == [2.0, 4.0, 6.0]
    for p in profile.points:
        assert p.requests == 6 * p.request_rate_per_s and p.failed_requests <= 1
        assert p.ttft_p50_s > 0
    result = json.loads((out / "result.json").read_text())
    assert set(result["fitted"]) == {"prefill_mfu", "decode_mbu", "step_overhead_s"}
    held = [r for r in result["rows"] if r["held_back"]]
    assert [r["rate_per_s"] for r in held] == [4.0]
    assert held[0]["predicted_ttft_p50_s"] > 0 and held[0]["predicted_tpot_p50_s"] > 0
    assert math.isfinite(held[0]["ttft_p50_s_error"])
    # the CPU step model fitted on the engine's own means: the calibrated profile carries its coefficients
    calibrated = json_format.Parse((out / "calibrated-out-humaneval.json").read_text(), common_pb2.Profile())
    facts = {f.name: f.value for f in calibrated.facts}
    assert set(facts) == set(engine_profile.FACT_NAMES) and facts["step_per_prefill_token_s"] > 0
    assert engine_profile.engine_profile_from_measured(calibrated).model == "tiny-llama"
    assert len(result["load_average_start"]) == 3
