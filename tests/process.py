"""A service in its own process (`python -m greenserve.<service>`), for the kill, restart and memory tests."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def start_service_process(module: str, health_service: str, data_dir: Path, port: int, *,
                          env: Mapping[str, str], log_name: str, extra_args: Sequence[str] = (),
                          ready_within_s: float = 60) -> subprocess.Popen:
    """`python -m <module>` on 127.0.0.1:`port` with `data_dir`, returned once its gRPC health check reports
    `health_service` SERVING. `env` is laid over this process's environment, `extra_args` follow the
    host/port/data-dir flags; its stderr goes to `<data_dir>/<log_name>`. Fails (and kills it) if it exits
    or is not SERVING within `ready_within_s`."""
    argv = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir),
            *extra_args]
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir / log_name
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=out)
    deadline = time.monotonic() + ready_within_s
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"exited {proc.returncode}: {log.read_text()[-2000:]}"
            try:
                if health.Check(health_pb2.HealthCheckRequest(service=health_service), timeout=1).status == 1:
                    return proc
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"{module} not SERVING within {ready_within_s:g} s: {log.read_text()[-2000:]}")


async def stop_process(proc: subprocess.Popen, grace_s: float = 30.0, *, group: bool = False) -> None:
    """SIGTERM to a running ``proc``, SIGKILL past ``grace_s`` (to its whole session with ``group``: a process
    started with ``start_new_session``), then reaped: nothing outlives the test."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.to_thread(proc.wait, grace_s)
    except subprocess.TimeoutExpired:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        await asyncio.to_thread(proc.wait)


async def sigkill_while_writing(proc: subprocess.Popen, writers: list[asyncio.Task], killed: asyncio.Event,
                                write_s: float) -> None:
    """Let `writers` run for `write_s`, then set `killed` and SIGKILL `proc` while they are still writing.
    Returns once every writer has ended (they must end soon after `killed` is set) and the process is gone;
    on any failure on the way the process is killed."""
    try:
        await asyncio.sleep(write_s)
        killed.set()
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*writers), 60)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (VmRSS)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")
