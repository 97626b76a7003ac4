#!/usr/bin/env python3
"""Health check for a greenserve container: one grpc.health.v1 Check against the local server.

Installed in every service image as `greenserve-healthcheck`; used by the image HEALTHCHECK, by
deploy/compose.yaml and by the Kubernetes exec probes of the production overlay (Kubernetes'
native `grpc:` probes cannot speak TLS, so they are used only where TLS is off).

It reads the same environment as the service it checks, so one command works with and without
TLS, mTLS and a bearer token:

  GREENSERVE_HEALTHCHECK_ADDR   host:port to check (default 127.0.0.1:$GREENSERVE_PORT)
  GREENSERVE_PORT               the service's gRPC port
  GREENSERVE_TLS_CERT/_KEY      when set: connect over TLS and present this pair as the client
                                certificate (the pod's certificate is issued for client auth too)
  GREENSERVE_TLS_CA             CA bundle that verifies the server (the cluster CA); else
                                GREENSERVE_TLS_CLIENT_CA; else the system roots
  GREENSERVE_HEALTHCHECK_SERVER_NAME   TLS name to verify (default "localhost", which every
                                certificate of deploy/k8s carries)
  GREENSERVE_AUTH_TOKEN_FILE    bearer token sent as `authorization: Bearer ...`
  GREENSERVE_HEALTHCHECK_TIMEOUT  seconds (default 3)

Usage: greenserve-healthcheck [SERVICE]   SERVICE is a fully-qualified gRPC service name such as
greenserve.v1.Router; empty (the default) asks about the whole server.
Exit status 0 when SERVING, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import grpc

    from greenserve.common.client import ChannelConfig, check_health, create_channel

    service = argv[1] if len(argv) > 1 else ""
    env = os.environ
    addr = env.get("GREENSERVE_HEALTHCHECK_ADDR") or f"127.0.0.1:{env.get('GREENSERVE_PORT', '')}"
    if addr.endswith(":"):
        print("greenserve-healthcheck: set GREENSERVE_PORT or GREENSERVE_HEALTHCHECK_ADDR", file=sys.stderr)
        return 1
    timeout_s = float(env.get("GREENSERVE_HEALTHCHECK_TIMEOUT", "3"))
    cert, key = env.get("GREENSERVE_TLS_CERT"), env.get("GREENSERVE_TLS_KEY")
    tls = bool(cert and key)
    ca = env.get("GREENSERVE_TLS_CA") or env.get("GREENSERVE_TLS_CLIENT_CA")
    token_file = env.get("GREENSERVE_AUTH_TOKEN_FILE")
    config = ChannelConfig(
        address=addr,
        token=Path(token_file).read_text().strip() if token_file else None,
        tls=tls,
        tls_ca=Path(ca) if tls and ca else None,
        tls_cert=Path(cert) if tls else None,
        tls_key=Path(key) if tls else None,
        server_name_override=env.get("GREENSERVE_HEALTHCHECK_SERVER_NAME", "localhost") if tls else None,
        default_timeout_s=timeout_s,
    )

    async def check() -> str:
        channel = create_channel(config)
        try:
            return await check_health(channel, service)
        finally:
            await channel.close()

    try:
        status = asyncio.run(check())
    except grpc.aio.AioRpcError as err:
        print(f"greenserve-healthcheck: {addr}: {err.code().name}: {err.details()}", file=sys.stderr)
        return 1
    if status != "SERVING":
        print(f"greenserve-healthcheck: {addr}: {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
