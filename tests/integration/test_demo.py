"""`greenserve demo`, short: one virtual hour of ES on 6 July 2022 through the whole system on a virtual clock; the
report holds what was planned, applied and measured, its plots show the JSON's series, and nothing is left running."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from greenserve.evaluation.plots import plotted_series
from greenserve_client.sidecars import find_lmcache
from tests.conftest import free_port
from tests.up_process import CLI, engine_pids, port_flags, service_ports


@pytest.mark.slow
def test_demo_one_virtual_hour(tmp_path: Path) -> None:
    ports = service_ports()
    out = tmp_path / "report"
    lmcache = "on" if find_lmcache() is not None else "off"
    run = subprocess.run([*CLI, "demo", "--data-dir", str(tmp_path / "data"), *port_flags(ports, "port"),
                          f"--router-http-port={free_port()}", "--hours=1", "--minutes=1", "--startup-s=90",
                          "--engine-time-scale=10", f"--lmcache={lmcache}", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "demo: 00:00 CI" in run.stdout and "all services stopped" in run.stdout
    result = json.loads((out / "result.json").read_text())
    (hour,) = result["hours"]
    logs = "\n".join(line for path in sorted((tmp_path / "data" / "logs").glob("*.log"))
                      for line in path.read_text(errors="replace").splitlines() if "ENFORCEMENT_STATE" in line)
    assert hour["plan_version"] >= 1 and hour["fleet_matches_plan"] is True, f"{hour}\n{logs[-4000:]}"
    assert set(k.split("/")[0] for k in hour["enforcement"]) == {"router", "cache-manager", "gpu-partitioner"}
    assert all(v == "ENFORCEMENT_STATE_APPLIED" for v in hour["enforcement"].values())
    assert hour["requests_ok"] > 0 and hour["requests_failed"] == 0
    assert plotted_series(out / "ci.png") == {"actual": [hour["ci_actual_g_per_kwh"]]}
    assert plotted_series(out / "requests.png") == {"ok": [hour["requests_ok"]], "failed": [0]}
    assert "plan in force" in (out / "index.html").read_text()
    assert not engine_pids(tmp_path / "data"), "no engine outlives the demo"
