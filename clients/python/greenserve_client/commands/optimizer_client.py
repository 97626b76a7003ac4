"""What `greenserve fleet` and `greenserve plan` share: the optimizer's address and connection flags, one call to
OptimizerService, and how errors end a command (one line on stderr; exit 2 for bad input, 1 otherwise)."""

from __future__ import annotations

import argparse
import sys

import grpc

from greenserve.common.config import DependencyAddresses
from greenserve_client import rpc_errors
from greenserve_client.cli import _add_connection_flags, _channel_config


def add_optimizer_flags(parser: argparse.ArgumentParser, *, timeout_s: float | None = None) -> None:
    parser.add_argument("--optimizer-addr", help="host:port (default env GREENSERVE_OPTIMIZER_ADDR or 127.0.0.1:50053)")
    _add_connection_flags(parser)
    if timeout_s is not None:
        parser.set_defaults(timeout_s=timeout_s)


def address(ns: argparse.Namespace) -> str:
    return ns.optimizer_addr or DependencyAddresses().optimizer_addr


async def call(ns: argparse.Namespace, method: str, request: object) -> object:
    """One unary OptimizerService call on a fresh channel (TLS, token and deadline from the flags)."""
    from greenserve.common.client import create_channel
    from greenserve.v1 import optimizer_pb2_grpc

    channel = create_channel(_channel_config(ns, address(ns)))
    try:
        return await getattr(optimizer_pb2_grpc.OptimizerServiceStub(channel), method)(request)
    finally:
        await channel.close()


def fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def rpc_error(prog: str, exc: grpc.aio.AioRpcError, ns: argparse.Namespace | None = None) -> int:
    """One line on stderr; an optimizer that cannot be reached is named with its address (from ``ns``)."""
    return rpc_errors.report(prog, exc, "optimizer", address(ns) if ns is not None else "its address",
                             "--optimizer-addr")


def check_timeout(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    if not 0 < getattr(ns, "timeout_s", 1.0) <= 86400:  # also refuses nan
        parser.error(f"--timeout-s must be in (0, 86400] seconds, got {ns.timeout_s}")
