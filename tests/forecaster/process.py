"""A forecaster in its own process (`python -m greenserve.forecaster`), for the kill and memory tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVICE = "greenserve.v1.ForecasterService"


def start_forecaster(data_dir: Path, port: int, **env: str) -> subprocess.Popen:
    """The forecaster on `port` with `data_dir`, SERVING; `env`: extra GREENSERVE_* settings. Its log (stderr)
    goes to `<data_dir>/forecaster.log`."""
    full_env = {**os.environ, "GREENSERVE_LOG_LEVEL": "WARNING", "GREENSERVE_FIT_WORKERS": "1", **env}
    argv = [sys.executable, "-m", "greenserve.forecaster", "--host", "127.0.0.1", "--port", str(port),
            "--data-dir", str(data_dir)]
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir / "forecaster.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=full_env, stdout=subprocess.DEVNULL, stderr=out)
    deadline = time.monotonic() + 90
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"exited {proc.returncode}: {log.read_text()[-2000:]}"
            try:
                if health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=1).status == 1:
                    return proc
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"forecaster not SERVING within 90 s: {log.read_text()[-2000:]}")


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (VmRSS)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")
