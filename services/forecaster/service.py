"""ForecasterService wiring: settings, servicer and the build function the process entry point runs."""

from __future__ import annotations

from typing import ClassVar

from greenserve.common.app import ServiceContext
from greenserve.common.config import DependencyAddresses, ServiceSettings
from greenserve.common.server import Registration, registration
from greenserve.v1 import forecaster_pb2, forecaster_pb2_grpc


class ForecasterSettings(ServiceSettings, DependencyAddresses):
    """Flags and GREENSERVE_* env vars of greenserve-forecaster."""

    service_name: ClassVar[str] = "forecaster"


class ForecasterServicer(forecaster_pb2_grpc.ForecasterServiceServicer):
    """greenserve.v1.ForecasterService. RPCs not defined here answer UNIMPLEMENTED (the generated base)."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx


def build(ctx: ServiceContext) -> list[Registration]:
    return [registration(forecaster_pb2, forecaster_pb2_grpc, "ForecasterService", ForecasterServicer(ctx))]
