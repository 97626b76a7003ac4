"""Degraded mode of the loop: with the optimizer killed (SIGKILL), the router keeps routing on the plan in force,
and a restarted optimizer puts the watchers back on the same plan."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
from greenserve.common.client import ChannelConfig, create_channel, wait_until_serving
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc, router_pb2

from tests.conftest import free_port
from tests.optimizer.conftest import ci_ref, ingest_daily, load_ref


def _start_optimizer(data_dir: Path, port: int, forecaster: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "greenserve.optimizer", "--host=127.0.0.1", f"--port={port}", f"--data-dir={data_dir}",
         f"--forecaster-addr={forecaster}", "--profiler-addr=127.0.0.1:9", "--cache-manager-addr=127.0.0.1:9",
         "--no-schedule-plans", "--log-level=WARNING"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


async def test_router_keeps_routing_after_optimizer_sigkill(tmp_path, forecaster, emulators, router) -> None:
    fc = grpc.aio.insecure_channel(forecaster.address)
    await ingest_daily(fc, ci_ref("FR"), 50.0, 20.0)
    await ingest_daily(fc, load_ref("chat"), 2.0, 1.0)
    engines = await emulators(2)
    port = free_port()
    proc = _start_optimizer(tmp_path / "optimizer", port, forecaster.address)
    channel = create_channel(ChannelConfig(address=f"127.0.0.1:{port}", default_timeout_s=30.0))
    try:
        await wait_until_serving(channel, "greenserve.v1.OptimizerService", 60)
        stub = optimizer_pb2_grpc.OptimizerServiceStub(channel)
        handle = await router(engines=[e.url for e in engines], watch_plans=True, optimizer_addr=f"127.0.0.1:{port}",
                              default_pool="chat")
        listed = (await handle.stub.ListEngines(router_pb2.ListEnginesRequest())).engines
        pool = common_pb2.Pool(name="chat", model="m", region="FR",
                               slo=common_pb2.Slo(ttft_s=1.0, tpot_s=0.1, attainment_fraction=0.9))
        for status in listed:
            pool.engines.add(id=status.engine.id, url=status.engine.url, hardware="A100-80GB")
        await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(pools=[pool])))
        plan = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=3))).plan
        for _ in range(200):
            if handle.core.plans.version == plan.version:
                break
            await asyncio.sleep(0.05)
        assert handle.core.plans.version == plan.version
        # The router's report reached the optimizer.
        for _ in range(100):
            status = await stub.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest())
            if any(r.component == "router" and r.state == optimizer_pb2.ENFORCEMENT_STATE_APPLIED for r in status.reports):
                break
            await asyncio.sleep(0.05)
        assert any(r.component == "router" for r in status.reports)

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        request = router_pb2.RequestDescriptor(pool="chat", completion=router_pb2.CompletionInput(prompt="hello"))
        for _ in range(3):
            route = await handle.stub.Route(router_pb2.RouteRequest(request=request))
            assert route.plan_version == plan.version
            chunks = [c async for c in handle.stub.Generate(router_pb2.GenerateRequest(
                request=request, sampling=router_pb2.SamplingParams(max_tokens=4)))]
            assert chunks[-1].finish_reason
        assert handle.core.plans.version == plan.version

        # Restarted on the same database: the same plan is in force and the router stays on it.
        proc = _start_optimizer(tmp_path / "optimizer", port, forecaster.address)
        await wait_until_serving(channel, "greenserve.v1.OptimizerService", 60)
        assert (await stub.GetPlan(optimizer_pb2.GetPlanRequest())).plan.version == plan.version
        await asyncio.sleep(0.5)
        assert handle.core.plans.version == plan.version
    finally:
        await channel.close()
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
