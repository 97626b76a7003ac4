"""OptimizerService wiring: settings, servicer and the build function the process entry point runs."""

from __future__ import annotations

from typing import ClassVar

import grpc

from greenserve.common import carbon
from greenserve.common.app import ServiceContext
from greenserve.common.carbon_messages import (
    breakdown_to_proto,
    params_from_proto,
    params_to_proto,
    require_finite,
)
from greenserve.common.config import DependencyAddresses, ServiceSettings
from greenserve.common.server import Registration, registration
from greenserve.v1 import optimizer_pb2, optimizer_pb2_grpc


class OptimizerSettings(ServiceSettings, DependencyAddresses):
    """Flags and GREENSERVE_* env vars of greenserve-optimizer."""

    service_name: ClassVar[str] = "optimizer"


def estimate_carbon(request: optimizer_pb2.EstimateCarbonRequest) -> optimizer_pb2.EstimateCarbonResponse:
    """GreenLLM Eq. 1-3 for the compute platform plus GreenCache Eq. 4 for allocated cache storage."""
    energy_kwh = require_finite("energy_kwh", request.energy_kwh, minimum=0.0)
    ci = require_finite("ci_g_per_kwh", request.ci_g_per_kwh, minimum=0.0)
    duration_s = require_finite("duration_s", request.duration_s, minimum=0.0)
    batch = require_finite("mean_batch_size", request.mean_batch_size or 1.0, minimum=1.0)
    params, platform = params_from_proto(request.carbon_params)
    compute = carbon.request_carbon(
        duration_s=duration_s, energy_kwh=energy_kwh, ci_g_per_kwh=ci, mean_batch_size=batch,
        platform=platform, pue=params.pue,
    )
    storage_g = carbon.cache_embodied_g(
        allocated_bytes=request.cache_allocated_bytes, duration_s=duration_s,
        lifetime_s=params.ssd_lifetime_s, ssd_embodied_g_per_tb=params.ssd_embodied_g_per_tb,
    )
    return optimizer_pb2.EstimateCarbonResponse(
        carbon=breakdown_to_proto(
            operational_g=compute.operational_g, embodied_compute_g=compute.embodied_g,
            embodied_storage_g=storage_g, energy_kwh=energy_kwh, ci_g_per_kwh=ci,
        ),
        carbon_params=params_to_proto(params, platform),
    )


class OptimizerServicer(optimizer_pb2_grpc.OptimizerServiceServicer):
    """greenserve.v1.OptimizerService. RPCs not defined here answer UNIMPLEMENTED (the generated base)."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    async def EstimateCarbon(
        self, request: optimizer_pb2.EstimateCarbonRequest, context: grpc.aio.ServicerContext
    ) -> optimizer_pb2.EstimateCarbonResponse:
        return estimate_carbon(request)


def build(ctx: ServiceContext) -> list[Registration]:
    return [registration(optimizer_pb2, optimizer_pb2_grpc, "OptimizerService", OptimizerServicer(ctx))]
