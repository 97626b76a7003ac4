"""GpuPartitionerService wiring: settings, servicer and the build function the process entry point runs."""

from __future__ import annotations

from typing import ClassVar

from greenserve.common.app import ServiceContext
from greenserve.common.config import DependencyAddresses, ServiceSettings
from greenserve.common.server import Registration, registration
from greenserve.v1 import gpu_partitioner_pb2, gpu_partitioner_pb2_grpc


class GpuPartitionerSettings(ServiceSettings, DependencyAddresses):
    """Flags and GREENSERVE_* env vars of greenserve-gpu-partitioner."""

    service_name: ClassVar[str] = "gpu_partitioner"


class GpuPartitionerServicer(gpu_partitioner_pb2_grpc.GpuPartitionerServiceServicer):
    """greenserve.v1.GpuPartitionerService. RPCs not defined here answer UNIMPLEMENTED (the generated base)."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx


def build(ctx: ServiceContext) -> list[Registration]:
    return [registration(gpu_partitioner_pb2, gpu_partitioner_pb2_grpc, "GpuPartitionerService", GpuPartitionerServicer(ctx))]
