"""Typed Python client: one object holding a channel and a stub per greenserve service.

    async with GreenserveClient.local() as gs:
        reply = await gs.optimizer.EstimateCarbon(optimizer_pb2.EstimateCarbonRequest(energy_kwh=1, ci_g_per_kwh=100))
        result = await gs.generate(router_pb2.GenerateRequest(...))  # text reassembled from the stream

Stubs are the generated greenserve.v1 ones (typed through the .pyi files), over channels from
greenserve.common.client (TLS/mTLS, bearer token, deadlines, retries of idempotent calls).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import grpc

from greenserve.common.client import ChannelConfig, create_channel
from greenserve.v1 import (
    cache_manager_pb2_grpc,
    forecaster_pb2_grpc,
    gpu_partitioner_pb2_grpc,
    optimizer_pb2_grpc,
    profiler_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
)
from greenserve_client.generation import Generation, generate
from greenserve_client.services import SERVICES


class GreenserveClient:
    """Channels and stubs for the six services; close with `await client.close()` or `async with`."""

    forecaster: forecaster_pb2_grpc.ForecasterServiceStub
    profiler: profiler_pb2_grpc.ProfilerServiceStub
    optimizer: optimizer_pb2_grpc.OptimizerServiceStub
    cache_manager: cache_manager_pb2_grpc.CacheManagerServiceStub
    gpu_partitioner: gpu_partitioner_pb2_grpc.GpuPartitionerServiceStub
    router: router_pb2_grpc.RouterServiceStub

    def __init__(self, configs: Mapping[str, ChannelConfig]) -> None:
        unknown = set(configs) - {s.name for s in SERVICES}
        if unknown:
            raise ValueError(f"unknown services: {', '.join(sorted(unknown))}")
        self.channels: dict[str, grpc.aio.Channel] = {}
        for info in SERVICES:
            if info.name in configs:
                channel = create_channel(configs[info.name])
                self.channels[info.name] = channel
                setattr(self, info.name, info.stub(channel))

    @classmethod
    def local(cls, host: str = "127.0.0.1", ports: Mapping[str, int] | None = None, **options: Any) -> GreenserveClient:
        """Clients for services on `host` at their default (or given) ports; options go to ChannelConfig."""
        ports = dict(ports or {})
        base = ChannelConfig(address="", **options)
        return cls({s.name: replace(base, address=f"{host}:{ports.get(s.name, s.default_port)}") for s in SERVICES})

    async def generate(self, request: router_pb2.GenerateRequest, **options: Any) -> Generation:
        """``RouterService.Generate`` reassembled (generation.py; options: ``timeout_s``, ``on_text``)."""
        return await generate(self.router, request, **options)

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()

    async def __aenter__(self) -> GreenserveClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
