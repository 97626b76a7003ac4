"""The loop of `greenserve up`'s local fleet: history, fleet, first plan.

Once the six services answer, this feeds the forecaster the demo's real data (Spain's grid carbon intensity and the
Azure 2024 conversation load shape, `greenserve/common/data/demo/`, shifted so that their last hour is the hour
before now and the load scaled to the local engines), declares the fleet (one pool with the emulated engines, the
LMCache server's DRAM limit, the gpu-partitioner's simulated GPU with a declared MIG layout whose instances host
engines of the pool) and asks for the first plan. From then on the optimizer's scheduler re-plans ahead of each hour
and on events, and the router, the cache-manager and the gpu-partitioner enforce each plan.
"""

from __future__ import annotations

import asyncio
import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import grpc

from greenserve.common.client import ChannelConfig, create_channel
from greenserve.common.clock import hour_floor_s, now_s
from greenserve.v1 import (
    common_pb2,
    forecaster_pb2,
    forecaster_pb2_grpc,
    optimizer_pb2,
    optimizer_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
)

REGION = "ES"
DEMO_CI = "es_2023_03_ci_hourly.csv"
DEMO_LOAD = "azure2024_conv_requests_hourly.csv"
MIB = 1024 * 1024
# The declared layout of the simulated GPU: two halves, each hosting an engine of the pool.
DEMO_LAYOUTS = {
    common_pb2.GPU_MODEL_A100_40GB: ("3g.20gb", 4),
    common_pb2.GPU_MODEL_A100_80GB: ("3g.40gb", 4),
    common_pb2.GPU_MODEL_H100_80GB: ("3g.40gb", 4),
    common_pb2.GPU_MODEL_H200_141GB: ("3g.71gb", 4),
}


@dataclass(frozen=True)
class LocalLoopOptions:
    pool: str
    model: str = "meta-llama/Meta-Llama-3-8B-Instruct"
    peak_requests_per_s: float = 2.0
    # 0: the planner keeps the LMCache server's size. A limit lets the GreenCache ILP size the DRAM tier, which on
    # LMCache 0.5.6 needs a controlled restart (the cache-manager's --lmcache-restart-command).
    cache_dram_limit_bytes: int = 0
    cache_step_bytes: int = 0  # the planner's size step for that tier (0: its default)
    gpu_wait_s: float = 30.0
    region: str = REGION
    # History to ingest instead of the shifted demo slices: (Unix seconds, value) points, load in requests/s.
    ci_history: tuple[tuple[float, float], ...] | None = None
    load_history: tuple[tuple[float, float], ...] | None = None


def _rows(name: str) -> list[list[str]]:
    text = resources.files("greenserve.common").joinpath("data", "demo", name).read_text()
    return list(csv.reader(text.splitlines()))[1:]


def demo_history(end_s: float) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(CI points, load shape points) ending at the hour before ``end_s``: (Unix seconds, value)."""
    last = hour_floor_s(end_s) - 3600.0
    ci_values = [float(r[1]) for r in _rows(DEMO_CI)]
    load_values = [float(r[1]) for r in _rows(DEMO_LOAD)]
    ci = [(last - 3600.0 * (len(ci_values) - 1 - i), v) for i, v in enumerate(ci_values)]
    load = [(last - 3600.0 * (len(load_values) - 1 - i), v) for i, v in enumerate(load_values)]
    return ci, load


def _points(values: Sequence[tuple[float, float]]) -> list[common_pb2.TimeSeriesPoint]:
    out = []
    for t, v in values:
        p = common_pb2.TimeSeriesPoint(value=v)
        p.time.FromSeconds(int(t))
        out.append(p)
    return out


async def ingest(forecaster: grpc.aio.Channel, ref: common_pb2.SeriesRef, points: Sequence[tuple[float, float]],
                 source: str) -> None:
    if points:
        await forecaster_pb2_grpc.ForecasterServiceStub(forecaster).IngestPoints(forecaster_pb2.IngestPointsRequest(
            series=ref, resolution_s=3600, points=_points(points), source=source))


def ci_ref(region: str) -> common_pb2.SeriesRef:
    return common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key=region,
                                carbon_signal=common_pb2.CARBON_SIGNAL_DIRECT, unit=common_pb2.UNIT_G_PER_KWH)


def load_ref(pool: str) -> common_pb2.SeriesRef:
    return common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_LOAD, key=pool, unit=common_pb2.UNIT_REQUESTS_PER_S)


async def seed_history(forecaster: grpc.aio.Channel, options: LocalLoopOptions) -> None:
    if options.ci_history is not None and options.load_history is not None:
        ci, load = list(options.ci_history), list(options.load_history)
        source = "demo"
    else:
        ci, load = demo_history(now_s())
        peak = max(v for _, v in load) or 1.0
        load = [(t, v / peak * options.peak_requests_per_s) for t, v in load]
        source = "demo:electricitymaps-es-2023 / azure2024-conv"
    await ingest(forecaster, ci_ref(options.region), ci, source)
    await ingest(forecaster, load_ref(options.pool), load, source)


async def _reported_gpus(stub: optimizer_pb2_grpc.OptimizerServiceStub, wait_s: float) -> list[common_pb2.Gpu]:
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        fleet = (await stub.GetFleet(optimizer_pb2.GetFleetRequest())).fleet
        gpus = [g for g in fleet.gpus if g.reported_by.startswith("gpu-partitioner/")]
        if gpus or asyncio.get_running_loop().time() > deadline:
            return gpus
        await asyncio.sleep(0.5)


def demo_fleet(options: LocalLoopOptions, engines: list[common_pb2.Engine],
               gpus: list[common_pb2.Gpu]) -> common_pb2.FleetInventory:
    pool = common_pb2.Pool(
        name=options.pool, model=options.model, region=options.region,
        slo=common_pb2.Slo(ttft_s=2.0, tpot_s=0.2, attainment_fraction=0.9),
        max_cache_dram_bytes=options.cache_dram_limit_bytes, cache_step_bytes=options.cache_step_bytes,
        mean_prompt_tokens=1024, mean_output_tokens=128,
        variants=[common_pb2.ModelVariant(name="8b-bf16", model=options.model, quality_fraction=1.0,
                                          quality_source="reference variant", simulator_model="llama3-8b")])
    for engine in engines:
        pool.engines.add(id=engine.id, url=engine.url, pool=options.pool, kind=common_pb2.ENGINE_KIND_SIMULATED,
                         hardware="A100-80GB", model_variant="8b-bf16")
    fleet = common_pb2.FleetInventory(pools=[pool])
    for gpu in gpus[:1]:
        declared = fleet.gpus.add(uuid=gpu.uuid, node=gpu.node, pool=options.pool, model=gpu.model)
        shape = DEMO_LAYOUTS.get(gpu.model)
        if shape is not None:
            profile, size = shape
            for start in (0, size):
                declared.instances.add(profile=profile, placement_start=start, placement_size=size)
    return fleet


async def start_local_loop(addresses: dict[str, str], options: LocalLoopOptions) -> common_pb2.Plan | None:
    """Seeds history, declares the fleet, computes the first plan; returns it (None when planning was refused)."""
    channels = {name: create_channel(ChannelConfig(address=addr, default_timeout_s=30.0))
                for name, addr in addresses.items()}
    try:
        await seed_history(channels["forecaster"], options)
        router = router_pb2_grpc.RouterServiceStub(channels["router"])
        engines = [s.engine for s in (await router.ListEngines(router_pb2.ListEnginesRequest())).engines
                   if s.engine.pool == options.pool]
        optimizer = optimizer_pb2_grpc.OptimizerServiceStub(channels["optimizer"])
        gpus = await _reported_gpus(optimizer, options.gpu_wait_s)
        await optimizer.SetFleet(optimizer_pb2.SetFleetRequest(fleet=demo_fleet(options, engines, gpus)))
        reply = await optimizer.ComputePlan(optimizer_pb2.ComputePlanRequest(trigger="manual"))
        return reply.plan
    finally:
        for channel in channels.values():
            await channel.close()


def _count(n: int, name: str) -> str:
    return f"{n} {name}" if n == 1 else f"{n} {name}s"


def first_plan_summary(plan: common_pb2.Plan | None) -> str:
    if plan is None:
        return "no plan"
    first = plan.intervals[0] if plan.intervals else None
    parts = [f"plan v{plan.version} in force"]
    if first is not None:
        parts.append(", ".join(_count(len(items), name) for items, name in (
            (first.routing_weights, "routing weight"), (first.cache_targets, "cache target"),
            (first.mig_layouts, "MIG layout"))))
        if first.pools:
            parts.append(f"CI {first.pools[0].ci_g_per_kwh:.0f} g/kWh")
    if math.isfinite(plan.expected_carbon.total_g):
        parts.append(f"expected {plan.expected_carbon.total_g / 1000:.2f} kgCO2e over {len(plan.intervals)} h")
    return "; ".join(parts)
