"""Resident memory of the optimizer, the gpu-partitioner and the profiler under a sustained stream of work levels off under a
stated bound (issue 21; the bounds are in docs/optimizer.md and docs/gpu_partitioner.md, "Memory").

Optimizer: plans computed and activated one after another (each stored, published to a watcher and read back),
enforcement and GPU reports from ever new instances and nodes. Gpu-partitioner: inventory, layout enumeration and
diff requests. Profiler: profiles stored, read and listed. After a warm-up, the rise between the first and the last third of the window must stay small."""

from __future__ import annotations

import asyncio
import os
import time

import grpc
import pytest
from greenserve.v1 import (
    common_pb2,
    gpu_partitioner_pb2,
    gpu_partitioner_pb2_grpc,
    optimizer_pb2,
    optimizer_pb2_grpc,
)

from tests.conftest import free_port
from tests.optimizer.conftest import ci_ref, engine, forecaster, ingest_daily, load_ref, pool  # noqa: F401
from tests.process import rss_bytes, start_service_process

LOAD_S = float(os.environ.get("GREENSERVE_MEMORY_TEST_S", "8"))
OPTIMIZER_RSS_BOUND_MIB = 500
PARTITIONER_RSS_BOUND_MIB = 300
PROFILER_RSS_BOUND_MIB = 400
GROWTH_LIMIT_MIB = 16
MIB = 1 << 20


async def _sample(pid: int, stop: asyncio.Event, samples: list[tuple[float, int]]) -> None:
    while not stop.is_set():
        samples.append((time.monotonic(), rss_bytes(pid)))
        await asyncio.sleep(0.2)


def _levelled(samples: list[tuple[float, int]]) -> tuple[float, float, float]:
    third = max(1, len(samples) // 3)
    first = sum(s for _, s in samples[:third]) / third / MIB
    last = sum(s for _, s in samples[-third:]) / third / MIB
    return first, last, max(s for _, s in samples) / MIB


@pytest.mark.slow
async def test_optimizer_memory_levels_off(tmp_path, forecaster) -> None:  # noqa: F811 - the imported fixture
    fc = grpc.aio.insecure_channel(forecaster.address)
    await ingest_daily(fc, ci_ref("FR"), 50.0, 20.0)
    await ingest_daily(fc, load_ref("chat"), 2.0, 1.0)
    port = free_port()
    proc = await asyncio.to_thread(
        start_service_process, "greenserve.optimizer", "greenserve.v1.OptimizerService", tmp_path / "opt", port,
        env={}, log_name="optimizer.log",
        extra_args=[f"--forecaster-addr={forecaster.address}", "--profiler-addr=127.0.0.1:9",
                    "--cache-manager-addr=127.0.0.1:9", "--no-schedule-plans", "--cache-solver=keep",
                    "--mig-solver=keep", "--log-level=WARNING"])
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = optimizer_pb2_grpc.OptimizerServiceStub(channel)
            await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(
                pools=[pool("chat", [engine(f"e{i}") for i in range(4)])])))
            watch = stub.WatchPlans(optimizer_pb2.WatchPlansRequest())
            stop, samples, n = asyncio.Event(), [], 0

            async def drain_watch() -> None:
                async for _ in watch:
                    pass

            watcher = asyncio.create_task(drain_watch())
            deadline = time.monotonic() + 1.0 + LOAD_S
            sampler = None
            while time.monotonic() < deadline:
                n += 1
                plan = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=24))).plan
                await stub.GetPlan(optimizer_pb2.GetPlanRequest(version=plan.version))
                await stub.ReportEnforcement(optimizer_pb2.ReportEnforcementRequest(report=optimizer_pb2.EnforcementReport(
                    component="router", instance=f"r{n}", plan_version=plan.version,
                    state=optimizer_pb2.ENFORCEMENT_STATE_APPLIED)))
                await stub.ReportGpus(optimizer_pb2.ReportGpusRequest(node=f"n{n % 50}", gpus=[common_pb2.Gpu(
                    uuid=f"GPU-{n % 50}", model=common_pb2.GPU_MODEL_A100_40GB)]))
                if sampler is None and time.monotonic() > deadline - LOAD_S:
                    sampler = asyncio.create_task(_sample(proc.pid, stop, samples))
            stop.set()
            await sampler
            watch.cancel()
            watcher.cancel()
        first, last, peak = _levelled(samples)
        print(f"optimizer RSS first {first:.1f} last {last:.1f} peak {peak:.1f} MiB over {n} plans")
        assert n >= 3
        assert peak < OPTIMIZER_RSS_BOUND_MIB, (first, last, peak)
        assert last - first < GROWTH_LIMIT_MIB, (first, last, peak, n)
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.slow
async def test_gpu_partitioner_memory_levels_off(tmp_path) -> None:
    port = free_port()
    proc = await asyncio.to_thread(
        start_service_process, "greenserve.gpu_partitioner", "greenserve.v1.GpuPartitionerService",
        tmp_path / "gp", port, env={}, log_name="gp.log",
        extra_args=["--backend=simulated", "--sim-gpus=A100-40GB,H100-80GB", "--no-follow-plans",
                    "--energy-sample-interval-s=0", "--log-level=WARNING"])
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = gpu_partitioner_pb2_grpc.GpuPartitionerServiceStub(channel)
            stop, samples = asyncio.Event(), []
            deadline = time.monotonic() + 1.0 + LOAD_S
            sampler = None
            while time.monotonic() < deadline:
                await stub.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())
                await stub.ListLayouts(gpu_partitioner_pb2.ListLayoutsRequest(gpu_model=common_pb2.GPU_MODEL_A100_40GB))
                await stub.ListLayouts(gpu_partitioner_pb2.ListLayoutsRequest(gpu_model=common_pb2.GPU_MODEL_H100_80GB))
                if sampler is None and time.monotonic() > deadline - LOAD_S:
                    sampler = asyncio.create_task(_sample(proc.pid, stop, samples))
            stop.set()
            await sampler
        first, last, peak = _levelled(samples)
        print(f"gpu-partitioner RSS first {first:.1f} last {last:.1f} peak {peak:.1f} MiB")
        assert peak < PARTITIONER_RSS_BOUND_MIB, (first, last, peak)
        assert last - first < GROWTH_LIMIT_MIB, (first, last, peak)
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.slow
async def test_profiler_memory_levels_off(tmp_path) -> None:
    from greenserve.v1 import profiler_pb2, profiler_pb2_grpc

    from tests.profiler.test_store import measured

    port = free_port()
    proc = await asyncio.to_thread(
        start_service_process, "greenserve.profiler", "greenserve.v1.ProfilerService", tmp_path / "pr", port, env={},
        log_name="profiler.log", extra_args=["--log-level=WARNING"])
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = profiler_pb2_grpc.ProfilerServiceStub(channel)
            stop, samples, n = asyncio.Event(), [], 0
            deadline = time.monotonic() + 1.0 + LOAD_S
            sampler = None
            while time.monotonic() < deadline:
                n += 1
                stored = (await stub.PutProfile(profiler_pb2.PutProfileRequest(
                    profile=measured(cache_dram_bytes=(n % 40) << 30)))).profile
                await stub.GetProfile(profiler_pb2.GetProfileRequest(config_key=stored.config_key))
                await stub.ListProfiles(profiler_pb2.ListProfilesRequest(latest_only=True))
                if sampler is None and time.monotonic() > deadline - LOAD_S:
                    sampler = asyncio.create_task(_sample(proc.pid, stop, samples))
            stop.set()
            await sampler
        first, last, peak = _levelled(samples)
        print(f"profiler RSS first {first:.1f} last {last:.1f} peak {peak:.1f} MiB over {n} profiles")
        assert peak < PROFILER_RSS_BOUND_MIB, (first, last, peak)
        assert last - first < GROWTH_LIMIT_MIB, (first, last, peak, n)
    finally:
        proc.kill()
        proc.wait(10)
