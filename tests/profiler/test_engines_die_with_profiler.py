"""An engine the profiler started for an engine sweep (--engine-launcher) does not outlive a profiler killed with
SIGKILL.

The launcher starts each engine in a session of its own (so that stopping it can signal its whole process group),
which also keeps the terminal's and the supervisor's signals from it: after kill -9 of the profiler nothing stopped
it, and the emulated (or vLLM) engine ran on for good, holding its port and its GPU. Found by an adversarial audit of
the profiler's child processes (failed before the fix: the engine was still running 15 s after the kill)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from greenserve.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc
from tests.conftest import free_port
from tests.up_process import children_of, pids_alive, wait_until_gone

from .conftest import config


@pytest.mark.slow
def test_an_engine_started_for_a_sweep_dies_with_a_killed_profiler(tmp_path: Path) -> None:
    port, low = free_port(), free_port()
    env = {**os.environ, "OTEL_SDK_DISABLED": "true"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "greenserve.profiler", "--port", str(port),
         "--db-url", f"sqlite:///{tmp_path / 'profiler.db'}", "--no-import-published", "--no-log-json",
         "--engine-launcher", "emulator", "--nvml-power", "off", "--engine-port-range", f"{low}-{low + 20}"],
        stdout=open(tmp_path / "profiler.log", "ab"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    engines: list[int] = []
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=60)
        stub = profiler_pb2_grpc.ProfilerServiceStub(channel)
        spec = profiler_pb2.SweepSpec(
            backend=profiler_pb2.SWEEP_BACKEND_ENGINE, workload="sharegpt", request_rates_per_s=[1.0],
            point_duration_s=600.0, slo=common_pb2.Slo(ttft_s=0.2, tpot_s=0.08, attainment_fraction=0.9),
            configs=[config()])
        stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec), timeout=30)
        deadline = time.monotonic() + 60
        while not (engines := pids_alive(children_of(proc.pid))):
            assert proc.poll() is None and time.monotonic() < deadline, "the profiler started no engine"
            time.sleep(0.1)
        channel.close()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert not wait_until_gone(engines, 15), "an engine outlived kill -9 of the profiler"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in pids_alive(engines):  # never leave one behind, even when the test failed
            os.killpg(pid, signal.SIGKILL)
