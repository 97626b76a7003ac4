"""ProfilerService wiring: settings, servicer and the build function the process entry point runs."""

from __future__ import annotations

from typing import ClassVar

from greenserve.common.app import ServiceContext
from greenserve.common.config import DependencyAddresses, ServiceSettings
from greenserve.common.server import Registration, registration
from greenserve.v1 import profiler_pb2, profiler_pb2_grpc


class ProfilerSettings(ServiceSettings, DependencyAddresses):
    """Flags and GREENSERVE_* env vars of greenserve-profiler."""

    service_name: ClassVar[str] = "profiler"


class ProfilerServicer(profiler_pb2_grpc.ProfilerServiceServicer):
    """greenserve.v1.ProfilerService. RPCs not defined here answer UNIMPLEMENTED (the generated base)."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx


def build(ctx: ServiceContext) -> list[Registration]:
    return [registration(profiler_pb2, profiler_pb2_grpc, "ProfilerService", ProfilerServicer(ctx))]
