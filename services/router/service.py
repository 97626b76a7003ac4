"""RouterService wiring: settings, servicer and the build function the process entry point runs."""

from __future__ import annotations

from typing import ClassVar

from greenserve.common.app import ServiceContext
from greenserve.common.config import DependencyAddresses, ServiceSettings
from greenserve.common.server import Registration, registration
from greenserve.v1 import router_pb2, router_pb2_grpc


class RouterSettings(ServiceSettings, DependencyAddresses):
    """Flags and GREENSERVE_* env vars of greenserve-router."""

    service_name: ClassVar[str] = "router"


class RouterServicer(router_pb2_grpc.RouterServiceServicer):
    """greenserve.v1.RouterService. RPCs not defined here answer UNIMPLEMENTED (the generated base)."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx


def build(ctx: ServiceContext) -> list[Registration]:
    return [registration(router_pb2, router_pb2_grpc, "RouterService", RouterServicer(ctx))]
