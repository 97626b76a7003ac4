"""Every service console script starts as its own process, answers grpc.health.v1 SERVING, lists its
greenserve.v1 service through reflection, and exits 0 on SIGTERM."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from greenserve_client.services import SERVICES
from tests.conftest import free_port


def console_script(name: str) -> str:
    """The installed console script next to this interpreter (the venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found, f"{name} is not installed (pip install -e .)"
    return found


def wait_serving(address: str, service: str, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"exited early with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}"
            try:
                if stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1).status == 1:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise AssertionError(f"{service} not SERVING at {address} within {timeout_s}s")


@pytest.mark.parametrize("info", SERVICES, ids=lambda i: i.display)
def test_console_script_serves_health_and_reflection(info, tmp_path: Path) -> None:
    script = console_script(info.console_script)
    port = free_port()
    proc = subprocess.Popen(
        [script, "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        address = f"127.0.0.1:{port}"
        wait_serving(address, info.grpc_service, proc)
        with grpc.insecure_channel(address) as channel:
            db = ProtoReflectionDescriptorDatabase(channel)
            services = set(db.get_services())
            assert info.grpc_service in services and "grpc.health.v1.Health" in services
            # A client that knows nothing but the address can resolve the whole API (what grpcurl does).
            descriptor = db.FindFileContainingSymbol(info.grpc_service)
            assert descriptor.package == "greenserve.v1" and descriptor.service
        assert (tmp_path / f"{info.name}.db").exists(), "default SQLite file lives in --data-dir"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
    assert code == 0, proc.stderr.read().decode()[-2000:]


def test_bad_flag_value_exits_2_naming_the_flag(tmp_path: Path) -> None:
    result = subprocess.run([console_script("greenserve-router"), "--port", "99999", "--data-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "--port" in result.stderr and "GREENSERVE_PORT" in result.stderr


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = subprocess.run([console_script("greenserve-forecaster"), "--port", str(port), "--data-dir", str(tmp_path)],
                                capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert f"cannot bind 127.0.0.1:{port}" in result.stderr
