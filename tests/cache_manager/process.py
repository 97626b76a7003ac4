"""Start `python -m greenserve.cache_manager` as its own process (for kill and memory tests)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVICE = "greenserve.v1.CacheManagerService"


def start_cache_manager(data_dir: Path, port: int, **flags: object) -> subprocess.Popen:
    """`python -m greenserve.cache_manager` on `port`, SERVING; its log goes to `<data_dir>/service.log`."""
    env = {**os.environ, "GREENSERVE_FOLLOW_PLANS": "false"}
    argv = [sys.executable, "-m", "greenserve.cache_manager", "--host", "127.0.0.1", "--port", str(port),
            "--data-dir", str(data_dir)]
    for name, value in flags.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir / "service.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=out)
    deadline = time.monotonic() + 60
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
    raise AssertionError(f"cache-manager not SERVING within 60 s: {log.read_text()[-2000:]}")
