"""Shared fixtures: free ports, services started in-process, and a test certificate authority."""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from greenserve.common.app import start_service
from greenserve.common.config import ServiceSettings
from greenserve.common.server import ServiceServer
from greenserve.common.telemetry import Telemetry, setup_telemetry


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningService:
    server: ServiceServer
    address: str
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    telemetry: Telemetry


@pytest.fixture
async def start_inprocess(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Start a service in this event loop: `await start_inprocess(SettingsCls, build, **settings)`."""
    started: list[RunningService] = []

    async def start(settings_cls: type[ServiceSettings], build: Any, **overrides: Any) -> RunningService:
        values = {"host": "127.0.0.1", "port": 0, "data_dir": tmp_path / settings_cls.service_name, **overrides}
        settings = settings_cls.model_validate(values)
        spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
        telemetry = setup_telemetry(settings.service_name, span_exporter=spans, metric_reader=reader, install_global=False)
        server = await start_service(settings, build, telemetry=telemetry)
        running = RunningService(server, f"127.0.0.1:{server.port}", spans, reader, telemetry)
        started.append(running)
        return running

    yield start
    for running in started:
        await running.server.stop(0)
        running.telemetry.shutdown()


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca_cert: Path


def _write_key_and_cert(directory: Path, name: str, cert: Any, key: Any) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization

    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def _make_ca(common_name: str) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _make_leaf(ca_cert: Any, ca_key: Any, common_name: str, *, server: bool) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    builder = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(ca_key, hashes.SHA256()), key


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A test CA, a server certificate for localhost/127.0.0.1, a client certificate, and an unrelated CA."""
    directory = tmp_path_factory.mktemp("tls")
    ca_cert, ca_key = _make_ca("greenserve test CA")
    ca_path, _ = _write_key_and_cert(directory, "ca", ca_cert, ca_key)
    server_cert, server_key = _write_key_and_cert(directory, "server", *_make_leaf(ca_cert, ca_key, "localhost", server=True))
    client_cert, client_key = _write_key_and_cert(directory, "client", *_make_leaf(ca_cert, ca_key, "gateway", server=False))
    other_ca, other_key = _make_ca("some other CA")
    other_path, _ = _write_key_and_cert(directory, "other-ca", other_ca, other_key)
    return TlsFiles(ca_path, server_cert, server_key, client_cert, client_key, other_path)
