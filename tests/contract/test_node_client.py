"""Contract test: the Node.js client (clients/node) against the real Python optimizer service.

The Node client loads the same protos (protos/greenserve/v1) at runtime with @grpc/proto-loader; this
test starts `python -m greenserve.optimizer` on a free port, waits for grpc.health.v1 to answer SERVING,
and drives the client's CLI (clients/node/bin/greenserve-node.js): health, EstimateCarbon, an invalid
EstimateCarbon (INVALID_ARGUMENT naming the field), the bearer token over plaintext (interceptor) and
over mTLS (call credentials composed with TLS channel credentials). It also runs the client's own unit
tests (`npm test`). The service must stop with exit status 0 within 10 s of SIGTERM.

Needs `node` on PATH and `clients/node/node_modules` (run `npm ci` in clients/node first).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
NODE_DIR = REPO / "clients" / "node"
CLI = NODE_DIR / "bin" / "greenserve-node.js"
NODE = shutil.which("node")
NPM = shutil.which("npm")
SERVICE = "greenserve.v1.OptimizerService"

pytestmark = [
    pytest.mark.skipif(NODE is None, reason="node is not installed (the Node client needs Node.js >= 18.19)"),
    pytest.mark.skipif(
        not (NODE_DIR / "node_modules").is_dir(),
        reason="clients/node/node_modules is missing: run `npm ci` in clients/node first",
    ),
]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env() -> dict[str, str]:
    """The environment without GREENSERVE_* settings, so only the flags given here configure things."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GREENSERVE_")}


class Optimizer:
    """A running `python -m greenserve.optimizer` process."""

    def __init__(self, proc: subprocess.Popen[bytes], addr: str, log_path: Path) -> None:
        self.proc = proc
        self.addr = addr
        self.log_path = log_path

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def terminate_and_check(self) -> None:
        """SIGTERM; the service must exit 0 within 10 s."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            pytest.fail(f"optimizer did not exit within 10 s of SIGTERM\n{self.log_tail()}")
        assert rc == 0, f"optimizer exited {rc} after SIGTERM\n{self.log_tail()}"


def _wait_healthy(optimizer: Optimizer, channel_factory: Callable[[str], grpc.Channel], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if optimizer.proc.poll() is not None:
            pytest.fail(f"optimizer exited with {optimizer.proc.returncode} before serving\n{optimizer.log_tail()}")
        try:
            with channel_factory(optimizer.addr) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                response = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=1.0)
            if response.status == health_pb2.HealthCheckResponse.SERVING:
                return
            last = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
        except grpc.RpcError as exc:
            last = f"{exc.code().name}: {exc.details()}"
        time.sleep(0.2)
    pytest.fail(f"optimizer not SERVING within {timeout_s} s (last: {last})\n{optimizer.log_tail()}")


@contextmanager
def _optimizer(
    tmp_path: Path,
    extra_args: Sequence[str] = (),
    channel_factory: Callable[[str], grpc.Channel] = grpc.insecure_channel,
) -> Iterator[Optimizer]:
    port = _free_port()
    addr = f"127.0.0.1:{port}"
    data_dir = tmp_path / "data"
    data_dir.mkdir(exist_ok=True)
    log_path = tmp_path / "optimizer.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "greenserve.optimizer", "--host", "127.0.0.1", "--port", str(port),
             "--data-dir", str(data_dir), *extra_args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_env(),
        )
    optimizer = Optimizer(proc, addr, log_path)
    try:
        _wait_healthy(optimizer, channel_factory)
        yield optimizer
    finally:
        if proc.poll() is None:  # the test failed before terminating it
            proc.kill()
            proc.wait(timeout=10)


def _node_cli(addr: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [NODE, str(CLI), "--addr", addr, *args],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        env=env or _env(),
    )


def _estimate(addr: str, *extra: str, energy: str = "1") -> subprocess.CompletedProcess[str]:
    return _node_cli(
        addr, *extra, "estimate-carbon", "--energy-kwh", energy, "--ci-g-per-kwh", "100", "--duration-s", "3600"
    )


def test_node_cli_against_real_optimizer(tmp_path: Path) -> None:
    with _optimizer(tmp_path) as optimizer:
        health = _node_cli(optimizer.addr, "health", SERVICE)
        assert health.returncode == 0, health.stderr
        assert json.loads(health.stdout) == {"status": "SERVING"}

        ok = _estimate(optimizer.addr)
        assert ok.returncode == 0, f"{ok.stderr}\n{optimizer.log_tail()}"
        lines = ok.stdout.strip().splitlines()
        assert len(lines) == 1, ok.stdout
        response = json.loads(lines[0])
        carbon = response["carbon"]
        # 1 kWh x 100 g/kWh x PUE 1 (default)
        assert carbon["operational_g"] == pytest.approx(100.0, rel=1e-12)
        assert carbon["energy_kwh"] == pytest.approx(1.0)
        assert carbon["ci_g_per_kwh"] == pytest.approx(100.0)
        # Default components amortised over one hour add embodied carbon.
        assert carbon["embodied_compute_g"] > 0
        assert carbon["total_g"] > carbon["operational_g"]
        assert carbon["total_g"] == pytest.approx(
            carbon["operational_g"] + carbon["embodied_compute_g"] + carbon["embodied_storage_g"]
        )
        assert response["carbon_params"]["pue"] == pytest.approx(1.0)
        assert response["carbon_params"]["components"], "defaults filled in"

        bad = _estimate(optimizer.addr, energy="-1")
        assert bad.returncode != 0
        assert bad.stdout == ""
        assert "INVALID_ARGUMENT" in bad.stderr
        assert "energy_kwh" in bad.stderr

        optimizer.terminate_and_check()


def test_node_cli_bearer_token_against_real_optimizer(tmp_path: Path) -> None:
    token = "node-contract-token"
    with _optimizer(tmp_path, ["--auth-token", token]) as optimizer:
        # Health is exempt from the token (probes are unauthenticated).
        health = _node_cli(optimizer.addr, "health", SERVICE)
        assert health.returncode == 0, health.stderr
        assert json.loads(health.stdout) == {"status": "SERVING"}

        missing = _estimate(optimizer.addr)
        assert missing.returncode != 0
        assert "UNAUTHENTICATED" in missing.stderr

        wrong = _estimate(optimizer.addr, "--token", "not-the-token")
        assert wrong.returncode != 0
        assert "UNAUTHENTICATED" in wrong.stderr

        ok = _estimate(optimizer.addr, "--token", token)
        assert ok.returncode == 0, f"{ok.stderr}\n{optimizer.log_tail()}"
        assert json.loads(ok.stdout)["carbon"]["operational_g"] == pytest.approx(100.0, rel=1e-12)

        optimizer.terminate_and_check()


def _write_pki(directory: Path) -> dict[str, Path]:
    """A throwaway CA, a server certificate for localhost/127.0.0.1 and a client certificate."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def builder(subject: str, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        builder("greenserve-test-ca", name("greenserve-test-ca"), ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, usage, san: list[x509.GeneralName]):
        key = ec.generate_private_key(ec.SECP256R1())
        b = (
            builder(cn, ca_cert.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return key, b.sign(ca_key, hashes.SHA256())

    server_key, server_cert = leaf(
        "localhost",
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client_key, client_cert = leaf("greenserve-node-client", ExtendedKeyUsageOID.CLIENT_AUTH, [])

    def pem_key(key) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    files = {
        "ca": ca_cert.public_bytes(serialization.Encoding.PEM),
        "server_cert": server_cert.public_bytes(serialization.Encoding.PEM),
        "server_key": pem_key(server_key),
        "client_cert": client_cert.public_bytes(serialization.Encoding.PEM),
        "client_key": pem_key(client_key),
    }
    paths = {}
    for label, data in files.items():
        path = directory / f"{label}.pem"
        path.write_bytes(data)
        paths[label] = path
    return paths


def test_node_cli_mtls_and_token_against_real_optimizer(tmp_path: Path) -> None:
    pki_dir = tmp_path / "pki"
    pki_dir.mkdir()
    pki = _write_pki(pki_dir)
    token = "node-mtls-token"
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki["ca"].read_bytes(),
        private_key=pki["client_key"].read_bytes(),
        certificate_chain=pki["client_cert"].read_bytes(),
    )
    server_args = [
        "--tls-cert", str(pki["server_cert"]),
        "--tls-key", str(pki["server_key"]),
        "--tls-client-ca", str(pki["ca"]),
        "--auth-token", token,
    ]
    def secure_channel(addr: str) -> grpc.Channel:
        return grpc.secure_channel(addr, credentials, options=[("grpc.ssl_target_name_override", "localhost")])

    with _optimizer(tmp_path, server_args, channel_factory=secure_channel) as optimizer:
        tls = ["--ca", str(pki["ca"]), "--cert", str(pki["client_cert"]), "--key", str(pki["client_key"]),
               "--server-name", "localhost"]

        health = _node_cli(optimizer.addr, *tls, "health", SERVICE)
        assert health.returncode == 0, health.stderr
        assert json.loads(health.stdout) == {"status": "SERVING"}

        # The token rides on call credentials composed with the TLS channel credentials.
        ok = _estimate(optimizer.addr, *tls, "--token", token)
        assert ok.returncode == 0, f"{ok.stderr}\n{optimizer.log_tail()}"
        assert json.loads(ok.stdout)["carbon"]["operational_g"] == pytest.approx(100.0, rel=1e-12)

        no_token = _estimate(optimizer.addr, *tls)
        assert no_token.returncode != 0
        assert "UNAUTHENTICATED" in no_token.stderr

        # Without a client certificate the mTLS handshake fails.
        no_client_cert = _node_cli(
            optimizer.addr, "--ca", str(pki["ca"]), "--server-name", "localhost", "--deadline-ms", "5000",
            "health", SERVICE,
        )
        assert no_client_cert.returncode != 0
        assert "UNAVAILABLE" in no_client_cert.stderr or "DEADLINE_EXCEEDED" in no_client_cert.stderr

        optimizer.terminate_and_check()


@pytest.mark.skipif(NPM is None, reason="npm is not installed")
def test_node_client_unit_tests_pass() -> None:
    result = subprocess.run(
        [NPM, "test"], cwd=NODE_DIR, capture_output=True, text=True, timeout=240, env=_env()
    )
    assert result.returncode == 0, f"npm test failed\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    assert "# fail 0" in result.stdout
