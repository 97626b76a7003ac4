"""greenserve-profiler refuses a bad flag at start (a message naming the flag, exit 2), not at the first sweep.

Found by an adversarial audit of the profiler's CLI: --engine-port-range was a free string, so "abc" or "9-1"
started a profiler whose every launched-engine sweep then failed (the gpu-partitioner checks the same flag)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("value", ["abc", "9-1", "8200-70000"])
def test_a_bad_engine_port_range_exits_2_naming_the_flag(value: str) -> None:
    try:
        done = subprocess.run([sys.executable, "-m", "greenserve.profiler", "--port", "0", "--no-import-published",
                               "--no-log-json", "--db-url", "sqlite://", f"--engine-port-range={value}"],
                              capture_output=True, text=True, timeout=30, env={**os.environ, "OTEL_SDK_DISABLED": "true"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"--engine-port-range={value} was accepted: the profiler started serving")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--engine-port-range" in done.stderr and "Traceback" not in done.stderr
