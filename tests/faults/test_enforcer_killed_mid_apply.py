"""Fault 2 of issue 36: an enforcer killed mid-apply finishes or rolls back from its journal on restart.

Real processes: the gpu-partitioner (simulated MIG backend, its GPU state and apply journal in its SQLite
database) in its own process; a router in this process with two emulated engines, one of them on the GPU's 3g
instance. A layout that destroys that instance is applied (ApplyLayout) while the engine serves a long request:
the apply is journaled ``running`` and waits in its drain when the partitioner is killed with SIGKILL.

What must hold: while it is down the fleet serves on the other engine; restarted on its database, the partitioner
finds the run the kill cut (the journal), rolls it back (nothing was destroyed: the previous layout, same
instance UUIDs), leaves no journal row pending, undrains the engine it had drained (it serves again), and says
so: GetApply answers ROLLED_BACK, "interrupted (service restart); rolled back". A new apply then goes through.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sqlite3
import subprocess
from pathlib import Path

import grpc
import pytest
from greenserve.router.front.service import RouterSettings
from greenserve.router.front.service import build as build_router
from greenserve.simulator.emulator import EmulatorConfig, EngineEmulator
from greenserve.v1 import common_pb2, gpu_partitioner_pb2, gpu_partitioner_pb2_grpc, router_pb2, router_pb2_grpc

from tests.conftest import free_port
from tests.process import start_service_process, stop_process

from .conftest import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def start_partitioner(data_dir: Path, port: int, router: str) -> subprocess.Popen:
    base = random.randrange(20000, 32000, 100)
    return start_service_process(
        "greenserve.gpu_partitioner", "greenserve.v1.GpuPartitionerService", data_dir, port, env={},
        log_name="gpu_partitioner.log",
        extra_args=["--backend=simulated", "--sim-gpus=A100-40GB", "--node-name=n1", "--no-follow-plans",
                    f"--router-addr={router}", f"--engine-port-range={base}-{base + 99}",
                    "--energy-sample-interval-s=0", "--log-level=WARNING"])


def runs(data_dir: Path) -> list[tuple[str, str, str, str]]:
    """(apply id, state, phase, error) of every journaled apply run."""
    with sqlite3.connect(data_dir / "gpu_partitioner.db") as db:
        return list(db.execute("SELECT apply_id, state, phase, error FROM apply_runs ORDER BY started_at"))


def pending_steps(data_dir: Path) -> int:
    with sqlite3.connect(data_dir / "gpu_partitioner.db") as db:
        return db.execute("SELECT count(*) FROM apply_journal WHERE state = 'pending'").fetchone()[0]


def layout(placements: list[tuple[str, int, int]], gpu: str) -> common_pb2.MigLayout:
    return common_pb2.MigLayout(gpu_uuid=gpu, placements=[
        common_pb2.MigPlacement(profile=p, start=s, size=n) for p, s, n in placements])


async def test_partitioner_sigkill_mid_apply_rolls_back_from_its_journal(start_inprocess, tmp_path) -> None:
    router = await start_inprocess(RouterSettings, build_router, http_port=0, watch_plans=False, feeds=False,
                                   health_interval_s=0.2, scrape_interval_s=0.2, default_pool="chat",
                                   log_level="WARNING")
    core = router.server.registrations[0].servicer.core
    rtr = router_pb2_grpc.RouterServiceStub(grpc.aio.insecure_channel(router.address))
    emulators = [EngineEmulator(EmulatorConfig(host="127.0.0.1", port=0, time_scale=1.0, model="m")) for _ in range(2)]
    for emu in emulators:
        await emu.start()
    data_dir, port = tmp_path / "gp", free_port()
    proc = await asyncio.to_thread(start_partitioner, data_dir, port, router.address)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    gp = gpu_partitioner_pb2_grpc.GpuPartitionerServiceStub(channel)
    long_call = None
    try:
        gpu = (await gp.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())).gpus[0].uuid
        start = [("3g.20gb", 4, 4), ("4g.20gb", 0, 4)]
        done = await gp.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(layout=layout(start, gpu)))
        assert done.record.state == gpu_partitioner_pb2.APPLY_STATE_SUCCEEDED, done.record.error
        three = next(i.uuid for i in done.record.instances if i.profile == "3g.20gb")
        await rtr.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
            id="on-mig", url=emulators[0].url, pool="chat", model="m", kind=common_pb2.ENGINE_KIND_SIMULATED,
            gpu_uuid=gpu, mig_uuid=three)))
        request = router_pb2.RequestDescriptor(pool="chat", completion=router_pb2.CompletionInput(prompt="hello"))
        long_call = asyncio.ensure_future(_generate(rtr, request, max_tokens=4000))  # a minute or more at time scale 1
        await until(lambda: core.registry.get("on-mig").in_flight > 0, 20, "the long request on the MIG engine")
        await rtr.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
            id="kept", url=emulators[1].url, pool="chat", model="m", kind=common_pb2.ENGINE_KIND_SIMULATED)))

        # a layout destroying the 3g instance: journaled, then waiting in its drain
        applying = asyncio.ensure_future(gp.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(
            layout=layout([("7g.40gb", 0, 8)], gpu), drain_timeout_s=120)))
        await until(lambda: any(state == "running" for _, state, _, _ in runs(data_dir)), 30, "the journaled run")
        await until(lambda: core.registry.get("on-mig").draining, 10, "the drain of the MIG engine")
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait, 10)
        with pytest.raises(grpc.aio.AioRpcError):
            await applying
        (cut,) = [r for r in runs(data_dir) if r[1] == "running"]
        assert cut[2] == "drain" and pending_steps(data_dir) > 0

        # down: the fleet serves on the other engine
        for _ in range(3):
            route = await rtr.Route(router_pb2.RouteRequest(request=request), timeout=10)
            assert route.engine.id == "kept"
            assert await _generate(rtr, request, max_tokens=4)

        # restarted on its database: the cut run rolled back, the journal clean, the engine undrained
        proc = await asyncio.to_thread(start_partitioner, data_dir, port, router.address)
        record = (await gp.GetApply(gpu_partitioner_pb2.GetApplyRequest(apply_id=cut[0]))).record
        assert record.state == gpu_partitioner_pb2.APPLY_STATE_ROLLED_BACK
        assert "interrupted (service restart); rolled back" in record.error
        assert not [r for r in runs(data_dir) if r[1] == "running"] and pending_steps(data_dir) == 0
        inventory = (await gp.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())).gpus[0]
        assert sorted((i.profile, i.placement_start) for i in inventory.instances) == [("3g.20gb", 4), ("4g.20gb", 0)]
        assert three in {i.uuid for i in inventory.instances}  # never destroyed: the same instance
        await until(lambda: not core.registry.get("on-mig").draining, 10, "the MIG engine undrained")

        # and a new apply goes through (the long request is cancelled first: the drain would wait for it)
        long_call.cancel()
        await until(lambda: core.registry.get("on-mig").in_flight == 0, 20, "the long request's end")
        after = await gp.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(layout=layout([("7g.40gb", 0, 8)], gpu),
                                                                           drain_timeout_s=30))
        assert after.record.state == gpu_partitioner_pb2.APPLY_STATE_SUCCEEDED, after.record.error
    finally:
        if long_call is not None:
            long_call.cancel()
        await stop_process(proc)
        await channel.close()
        for emu in emulators:
            await emu.stop()


async def _generate(stub: router_pb2_grpc.RouterServiceStub, request: router_pb2.RequestDescriptor,
                    max_tokens: int) -> bool:
    chunks = [c async for c in stub.Generate(router_pb2.GenerateRequest(
        request=request, sampling=router_pb2.SamplingParams(max_tokens=max_tokens)), timeout=600)]
    return bool(chunks) and bool(chunks[-1].finish_reason)
