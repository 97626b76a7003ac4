"""16 clients write to the optimizer at once (GPU reports, fleet, enforcement reports, plan computations and
activations), then a SIGKILL while they write, and a restart: no call failed before the kill, and the restarted
optimizer holds exactly what was acknowledged (every acknowledged plan and report; one active plan)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc

from tests.conftest import free_port
from tests.optimizer.conftest import ci_ref, engine, ingest_daily, load_ref, pool
from tests.process import sigkill_while_writing, start_service_process

WRITERS = 16


def _start(tmp_path, port: int, forecaster: str):
    return start_service_process(
        "greenserve.optimizer", "greenserve.v1.OptimizerService", tmp_path / "opt", port, env={},
        log_name="optimizer.log", extra_args=[f"--forecaster-addr={forecaster}", "--profiler-addr=127.0.0.1:9",
                                              "--cache-manager-addr=127.0.0.1:9", "--no-schedule-plans",
                                              "--cache-solver=keep", "--mig-solver=keep", "--log-level=WARNING"])


@pytest.mark.slow
async def test_sixteen_writers_sigkill_restart_keeps_exactly_the_acknowledged(tmp_path, forecaster) -> None:
    fc = grpc.aio.insecure_channel(forecaster.address)
    await ingest_daily(fc, ci_ref("FR"), 50.0, 20.0)
    await ingest_daily(fc, load_ref("chat"), 2.0, 1.0)
    port = free_port()
    proc = await asyncio.to_thread(_start, tmp_path, port, forecaster.address)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = optimizer_pb2_grpc.OptimizerServiceStub(channel)
    fleet = common_pb2.FleetInventory(pools=[pool("chat", [engine("e1"), engine("e2")])])
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=fleet))
    plans: set[int] = set()
    reports: set[tuple[int, str]] = set()
    nodes: set[str] = set()
    errors: list[str] = []
    killed = asyncio.Event()

    async def writer(i: int) -> None:
        n = 0
        while not killed.is_set():
            n += 1
            try:
                kind = (i + n) % 4
                if kind == 0:
                    plan = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2), timeout=30)).plan
                    plans.add(plan.version)
                elif kind == 1 and plans:
                    version = max(plans)
                    instance = f"w{i}-{n}"
                    await stub.ReportEnforcement(optimizer_pb2.ReportEnforcementRequest(report=optimizer_pb2.EnforcementReport(
                        component="router", instance=instance, plan_version=version,
                        state=optimizer_pb2.ENFORCEMENT_STATE_APPLIED)), timeout=30)
                    reports.add((version, instance))
                elif kind == 2:
                    node = f"node{i}-{n}"
                    await stub.ReportGpus(optimizer_pb2.ReportGpusRequest(node=node, gpus=[common_pb2.Gpu(
                        uuid=f"GPU-{i}-{n}", model=common_pb2.GPU_MODEL_A100_40GB)]), timeout=30)
                    nodes.add(node)
                elif kind == 3 and plans:
                    await stub.ActivatePlan(optimizer_pb2.ActivatePlanRequest(version=min(plans)), timeout=30)
            except grpc.aio.AioRpcError as exc:
                if not killed.is_set():
                    errors.append(f"{exc.code().name}: {exc.details()}")
                return

    tasks = [asyncio.create_task(writer(i)) for i in range(WRITERS)]
    await sigkill_while_writing(proc, tasks, killed, write_s=4.0)
    assert not errors, errors[:5]
    assert plans and reports and nodes
    proc = await asyncio.to_thread(_start, tmp_path, port, forecaster.address)
    try:
        listed: list[common_pb2.Plan] = []
        token = ""
        while True:
            page = await stub.ListPlans(optimizer_pb2.ListPlansRequest(page_size=1000, page_token=token))
            listed += page.plans
            token = page.next_page_token
            if not token:
                break
        stored = {p.version for p in listed}
        assert plans <= stored, sorted(plans - stored)[:5]
        assert sum(1 for p in listed if p.state == common_pb2.PLAN_STATE_ACTIVE) == 1
        for version in {v for v, _ in reports}:
            status = await stub.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest(version=version))
            have = {r.instance for r in status.reports}
            assert {inst for v, inst in reports if v == version} <= have
        merged = (await stub.GetFleet(optimizer_pb2.GetFleetRequest())).fleet
        assert nodes <= {g.node for g in merged.gpus}
        assert merged.pools[0].name == "chat"
    finally:
        proc.kill()
        proc.wait(10)
        await channel.close()
