"""The loop end to end, every service in this process except the engines: two pools, two simulated A100-40GB GPUs,
emulated engines and a real LMCache server. A plan is computed and enforced by every component (router weights in
force, the LMCache size applied by a controlled restart, a MIG layout per GPU with engines started on its instances
and registered with the router); then a layout change drains and deregisters the engines on the destroyed instances
before new ones are started; every component reports APPLIED, and GetPlanStatus says the fleet matches the plan."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import grpc
import pytest
from greenserve.cache_manager.service import build as build_cache_manager
from greenserve.cache_manager.settings import CacheManagerSettings
from greenserve.gpu_partitioner.service import GpuPartitionerSettings
from greenserve.gpu_partitioner.service import build as build_partitioner
from greenserve.optimizer.service import OptimizerSettings
from greenserve.optimizer.service import build as build_optimizer
from greenserve.router.front.service import RouterSettings
from greenserve.router.front.service import build as build_router
from greenserve.simulator.emulator import EmulatorConfig, EngineEmulator
from greenserve.v1 import (
    cache_manager_pb2,
    cache_manager_pb2_grpc,
    common_pb2,
    optimizer_pb2,
    optimizer_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
)

from tests.conftest import free_port
from tests.optimizer.conftest import ci_ref, ingest_daily, load_ref

MIB = 1 << 20
SLO = common_pb2.Slo(ttft_s=2.0, tpot_s=0.2, attainment_fraction=0.9)


async def _until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.3)


@pytest.mark.slow
async def test_two_pools_two_gpus_plan_enforced_end_to_end(start_inprocess, lmcache_server, tmp_path) -> None:
    from tests.optimizer.conftest import ForecasterSettings, build_forecaster

    forecaster = await start_inprocess(ForecasterSettings, build_forecaster, forecast_model="seasonal_naive")
    fc = grpc.aio.insecure_channel(forecaster.address)
    await ingest_daily(fc, ci_ref("FR"), 60.0, 25.0)
    for pool in ("chat", "rag"):
        await ingest_daily(fc, load_ref(pool), 1.0, 0.5)

    optimizer_port, cache_port = free_port(), free_port()
    router = await start_inprocess(RouterSettings, build_router, http_port=0, watch_plans=True, feeds=False,
                                   optimizer_addr=f"127.0.0.1:{optimizer_port}", health_interval_s=0.2,
                                   scrape_interval_s=0.2, log_level="WARNING")
    optimizer = await start_inprocess(OptimizerSettings, build_optimizer, port=optimizer_port,
                                      forecaster_addr=forecaster.address, profiler_addr="127.0.0.1:9",
                                      cache_manager_addr=f"127.0.0.1:{cache_port}", schedule_plans=False,
                                      cache_solver="keep", mig_solver="keep", log_level="WARNING")
    cache = await start_inprocess(CacheManagerSettings, build_cache_manager, port=cache_port,
                                  optimizer_addr=optimizer.address, instance="cm-1",
                                  lmcache_restart_command=lmcache_server.restart_command(), log_level="WARNING")
    base = random.randrange(20000, 32000, 100)
    partitioner = await start_inprocess(
        GpuPartitionerSettings, build_partitioner, backend="simulated", sim_gpus="A100-40GB,A100-40GB",
        node_name="n1", optimizer_addr=optimizer.address, router_addr=router.address, engine_launcher="emulator",
        engine_port_range=f"{base}-{base + 99}", energy_sample_interval_s=0, log_level="WARNING")
    del partitioner
    emulators = [EngineEmulator(EmulatorConfig(host="127.0.0.1", port=0, time_scale=20.0)) for _ in range(2)]
    for emu in emulators:
        await emu.start()
    opt = optimizer_pb2_grpc.OptimizerServiceStub(grpc.aio.insecure_channel(optimizer.address))
    rtr = router_pb2_grpc.RouterServiceStub(grpc.aio.insecure_channel(router.address))
    cm = cache_manager_pb2_grpc.CacheManagerServiceStub(grpc.aio.insecure_channel(cache.address))
    try:
        for emu, pool in zip(emulators, ("chat", "rag")):
            await rtr.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
                id=f"static-{pool}", url=emu.url, pool=pool, model="m", kind=common_pb2.ENGINE_KIND_SIMULATED)))
        await cm.RegisterCacheServer(cache_manager_pb2.RegisterCacheServerRequest(server=cache_manager_pb2.CacheServer(
            id="lm-chat", pool="chat", url=lmcache_server.http_url)))

        async def two_gpus() -> bool:
            fleet = (await opt.GetFleet(optimizer_pb2.GetFleetRequest())).fleet
            return len([g for g in fleet.gpus if g.reported_by == "gpu-partitioner/n1"]) == 2

        await _until(two_gpus, 60, "the partitioner's GPU report")
        gpus = sorted(g.uuid for g in (await opt.GetFleet(optimizer_pb2.GetFleetRequest())).fleet.gpus)

        def fleet(chat_layout: list[tuple[str, int, int]]) -> common_pb2.FleetInventory:
            inv = common_pb2.FleetInventory()
            for pool in ("chat", "rag"):
                p = inv.pools.add(name=pool, model="m", region="FR", slo=SLO,
                                  max_cache_dram_bytes=128 * MIB if pool == "chat" else 0)
                p.variants.add(name="8b", model="m", quality_fraction=1.0, simulator_model="llama3-8b")
                p.engines.add(id=f"static-{pool}", url=emulators[0 if pool == "chat" else 1].url, pool=pool,
                              hardware="A100-80GB")
            chat = inv.gpus.add(uuid=gpus[0], node="n1", pool="chat", model=common_pb2.GPU_MODEL_A100_40GB)
            for profile, start, size in chat_layout:
                chat.instances.add(profile=profile, placement_start=start, placement_size=size)
            rag = inv.gpus.add(uuid=gpus[1], node="n1", pool="rag", model=common_pb2.GPU_MODEL_A100_40GB)
            rag.instances.add(profile="4g.20gb", placement_start=0, placement_size=4)
            return inv

        async def status_for(version: int) -> optimizer_pb2.GetPlanStatusResponse:
            return await opt.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest(version=version))

        async def all_applied(version: int) -> bool:
            s = await status_for(version)
            return {r.component for r in s.reports if r.state == optimizer_pb2.ENFORCEMENT_STATE_APPLIED} == {
                "router", "cache-manager", "gpu-partitioner"}

        # Plan 1: chat's GPU in two 3g.20gb halves, rag's in one 4g.20gb; chat's LMCache limited to 128 MiB.
        await opt.SetFleet(optimizer_pb2.SetFleetRequest(fleet=fleet([("3g.20gb", 0, 4), ("3g.20gb", 4, 4)])))
        plan1 = (await opt.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2))).plan
        (target,) = plan1.intervals[0].cache_targets
        assert (target.pool, target.dram_bytes) == ("chat", 128 * MIB)
        await _until(lambda: all_applied(plan1.version), 240, "every component APPLIED on plan 1")
        status = await status_for(plan1.version)
        assert status.fleet_matches_plan, [(r.component, r.state, r.detail) for r in status.reports]
        assert lmcache_server.status()["storage_manager"]["l1_manager"]["memory_total_bytes"] == 128 * MIB
        assert router.server.registrations[0].servicer.core.plans.version == plan1.version
        engines = (await rtr.ListEngines(router_pb2.ListEnginesRequest())).engines
        on_mig = {s.engine.id: s.engine for s in engines if s.engine.mig_uuid}
        assert sorted(e.pool for e in on_mig.values()) == ["chat", "chat", "rag"]
        weights = {w.engine_id for w in plan1.intervals[0].routing_weights}
        assert {"static-chat", "static-rag"} <= weights

        # Plan 2: chat's GPU becomes one 7g.40gb: its two engines are drained and deregistered, a new one started.
        old_chat = {eid for eid, e in on_mig.items() if e.pool == "chat"}
        await opt.SetFleet(optimizer_pb2.SetFleetRequest(fleet=fleet([("7g.40gb", 0, 8)])))
        plan2 = (await opt.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2))).plan
        await _until(lambda: all_applied(plan2.version), 240, "every component APPLIED on plan 2")
        engines = (await rtr.ListEngines(router_pb2.ListEnginesRequest())).engines
        chat_now = {s.engine.id for s in engines if s.engine.mig_uuid and s.engine.pool == "chat"}
        assert len(chat_now) == 1 and not chat_now & old_chat
        assert (await status_for(plan2.version)).fleet_matches_plan
    finally:
        for emu in emulators:
            await emu.stop()
