"""CacheManagerService wiring: settings, servicer and the build function the process entry point runs."""

from __future__ import annotations

from typing import ClassVar

from greenserve.common.app import ServiceContext
from greenserve.common.config import DependencyAddresses, ServiceSettings
from greenserve.common.server import Registration, registration
from greenserve.v1 import cache_manager_pb2, cache_manager_pb2_grpc


class CacheManagerSettings(ServiceSettings, DependencyAddresses):
    """Flags and GREENSERVE_* env vars of greenserve-cache-manager."""

    service_name: ClassVar[str] = "cache_manager"


class CacheManagerServicer(cache_manager_pb2_grpc.CacheManagerServiceServicer):
    """greenserve.v1.CacheManagerService. RPCs not defined here answer UNIMPLEMENTED (the generated base)."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx


def build(ctx: ServiceContext) -> list[Registration]:
    return [registration(cache_manager_pb2, cache_manager_pb2_grpc, "CacheManagerService", CacheManagerServicer(ctx))]
