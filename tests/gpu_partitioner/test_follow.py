"""The gpu-partitioner in the control loop as a process: GPU reports that wait out an optimizer outage, a plan
from WatchPlans enforced with a real emulated engine registered at a real router, and no engine left behind
after SIGTERM."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from greenserve.gpu_partitioner.follow import GpuReporter
from greenserve.router.front.service import RouterSettings
from greenserve.router.front.service import build as build_router
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc, router_pb2, router_pb2_grpc

from tests.conftest import free_port
from tests.up_process import children_of

POOL = common_pb2.Pool(name="chat", model="meta-llama/Meta-Llama-3-8B-Instruct", variants=[
    common_pb2.ModelVariant(name="1b", model="meta-llama/Llama-3.2-1B-Instruct", simulator_model="llama3.2-1b")])


class InTestOptimizer(optimizer_pb2_grpc.OptimizerServiceServicer):
    """WatchPlans, GetFleet, ReportGpus and ReportEnforcement, recording what the partitioner sends."""

    def __init__(self) -> None:
        self.gpu_reports: list[optimizer_pb2.ReportGpusRequest] = []
        self.enforcement: list[optimizer_pb2.EnforcementReport] = []
        self.plans: asyncio.Queue[common_pb2.Plan] = asyncio.Queue()

    async def ReportGpus(self, request: Any, context: Any) -> optimizer_pb2.ReportGpusResponse:
        self.gpu_reports.append(request)
        if any(g.uuid == "GPU-refused" for g in request.gpus):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "gpus[0].uuid: refused by the test")
        return optimizer_pb2.ReportGpusResponse(fleet=common_pb2.FleetInventory(gpus=request.gpus, pools=[POOL]))

    async def GetFleet(self, request: Any, context: Any) -> optimizer_pb2.GetFleetResponse:
        return optimizer_pb2.GetFleetResponse(fleet=common_pb2.FleetInventory(pools=[POOL]))

    async def ReportEnforcement(self, request: Any, context: Any) -> optimizer_pb2.ReportEnforcementResponse:
        self.enforcement.append(request.report)
        return optimizer_pb2.ReportEnforcementResponse()

    async def WatchPlans(self, request: Any, context: Any) -> Any:
        while True:
            plan = await self.plans.get()
            yield optimizer_pb2.WatchPlansResponse(plan=plan)


async def _serve(servicer: InTestOptimizer, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    optimizer_pb2_grpc.add_OptimizerServiceServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound


async def _until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_gpu_reports_wait_for_the_optimizer_and_follow_changes() -> None:
    port = free_port()
    inventory = [common_pb2.Gpu(uuid="GPU-1", model=common_pb2.GPU_MODEL_A100_40GB, mig_enabled=True)]

    async def read() -> list[common_pb2.Gpu]:
        return [common_pb2.Gpu().__class__.FromString(g.SerializeToString()) for g in inventory]

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    reporter = GpuReporter(channel, "node-a", read, interval_s=0.1, backoff_max_s=0.2)
    reporter.start()
    server = None
    try:
        await asyncio.sleep(0.5)  # the optimizer is down: nothing delivered, the reporter keeps trying
        assert reporter.sent == 0
        optimizer = InTestOptimizer()
        server, _ = await _serve(optimizer, port)
        await _until(lambda: optimizer.gpu_reports, 10, "the first GPU report")
        first = optimizer.gpu_reports[0]
        assert first.node == "node-a" and [g.uuid for g in first.gpus] == ["GPU-1"]
        assert first.gpus[0].reported_by == "gpu-partitioner/node-a" and first.gpus[0].node == "node-a"
        await asyncio.sleep(0.4)
        assert len(optimizer.gpu_reports) == 1, "an unchanged inventory is not reported again"
        inventory[0].instances.add(uuid="MIG-1", profile="7g.40gb", placement_start=0, placement_size=8)
        reporter.poke()
        await _until(lambda: len(optimizer.gpu_reports) == 2, 10, "the changed inventory")
        assert optimizer.gpu_reports[1].gpus[0].instances[0].uuid == "MIG-1"
        # a report the optimizer refuses (INVALID_ARGUMENT) is not retried until the inventory changes again
        inventory[0].uuid = "GPU-refused"
        reporter.poke()
        await _until(lambda: reporter.refused == 1, 10, "the refusal")
        await asyncio.sleep(0.4)
        assert len(optimizer.gpu_reports) == 3 and reporter.sent == 2
    finally:
        await reporter.stop()
        await channel.close()
        if server is not None:
            await server.stop(0)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads child processes from /proc")
async def test_plan_from_watch_is_enforced_and_sigterm_leaves_no_engine(start_inprocess: Any, tmp_path: Path) -> None:
    router = await start_inprocess(RouterSettings, build_router, http_port=0, watch_plans=False, feeds=False,
                                   health_interval_s=0.2, log_level="WARNING")
    optimizer = InTestOptimizer()
    server, opt_port = await _serve(optimizer)
    base = random.randrange(20000, 32000, 100)  # below the ephemeral ports
    proc = subprocess.Popen(
        [sys.executable, "-m", "greenserve.gpu_partitioner", "--host=127.0.0.1", "--port=0",
         f"--data-dir={tmp_path / 'gp'}", "--backend=simulated", "--sim-gpus=A100-40GB", "--node-name=gpu-node-1",
         f"--optimizer-addr=127.0.0.1:{opt_port}", f"--router-addr={router.address}", "--engine-launcher=emulator",
         f"--engine-port-range={base}-{base + 99}", "--energy-sample-interval-s=0", "--no-log-json",
         "--log-level=WARNING"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    channel = grpc.aio.insecure_channel(router.address)
    engines: list[int] = []
    try:
        await _until(lambda: optimizer.gpu_reports or proc.poll() is not None, 60, "the node's GPU report")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        report = optimizer.gpu_reports[0]
        assert report.node == "gpu-node-1" and len(report.gpus) == 1
        gpu = report.gpus[0].uuid
        interval = common_pb2.PlanInterval(mig_layouts=[common_pb2.MigLayout(gpu_uuid=gpu, placements=[
            common_pb2.MigPlacement(profile="3g.20gb", start=4, size=4, pool="chat", model_variant="1b"),
            common_pb2.MigPlacement(profile="4g.20gb", start=0, size=4)])],
            gpu_power=[common_pb2.GpuPowerTarget(pool="chat", power_limit_w=250.0, max_sm_clock_mhz=1000,
                                                 sm_clock_fraction=1000 / 1410)])
        interval.start.FromSeconds(0)
        interval.end.FromSeconds(4_000_000_000)
        await optimizer.plans.put(common_pb2.Plan(version=3, intervals=[interval]))

        def applied() -> bool:
            return any(r.state == optimizer_pb2.ENFORCEMENT_STATE_APPLIED for r in optimizer.enforcement)

        await _until(lambda: applied() or proc.poll() is not None, 60, "APPLIED from the partitioner")
        states = [r.state for r in optimizer.enforcement]
        assert states[0] == optimizer_pb2.ENFORCEMENT_STATE_APPLYING, states
        done = next(r for r in optimizer.enforcement if r.state == optimizer_pb2.ENFORCEMENT_STATE_APPLIED)
        assert (done.component, done.instance, done.plan_version) == ("gpu-partitioner", "gpu-node-1", 3)
        assert "started engine" in done.detail
        # the pool's GPU (found through the layout's placement) gets the interval's power limit and clock lock
        assert f"GPU power: GPU {gpu} (pool chat): power limit 250 W, SM clocks locked 210-990 MHz" in done.detail
        listed = await router_pb2_grpc.RouterServiceStub(channel).ListEngines(router_pb2.ListEnginesRequest())
        assert [(s.engine.pool, s.engine.kind) for s in listed.engines] == [("chat", common_pb2.ENGINE_KIND_SIMULATED)]
        # the new inventory (instances with the engine on one) is reported too
        await _until(lambda: any(len(r.gpus[0].instances) == 2 for r in optimizer.gpu_reports), 30, "the new layout")

        engines = [pid for pid in children_of(proc.pid) if _running(pid)]
        assert len(engines) == 1, engines
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 60) == 0
        assert not [pid for pid in engines if _running(pid)], "an engine outlived the gpu-partitioner"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in engines:  # never leave one behind, even when the test failed
            if _running(pid):
                os.killpg(pid, signal.SIGKILL)
        await channel.close()
        await server.stop(0)



async def test_follow_plans_false_reports_nothing_and_true_reports_the_node(start_inprocess: Any,
                                                                            tmp_path: Path) -> None:
    from greenserve.gpu_partitioner.service import GpuPartitionerSettings, build

    optimizer = InTestOptimizer()
    server, port = await _serve(optimizer)
    common = dict(backend="simulated", sim_gpus="A100-40GB,H100-80GB:nomig", energy_sample_interval_s=0,
                  optimizer_addr=f"127.0.0.1:{port}", router_addr="127.0.0.1:9", gpu_report_interval_s=0.1)
    try:
        await start_inprocess(GpuPartitionerSettings, build, follow_plans=False, node_name="off-node",
                              data_dir=tmp_path / "off", **common)
        await asyncio.sleep(0.5)
        assert optimizer.gpu_reports == [] and optimizer.enforcement == []
        await start_inprocess(GpuPartitionerSettings, build, node_name="on-node", data_dir=tmp_path / "on", **common)
        await _until(lambda: optimizer.gpu_reports, 20, "the node's GPU report")
        (report,) = optimizer.gpu_reports
        assert report.node == "on-node"
        assert [(g.model, g.mig_enabled) for g in report.gpus] == [
            (common_pb2.GPU_MODEL_A100_40GB, True), (common_pb2.GPU_MODEL_H100_80GB, False)]
    finally:
        await server.stop(0)
