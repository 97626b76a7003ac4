"""scripts/real_engine_profile.py --profiles-from: fit and predict again on a stored real-engine sweep, no vLLM.
The fit rates come from the stored run unless given; a folder without the sweep's files is a usage error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from greenserve.bench import profiler_calibration as bench_calibration

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "real_engine_profile.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_refit_of_the_stored_sweep_takes_its_rates_and_fit_rates(tmp_path: Path) -> None:
    stored = bench_calibration.STORED_SWEEP / bench_calibration.DEFAULT_RUN
    previous = json.loads((stored / "result.json").read_text())
    stored_fit = sorted({r["rate_per_s"] for r in previous["rows"] if not r["held_back"]})
    done = _run(f"--out={tmp_path / 'refit'}", f"--profiles-from={stored}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "refit" / "result.json").read_text())
    assert sorted({r["rate_per_s"] for r in result["rows"] if not r["held_back"]}) == stored_fit
    assert result["refit_of"] == stored.name
    # the measured figures of the stored rows travel with the refit (engine-side means)
    assert all(r.get("engine_tpot_mean_s") for r in result["rows"])
    assert list((tmp_path / "refit").glob("calibrated-refit-*.json"))


def test_refit_refuses_a_folder_without_the_sweep_and_fit_rates_it_did_not_measure(tmp_path: Path) -> None:
    done = _run(f"--out={tmp_path / 'o'}", f"--profiles-from={tmp_path}")
    assert done.returncode != 0 and "--profiles-from" in done.stderr and "Traceback" not in done.stderr
    stored = bench_calibration.STORED_SWEEP / bench_calibration.DEFAULT_RUN
    done = _run(f"--out={tmp_path / 'o'}", f"--profiles-from={stored}", "--fit-rates=0.5")
    assert done.returncode != 0 and "--fit-rates" in done.stderr and "Traceback" not in done.stderr
