"""A plan's MIG layout applied end to end: the gpu-partitioner asks the REAL router to drain the engine on
the slice it will destroy, the router lets the in-flight stream finish and reports idle, the slice is
re-partitioned, and the engine is undrained. (Simulated MIG backend: there is no GPU here.)"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import grpc
from greenserve.gpu_partitioner.service import GpuPartitionerSettings
from greenserve.gpu_partitioner.service import build as build_partitioner
from greenserve.router.front.service import RouterSettings
from greenserve.router.front.service import build as build_router
from greenserve.simulator.emulator import EmulatorConfig, EngineEmulator
from greenserve.v1 import common_pb2, gpu_partitioner_pb2, gpu_partitioner_pb2_grpc, router_pb2, router_pb2_grpc


def _p(profile: str, start: int, size: int) -> common_pb2.MigPlacement:
    return common_pb2.MigPlacement(profile=profile, start=start, size=size)


async def _stream_tokens(url: str, model: str, max_tokens: int) -> tuple[int, float]:
    """Stream one completion; returns (content chunks received, monotonic time the stream ended)."""
    body = {"model": model, "prompt": "partition " * 20, "max_tokens": max_tokens, "stream": True}
    tokens = 0
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    tokens += 1
    return tokens, time.monotonic()


async def test_apply_drains_the_engine_on_the_destroyed_slice_through_the_router(start_inprocess: Any) -> None:
    emu = EngineEmulator(EmulatorConfig(host="127.0.0.1", port=0, time_scale=2.0))
    await emu.start()
    router_channel = partitioner_channel = None
    try:
        router = await start_inprocess(RouterSettings, build_router, http_port=0, watch_plans=False, feeds=False,
                                       health_interval_s=0.2, scrape_interval_s=0.1, stale_after_s=1.0,
                                       log_level="WARNING")
        router_http = f"http://127.0.0.1:{router.server.registrations[0].servicer.http.port}"
        partitioner = await start_inprocess(GpuPartitionerSettings, build_partitioner, backend="simulated",
                                            sim_gpus="A100-40GB", router_addr=router.address,
                                            energy_sample_interval_s=0)
        router_channel = grpc.aio.insecure_channel(router.address)
        partitioner_channel = grpc.aio.insecure_channel(partitioner.address)
        routers = router_pb2_grpc.RouterServiceStub(router_channel)
        mig = gpu_partitioner_pb2_grpc.GpuPartitionerServiceStub(partitioner_channel)

        gpu = (await mig.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())).gpus[0].uuid
        first = await mig.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(layout=common_pb2.MigLayout(
            gpu_uuid=gpu, placements=[_p("2g.10gb", 0, 2), _p("2g.10gb", 2, 2), _p("3g.20gb", 4, 4)])))
        assert first.record.state == gpu_partitioner_pb2.APPLY_STATE_SUCCEEDED, first.record.error
        slice_uuid = {i.placement_start: i.uuid for i in first.record.instances}[2]

        # the emulated engine "runs" on the 2g slice at start 2
        await routers.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
            id="e-left", url=emu.url, pool="default", model=emu.model, mig_uuid=slice_uuid)))
        for _ in range(100):  # until the router's health probe has seen it
            listed = await routers.ListEngines(router_pb2.ListEnginesRequest())
            if listed.engines and listed.engines[0].engine.state == common_pb2.ENGINE_STATE_HEALTHY:
                break
            await asyncio.sleep(0.05)

        # a long stream is in flight on that engine when the re-partition starts
        stream = asyncio.create_task(_stream_tokens(router_http, emu.model, max_tokens=120))
        await asyncio.sleep(0.3)
        assert not stream.done()
        second = await mig.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(
            layout=common_pb2.MigLayout(gpu_uuid=gpu, placements=[
                _p("2g.10gb", 0, 2), _p("1g.5gb", 2, 1), _p("1g.5gb", 3, 1), _p("3g.20gb", 4, 4)]),
            plan_version=7, drain_timeout_s=30))
        applied_at = time.monotonic()
        assert second.record.state == gpu_partitioner_pb2.APPLY_STATE_SUCCEEDED, second.record.error

        tokens, stream_ended_at = await asyncio.wait_for(stream, timeout=30)
        assert tokens == 120, "the drain let the in-flight stream finish"
        assert stream_ended_at <= applied_at, "the slice was destroyed only after the engine went idle"

        after = {i.placement_start: i for i in second.record.instances}
        assert sorted(after) == [0, 2, 3, 4]
        assert after[4].uuid == {i.placement_start: i.uuid for i in first.record.instances}[4], "3g kept running"
        assert slice_uuid not in {i.uuid for i in after.values()}
        # and the engine takes new work again (undrained)
        state = (await routers.ListEngines(router_pb2.ListEnginesRequest())).engines[0].engine.state
        assert state != common_pb2.ENGINE_STATE_DRAINING
        tokens, _ = await _stream_tokens(router_http, emu.model, max_tokens=3)
        assert tokens == 3
    finally:
        for channel in (router_channel, partitioner_channel):
            if channel is not None:
                await channel.close()
        await emu.stop()
