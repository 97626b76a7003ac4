"""Faults 1 and 5 of issue 36: the optimizer killed with SIGKILL mid-computation while its watchers stream, and
plans racing, a watcher coming back on an old version.

Real processes: the optimizer runs in its own process on its SQLite database; its watchers are a router (with two
emulated engines) and a cache-manager, both following WatchPlans, in this process with the forecaster.

Fault 1: a ComputePlan is in flight and both enforcers are streaming when the optimizer is killed. While it is
down the router keeps serving on the plan in force and neither enforcer drops it. Restarted on its database,
the optimizer has exactly one active plan, the versions are 1..n with no gap, the plan in force is either the one
before the kill or the one computed when the kill came (whole or not at all), and both enforcers reconnect and
report APPLIED on it without an operator; the next plan is n + 1 and reaches both.

Fault 5: a cache-manager stopped while plans go on comes back on the old plan it persisted and is put on the
newest; a computed plan and a rollback racing from two clients, twenty times, leave every enforcer on the plan
the optimizer says is in force.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import grpc
import pytest
from greenserve.cache_manager.service import build as build_cache_manager
from greenserve.cache_manager.settings import CacheManagerSettings
from greenserve.common.plan_follow import plan_file_store
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc, router_pb2

from tests.conftest import free_port
from tests.optimizer.conftest import ci_ref, ingest_daily, load_ref
from tests.process import start_service_process

from .conftest import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

APPLIED = optimizer_pb2.ENFORCEMENT_STATE_APPLIED
SLO = common_pb2.Slo(ttft_s=2.0, tpot_s=0.2, attainment_fraction=0.9)


def start_optimizer(data_dir: Path, port: int, forecaster: str):
    return start_service_process(
        "greenserve.optimizer", "greenserve.v1.OptimizerService", data_dir, port, env={}, log_name="optimizer.log",
        extra_args=[f"--forecaster-addr={forecaster}", "--profiler-addr=127.0.0.1:9",
                    "--cache-manager-addr=127.0.0.1:9", "--no-schedule-plans", "--cache-solver=keep",
                    "--mig-solver=keep", "--modes-solver=keep", "--log-level=WARNING"])


class Loop:
    """The forecaster, a router and a cache-manager in this process; the optimizer in its own."""

    def __init__(self, tmp_path: Path, start_inprocess, emulators, router) -> None:
        self.tmp_path, self.start_inprocess, self.emulators, self.router = tmp_path, start_inprocess, emulators, router
        self.port = free_port()
        self.proc = None
        self.cache_dir = tmp_path / "cache_manager"

    async def start(self) -> None:
        from tests.optimizer.conftest import ForecasterSettings, build_forecaster

        forecaster = await self.start_inprocess(ForecasterSettings, build_forecaster, forecast_model="seasonal_naive")
        self.forecaster = forecaster.address
        fc = grpc.aio.insecure_channel(forecaster.address)
        await ingest_daily(fc, ci_ref("FR"), 60.0, 25.0)
        await ingest_daily(fc, load_ref("chat"), 1.0, 0.5)
        await self.start_optimizer()
        engines = await self.emulators(2)
        self.handle = await self.router(engines=[e.url for e in engines], watch_plans=True,
                                        optimizer_addr=f"127.0.0.1:{self.port}", default_pool="chat")
        await self.start_cache_manager()
        listed = (await self.handle.stub.ListEngines(router_pb2.ListEnginesRequest())).engines
        pool = common_pb2.Pool(name="chat", model="meta-llama/Meta-Llama-3-8B-Instruct", region="FR", slo=SLO)
        for status in listed:
            pool.engines.add(id=status.engine.id, url=status.engine.url, hardware="A100-80GB")
        await self.stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(pools=[pool])))

    async def start_optimizer(self) -> None:
        self.proc = await asyncio.to_thread(start_optimizer, self.tmp_path / "optimizer", self.port, self.forecaster)
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = optimizer_pb2_grpc.OptimizerServiceStub(self.channel)

    async def start_cache_manager(self) -> None:
        self.cache = await self.start_inprocess(
            CacheManagerSettings, build_cache_manager, data_dir=self.cache_dir, instance="cm1",
            optimizer_addr=f"127.0.0.1:{self.port}", log_level="WARNING")

    def cache_manager_version(self) -> int:
        path = self.cache_dir / "cache_manager_plan.pb"
        if not path.exists():
            return 0
        plan = common_pb2.Plan()
        plan.ParseFromString(path.read_bytes())
        return plan.version

    async def active(self) -> int:
        return (await self.stub.GetPlan(optimizer_pb2.GetPlanRequest(), timeout=10)).plan.version

    async def everyone_on(self, version: int, timeout_s: float = 30) -> None:
        """Both enforcers hold ``version`` and reported APPLIED on it."""
        await until(lambda: self.handle.core.plans.version == version, timeout_s, f"the router on v{version}")
        await until(lambda: self.cache_manager_version() == version, timeout_s, f"the cache-manager on v{version}")

        async def applied() -> bool:
            status = await self.stub.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest(version=version), timeout=10)
            done = {r.component if r.component == "router" else (r.component, r.instance)
                    for r in status.reports if r.state == APPLIED}
            return {"router", ("cache-manager", "cm1")} <= done  # the router reports as its host

        await until(applied, timeout_s, f"both enforcers' APPLIED reports of v{version}", every_s=0.2)

    async def serve(self, version: int, n: int = 3) -> None:
        request = router_pb2.RequestDescriptor(pool="chat", completion=router_pb2.CompletionInput(prompt="hello"))
        for _ in range(n):
            route = await self.handle.stub.Route(router_pb2.RouteRequest(request=request), timeout=10)
            assert route.plan_version == version
            chunks = [c async for c in self.handle.stub.Generate(router_pb2.GenerateRequest(
                request=request, sampling=router_pb2.SamplingParams(max_tokens=4)), timeout=20)]
            assert chunks and chunks[-1].finish_reason

    async def plans(self) -> list[common_pb2.Plan]:
        return list((await self.stub.ListPlans(optimizer_pb2.ListPlansRequest(page_size=1000), timeout=10)).plans)

    async def close(self) -> None:
        await self.channel.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            await asyncio.to_thread(self.proc.wait, 30)


@pytest.fixture
async def loop(tmp_path, start_inprocess, emulators, router):
    started = Loop(tmp_path, start_inprocess, emulators, router)
    try:
        await started.start()
        yield started
    finally:
        await started.close()


async def test_optimizer_sigkill_mid_computation_while_watchers_stream(loop) -> None:
    for _ in range(2):
        await loop.stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=48))
    before = await loop.active()
    await loop.everyone_on(before)

    async def applied_at(version: int) -> dict[str, int]:
        status = await loop.stub.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest(version=version), timeout=10)
        return {r.component: r.reported_at.ToNanoseconds() for r in status.reports}

    reported = await applied_at(before)

    # a computation in flight and both enforcers streaming: SIGKILL
    computing = asyncio.ensure_future(loop.stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=168)))
    await asyncio.sleep(0.05)
    loop.proc.send_signal(signal.SIGKILL)
    await asyncio.to_thread(loop.proc.wait, 10)
    try:
        computed = (await computing).plan.version
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
        computed = None
    # down: the plan in force stays in force, the fleet serves on it
    held = loop.handle.core.plans.version
    assert held in (before, computed) and loop.cache_manager_version() in (before, computed)
    await loop.serve(held)
    await asyncio.sleep(1.0)  # the watchers retry meanwhile
    assert loop.handle.core.plans.version == held
    await loop.serve(held)

    # restarted on its database: one active plan, no gap, the enforcers back on it without an operator
    await loop.start_optimizer()
    plans = await loop.plans()
    versions = sorted(p.version for p in plans)
    assert versions == list(range(1, len(versions) + 1))
    actives = [p.version for p in plans if p.state == common_pb2.PLAN_STATE_ACTIVE]
    assert len(actives) == 1 and actives[0] == await loop.active()
    assert actives[0] == max(versions)  # the last stored plan: before's, or the one computed at the kill
    assert actives[0] == before or (computed is None or actives[0] == computed)
    await loop.everyone_on(actives[0])
    await loop.serve(actives[0])
    if actives[0] == before:  # the plan they held: not applied a second time on reconnecting
        assert await applied_at(before) == reported
    nxt = (await loop.stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=6))).plan
    assert nxt.version == max(versions) + 1  # nothing skipped, nothing duplicated
    await loop.everyone_on(nxt.version)


async def test_a_watcher_back_on_an_old_plan_and_racing_plans_end_on_the_plan_in_force(loop) -> None:
    first = (await loop.stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=6))).plan
    await loop.everyone_on(first.version)
    # the cache-manager stops (its plan file keeps v1); two plans are made meanwhile
    await loop.cache.server.stop(0)
    for _ in range(2):
        await loop.stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=6))
    assert loop.cache_manager_version() == first.version
    newest = await loop.active()
    assert newest == first.version + 2
    # back on the old version it persisted: it asks for what is newer than v1 and is put on the newest
    _, load = plan_file_store(loop.cache_dir / "cache_manager_plan.pb")
    assert (await load()).version == first.version
    await loop.start_cache_manager()
    await loop.everyone_on(newest)

    # a computed plan and a rollback to v1 racing from two clients, twenty times
    other = optimizer_pb2_grpc.OptimizerServiceStub(grpc.aio.insecure_channel(f"127.0.0.1:{loop.port}"))
    for _ in range(20):
        await asyncio.gather(
            loop.stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2)),
            other.ActivatePlan(optimizer_pb2.ActivatePlanRequest(version=first.version)))
        in_force = await loop.active()
        await until(lambda in_force=in_force: loop.handle.core.plans.version == in_force, 20, f"the router on v{in_force}")
        await until(lambda in_force=in_force: loop.cache_manager_version() == in_force, 20, f"the cache-manager on v{in_force}")
    plans = await loop.plans()
    assert [p.version for p in plans if p.state == common_pb2.PLAN_STATE_ACTIVE] == [await loop.active()]
    await loop.everyone_on(await loop.active())
    await loop.serve(await loop.active())
