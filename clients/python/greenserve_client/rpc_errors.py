"""How a client command reports a failed gRPC call, in one line on stderr: a service that cannot be reached is named
with its address and how to start it (not grpc's 'UNAVAILABLE: failed to connect to all addresses'); any other
failure as `CODE: details`."""

from __future__ import annotations

import sys

import grpc

# what grpc's details say when no connection could be made (as opposed to a service answering UNAVAILABLE itself)
_NOT_CONNECTED = ("failed to connect", "connection refused", "dns resolution failed", "errors resolving",
                  "no route to host", "network is unreachable", "connection reset")


def unreachable(exc: grpc.RpcError) -> bool:
    """The call failed because no connection to the service could be made."""
    details = (exc.details() or "").lower() if isinstance(exc, grpc.aio.AioRpcError) else ""
    return exc.code() == grpc.StatusCode.UNAVAILABLE and any(s in details for s in _NOT_CONNECTED)


def reason(details: str) -> str:
    """The last clause of grpc's details: 'connection refused' of '...: Failed to connect to remote host: Connection
    refused'."""
    last = details.rsplit(": ", 1)[-1].strip(" []")
    return last[:1].lower() + last[1:]


def unreachable_message(service: str, address: str, flag: str, details: str) -> str:
    """'cannot reach the optimizer at 127.0.0.1:50053 (connection refused): ...' with what starts the services and
    which flag and env var point elsewhere."""
    env = f"GREENSERVE_{service.upper().replace('-', '_')}_ADDR"
    return (f"cannot reach the {service} at {address} ({reason(details)}): is it running? `greenserve up` starts the six "
            f"services; {flag} or {env} gives another address")


def report(prog: str, exc: grpc.aio.AioRpcError, service: str, address: str, flag: str,
           bad_input: tuple[grpc.StatusCode, ...] = (grpc.StatusCode.INVALID_ARGUMENT,)) -> int:
    """Print the failure of a call to ``service`` at ``address``; the exit status: 2 for a code in ``bad_input``,
    else 1."""
    if unreachable(exc):
        print(f"{prog}: error: {unreachable_message(service, address, flag, exc.details() or '')}", file=sys.stderr)
        return 1
    print(f"{prog}: {exc.code().name}: {exc.details()}", file=sys.stderr)
    return 2 if exc.code() in bad_input else 1
