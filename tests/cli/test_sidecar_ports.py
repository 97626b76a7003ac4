"""`greenserve up` starts its sidecars before the services bind their ports: a sidecar must never be given a
port promised to a service (the kernel may hand out any port that is free at that instant)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from greenserve_client import sidecars


class _FakeSocket:
    """Hands out the ports of ``ports`` in order, as bind(0) would."""

    ports: Iterator[int]

    def __enter__(self) -> _FakeSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def bind(self, address: tuple[str, int]) -> None:
        self.port = next(self.ports)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


def test_free_port_skips_promised_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    _FakeSocket.ports = iter([50051, 50052, 41000])
    monkeypatch.setattr(sidecars.socket, "socket", _FakeSocket)
    assert sidecars.free_port(avoid=frozenset({50051, 50052})) == 41000


def test_free_port_returns_a_bindable_port() -> None:
    port = sidecars.free_port()
    assert 0 < port < 65536


def test_engines_never_share_a_port(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Two engines started together: the second must not get the port handed to the first, which has not bound it
    yet (seen in CI: engine-0 and engine-1 both on one port, the second failing with 'address already in use')."""
    _FakeSocket.ports = iter([41000, 41000, 41001])
    monkeypatch.setattr(sidecars.socket, "socket", _FakeSocket)
    started: list[list[str]] = []
    monkeypatch.setattr(sidecars, "_spawn", lambda name, cmd, url, health, logs, env=None: started.append(cmd) or url)
    urls = sidecars.start_engines(2, profile=None, time_scale=1.0, logs=tmp_path)
    assert urls == ["http://127.0.0.1:41000", "http://127.0.0.1:41001"]
