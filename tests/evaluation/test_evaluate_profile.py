"""`greenserve evaluate --profile FILE`: the evaluation runs on the engine of a measured profile with a fitted step
model (the real vLLM CPU engine's, docs/real-engine), and a file that is not one exits 2 naming --profile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from google.protobuf import json_format

from greenserve.v1 import common_pb2

ROOT = Path(__file__).resolve().parents[2]
CALIBRATED = ROOT / "docs" / "real-engine" / "calibrated-run2-humaneval.json"
CLI = [sys.executable, "-m", "greenserve_client.cli", "evaluate"]
SHORT = ["--grids", "FR", "--hours", "1", "--window-s", "60", "--forecast", "seasonal_naive", "--workers", "1",
         "--headlines", "none", "--strategies", "base_full_cache"]


def test_evaluate_runs_on_a_measured_profiles_engine(tmp_path: Path) -> None:
    out = tmp_path / "report"
    run = subprocess.run([*CLI, *SHORT, "--profile", str(CALIBRATED), "--out", str(out)], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    hours = result["grids"]["FR"]["base_full_cache"]["hours"]
    assert len(hours) == 1 and hours[0]["requests_measured"] > 0
    assert 0 <= hours[0]["attainment_fraction"] <= 1
    text = json.dumps(result)
    assert "tiny-llama" in text and "CPU" in text
    assert "has no measured power" in run.stderr  # its carbon figures are not passed off as measured


def test_a_profile_without_a_fitted_step_model_exits_2(tmp_path: Path) -> None:
    raw = ROOT / "docs" / "real-engine" / "profile-humaneval.json"
    run = subprocess.run([*CLI, *SHORT, "--profile", str(raw), "--out", str(tmp_path / "r")], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and "--profile.facts: no fitted step_overhead_s" in run.stderr, run.stderr[-2000:]
    simulated = json_format.Parse(CALIBRATED.read_text(), common_pb2.Profile())
    simulated.source = common_pb2.PROFILE_SOURCE_SIMULATED
    path = tmp_path / "simulated.json"
    path.write_text(json_format.MessageToJson(simulated))
    run = subprocess.run([*CLI, *SHORT, "--profile", str(path), "--out", str(tmp_path / "r")], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and "--profile.source" in run.stderr, run.stderr[-2000:]
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    run = subprocess.run([*CLI, *SHORT, "--profile", str(garbage), "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--profile: cannot read a profile" in run.stderr, run.stderr[-2000:]
