"""The image's health check (deploy/docker/healthcheck.py) against a real service started with the environment
the production overlay gives a pod (paths remapped to temporary files), as the exec probes run it."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.deploy_files import HEALTHCHECK, production_patches


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pod_pki(directory: Path) -> dict[str, Path]:
    """A CA and one leaf for server and client auth with the SANs cert-manager gives (certificates.yaml)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def write(name: str, cert: Any, key: Any) -> tuple[Path, Path]:
        c, k = directory / f"{name}.crt", directory / f"{name}.key"
        c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
        return c, k

    now = dt.datetime.now(dt.timezone.utc)

    def ca(cn: str) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256()))
        return cert, key

    ca_cert, ca_key = ca("greenserve-ca")
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "greenserve-optimizer")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("greenserve-optimizer"), x509.DNSName("localhost"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_path, _ = write("ca", ca_cert, ca_key)
    cert_path, key_path = write("tls", leaf, key)
    other_path, _ = write("other-ca", *ca("some other CA"))
    return {"ca.crt": ca_path, "tls.crt": cert_path, "tls.key": key_path, "other-ca.crt": other_path}


def _healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(HEALTHCHECK)], env=env, capture_output=True, text=True, timeout=30)


def test_healthcheck_against_a_service_started_with_the_production_pod_environment(tmp_path: Path) -> None:
    """The optimizer started as its console script would be in a production pod: mTLS, token file;
    the exec probe's command reports SERVING, and refuses a server it cannot verify."""
    pki = _pod_pki(tmp_path)
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    remap = {"/etc/greenserve/tls/tls.crt": pki["tls.crt"], "/etc/greenserve/tls/tls.key": pki["tls.key"],
             "/etc/greenserve/tls/ca.crt": pki["ca.crt"], "/etc/greenserve/auth/token": token}
    (ops,) = [d for t, d in production_patches().values() if isinstance(d, list)]
    pod_env = {op["value"]["name"]: str(remap[op["value"]["value"]]) for op in ops if op["path"].endswith("/env/-")}
    assert set(pod_env) >= {"GREENSERVE_TLS_CERT", "GREENSERVE_TLS_KEY", "GREENSERVE_TLS_CLIENT_CA",
                            "GREENSERVE_AUTH_TOKEN_FILE"}

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GREENSERVE_", "OTEL_"))}
    env.update(pod_env)
    env.update({"GREENSERVE_HOST": "127.0.0.1", "GREENSERVE_PORT": str(port),
                "GREENSERVE_DATA_DIR": str(tmp_path / "data"), "GREENSERVE_LOG_LEVEL": "warning"})
    proc = subprocess.Popen([sys.executable, "-m", "greenserve.optimizer"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        result = _healthcheck(env)
        while result.returncode != 0 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.3)
            result = _healthcheck(env)
        if result.returncode != 0:
            proc.kill()
            pytest.fail(f"no SERVING answer on 127.0.0.1:{port} with the pod's GREENSERVE_* environment: "
                        f"{result.stderr.strip()}\nservice output:\n{proc.communicate()[0]}")

        wrong_ca = {**env, "GREENSERVE_TLS_CA": str(pki["other-ca.crt"])}
        assert _healthcheck(wrong_ca).returncode == 1, "a server the CA does not vouch for is not healthy"
        plaintext = {k: v for k, v in env.items() if not k.startswith("GREENSERVE_TLS_")}
        assert _healthcheck(plaintext).returncode == 1, "plaintext against a TLS server fails"
        no_port = {k: v for k, v in env.items() if k != "GREENSERVE_PORT"}
        assert _healthcheck(no_port).returncode == 1

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=25) == 0, "graceful stop on SIGTERM within terminationGracePeriodSeconds"
        assert _healthcheck(env).returncode == 1, "nothing serving any more"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
