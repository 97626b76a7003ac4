"""The address Envoy routes a request to: its ORIGINAL_DST cluster takes ``ip:port`` only, so an engine
registered by host name (``http://localhost:8000``, a Kubernetes Service name) is resolved here, off the
request's critical section (the event loop's resolver thread), and kept for a while."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections import OrderedDict
from urllib.parse import urlsplit


class UnresolvableEngine(Exception):
    """The engine's host name has no address."""


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def destination(url: str) -> str:
    """``host:port`` of an engine URL as ORIGINAL_DST takes it (IPv6 in brackets); the host as written."""
    return _join(*_host_port(url))


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class EngineAddresses:
    """``ip:port`` of engine URLs. A name is resolved with IPv4 preferred (Envoy's own default lookup family,
    and engines often listen on IPv4 only) and kept for ``ttl_s``; at most ``max_names`` names are kept (the
    oldest resolution goes first)."""

    def __init__(self, ttl_s: float = 30.0, max_names: int = 4096) -> None:
        self.ttl_s = ttl_s
        self.max_names = max_names
        self._names: OrderedDict[tuple[str, int], tuple[str, float]] = OrderedDict()

    def cached(self, url: str) -> str | None:
        """The address now, without resolving: the URL's own for an IP, a fresh resolution's for a name."""
        host, port = _host_port(url)
        if is_ip(host):
            return _join(host, port)
        found = self._names.get((host, port))
        if found is None or found[1] < time.monotonic():
            return None
        return found[0]

    async def resolve(self, url: str) -> str:
        """The address of ``url``'s engine; UnresolvableEngine when its name has none."""
        address = self.cached(url)
        if address is not None:
            return address
        host, port = _host_port(url)
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise UnresolvableEngine(f"engine host {host!r} does not resolve: {exc}") from None
        found = {family: str(sockaddr[0]) for family, _, _, _, sockaddr in reversed(infos)}  # the first of each
        ip = found.get(socket.AF_INET) or found.get(socket.AF_INET6)
        if ip is None:
            raise UnresolvableEngine(f"engine host {host!r} has no IPv4 or IPv6 address")
        address = _join(ip, port)
        key = (host, port)
        self._names.pop(key, None)
        self._names[key] = (address, time.monotonic() + self.ttl_s)
        while len(self._names) > self.max_names:
            self._names.popitem(last=False)
        return address
