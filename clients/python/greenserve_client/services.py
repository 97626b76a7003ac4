"""The six greenserve services as a client sees them: names, default ports, gRPC service names, stubs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from greenserve.common.config import DEFAULT_PORTS
from greenserve.v1 import (
    cache_manager_pb2,
    cache_manager_pb2_grpc,
    forecaster_pb2,
    forecaster_pb2_grpc,
    gpu_partitioner_pb2,
    gpu_partitioner_pb2_grpc,
    optimizer_pb2,
    optimizer_pb2_grpc,
    profiler_pb2,
    profiler_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
)


@dataclass(frozen=True)
class ServiceInfo:
    """One service: `name` is its package name (cache_manager), `display` its CLI name (cache-manager)."""

    name: str
    grpc_service: str  # full name, e.g. greenserve.v1.OptimizerService
    stub: type[Any]

    @property
    def display(self) -> str:
        return self.name.replace("_", "-")

    @property
    def default_port(self) -> int:
        return DEFAULT_PORTS[self.name]

    @property
    def console_script(self) -> str:
        return f"greenserve-{self.display}"


def _info(name: str, pb2: Any, pb2_grpc: Any, service: str) -> ServiceInfo:
    return ServiceInfo(name, pb2.DESCRIPTOR.services_by_name[service].full_name, getattr(pb2_grpc, f"{service}Stub"))


# In start-up order: dependencies first, the request path (router) last.
SERVICES: tuple[ServiceInfo, ...] = (
    _info("forecaster", forecaster_pb2, forecaster_pb2_grpc, "ForecasterService"),
    _info("profiler", profiler_pb2, profiler_pb2_grpc, "ProfilerService"),
    _info("optimizer", optimizer_pb2, optimizer_pb2_grpc, "OptimizerService"),
    _info("cache_manager", cache_manager_pb2, cache_manager_pb2_grpc, "CacheManagerService"),
    _info("gpu_partitioner", gpu_partitioner_pb2, gpu_partitioner_pb2_grpc, "GpuPartitionerService"),
    _info("router", router_pb2, router_pb2_grpc, "RouterService"),
)
SERVICES_BY_NAME = {s.name: s for s in SERVICES}
