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

import os
import sys


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def main(argv: list[str]) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    service = argv[1] if len(argv) > 1 else ""
    env = os.environ
    addr = env.get("GREENSERVE_HEALTHCHECK_ADDR") or f"127.0.0.1:{env.get('GREENSERVE_PORT', '')}"
    if addr.endswith(":"):
        print("greenserve-healthcheck: set GREENSERVE_PORT or GREENSERVE_HEALTHCHECK_ADDR", file=sys.stderr)
        return 1
    timeout_s = float(env.get("GREENSERVE_HEALTHCHECK_TIMEOUT", "3"))

    cert, key = env.get("GREENSERVE_TLS_CERT"), env.get("GREENSERVE_TLS_KEY")
    if cert and key:
        ca = env.get("GREENSERVE_TLS_CA") or env.get("GREENSERVE_TLS_CLIENT_CA")
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(ca) if ca else None,
            private_key=_read(key),
            certificate_chain=_read(cert),
        )
        name = env.get("GREENSERVE_HEALTHCHECK_SERVER_NAME", "localhost")
        channel = grpc.secure_channel(addr, creds, options=[("grpc.ssl_target_name_override", name)])
    else:
        channel = grpc.insecure_channel(addr)

    metadata = []
    token_file = env.get("GREENSERVE_AUTH_TOKEN_FILE")
    if token_file:
        metadata.append(("authorization", "Bearer " + _read(token_file).decode().strip()))

    try:
        with channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s, metadata=metadata
            )
    except grpc.RpcError as err:
        print(f"greenserve-healthcheck: {addr}: {err.code().name}: {err.details()}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        print(f"greenserve-healthcheck: {addr}: {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
