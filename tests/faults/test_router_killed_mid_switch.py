"""Fault 2 of issue 36 (the router's part): the router killed with SIGKILL while it switches routing weights to a
new plan.

Real processes: the optimizer and the router each in their own process (the router on its SQLite database, once
as one process, so the kill hits the process that routes, and once as a supervisor with two workers, whose workers
must exit when it is killed); two emulated engines and the forecaster in this process.
Two fleets that differ in hardware make the optimizer's consecutive plans weight the engines differently, so a
decision taken on a mix of two versions' weights shows.

The switch is cut where it is half done: another writer holds the router's database, so the new plan is in force in
the router's memory while storing it waits; the router is killed there. A second kill comes right after a switch
has completed (stored, reported).

What must hold, each time:
* serving: a client that retries a failed call (at most every 0.2 s) gets every request answered across the kill
  and the restart, within the SLO's time to first token once the router is up;
* never a mix: every routing decision names one plan version and the weight its engine has in that version's
  interval in force (the router's ``plan_weight=w/max vN`` explanation, checked against the optimizer's plans);
* the truth in ``plan status``: no APPLIED from the router for the plan whose switch was cut until the restarted
  router has put it in force; after each restart the router reports APPLIED again on the plan in force (the report
  the killed process may not have sent is not lost);
* convergence without an operator: the restarted router routes on the optimizer's active plan.

A plan the router cannot store (its database locked past the busy timeout) is routed on and reported APPLIED with
the reason it is not stored; a restart before it is stored routes on the plan stored before, then converges.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from greenserve.common.plan_follow import interval_at
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc, router_pb2, router_pb2_grpc

from tests.conftest import free_port
from tests.faults.test_optimizer_killed import start_optimizer
from tests.faults.test_sqlite_locked import WriteLock
from tests.optimizer.conftest import ci_ref, ingest_daily, load_ref
from tests.process import start_service_process

from .conftest import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

APPLIED = optimizer_pb2.ENFORCEMENT_STATE_APPLIED
SLO = common_pb2.Slo(ttft_s=2.0, tpot_s=0.2, attainment_fraction=0.9)
MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"
EXPLAINED = re.compile(r"^(\S+): .*plan_weight=([0-9.e+-]+)/[0-9.e+-]+ v(\d+)")
RETRY_S = 0.2
KILL_WINDOW_S = 5.0  # how long after a kill a stream may still be cut by the killed process


def start_router(data_dir: Path, port: int, engines: list[str], optimizer_port: int,
                 workers: int) -> subprocess.Popen:
    env = {"GREENSERVE_WORKERS": str(workers), "GREENSERVE_HTTP_PORT": "-1", "GREENSERVE_FEEDS": "false",
           "GREENSERVE_LOG_LEVEL": "WARNING", "GREENSERVE_SCRAPE_INTERVAL_S": "0.2",
           "GREENSERVE_HEALTH_INTERVAL_S": "0.5"}
    return start_service_process(
        "greenserve.router", "greenserve.v1.RouterService", data_dir, port, env=env, log_name="router.log",
        extra_args=[f"--db-url=sqlite:///{data_dir / 'router.db'}", f"--engines={','.join(engines)}",
                    "--default-pool=chat", f"--optimizer-addr=127.0.0.1:{optimizer_port}"])


class Fleet:
    """The optimizer and the router in their own processes, the engines and the forecaster here."""

    def __init__(self, tmp_path: Path, workers: int) -> None:
        self.tmp_path = tmp_path
        self.workers = workers  # 1: the process that routes; more: a supervisor and its worker processes
        self.router_dir = tmp_path / "router"
        self.port, self.router_port = free_port(), free_port()
        self.optimizer: subprocess.Popen | None = None
        self.router: subprocess.Popen | None = None
        self.plans: dict[int, common_pb2.Plan] = {}
        self.decisions: list[tuple[int, str, float]] = []  # (plan version, engine, weight) of each decision
        self.answered = 0
        self.slowest_ttft_s = 0.0
        self.killed_at: float | None = None  # time.monotonic() when kill_router last sent SIGKILL
        self.timeline: list[tuple[float, str]] = []  # (time.monotonic(), event): kills, restarts, failed calls

    async def start(self, start_inprocess, emulators) -> None:
        from tests.optimizer.conftest import ForecasterSettings, build_forecaster

        forecaster = await start_inprocess(ForecasterSettings, build_forecaster, forecast_model="seasonal_naive")
        async with grpc.aio.insecure_channel(forecaster.address) as fc:
            await ingest_daily(fc, ci_ref("FR"), 60.0, 25.0)
            await ingest_daily(fc, load_ref("chat"), 1.0, 0.5)
        self.optimizer = await asyncio.to_thread(start_optimizer, self.tmp_path / "optimizer", self.port,
                                                 forecaster.address)
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = optimizer_pb2_grpc.OptimizerServiceStub(self.channel)
        self.engines = [e.url for e in await emulators(2)]
        await self.start_router()
        self.router_channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.router_port}")
        self.route_stub = router_pb2_grpc.RouterServiceStub(self.router_channel)
        listed = (await self.route_stub.ListEngines(router_pb2.ListEnginesRequest(), timeout=10)).engines
        self.engine_ids = sorted(s.engine.id for s in listed)
        assert len(self.engine_ids) == 2

    async def start_router(self) -> float:
        """Starts the router on its database; returns when it was started (time.time()): a report made since
        then comes from this process."""
        started_s = time.time()
        self.timeline.append((time.monotonic(), "router starting"))
        self.router = await asyncio.to_thread(start_router, self.router_dir, self.router_port, self.engines, self.port,
                                         self.workers)
        self.timeline.append((time.monotonic(), f"router {self.router.pid} serving"))
        return started_s

    async def kill_router(self) -> list[int]:
        """SIGKILL to the router (the supervisor when it has workers); returns its workers' pids (they get SIGTERM
        from the kernel: PR_SET_PDEATHSIG)."""
        assert self.router is not None
        workers = children(self.router.pid)
        assert len(workers) == (0 if self.workers == 1 else self.workers), workers
        # the window for a stream cut by the killed process opens as the signal goes: a call made in that moment
        # may reach a worker that is already stopping (it answers CANCELLED) and fail before the kill returns
        self.killed_at = time.monotonic()
        self.timeline.append((self.killed_at, f"SIGKILL to {self.router.pid} (workers {workers})"))
        self.router.send_signal(signal.SIGKILL)
        await asyncio.to_thread(self.router.wait, 10)
        self.timeline.append((time.monotonic(), f"{self.router.pid} reaped"))
        return workers

    async def workers_gone(self, workers: list[int], within_s: float) -> None:
        await until(lambda: not any(alive(pid) for pid in workers), within_s, f"the router's workers {workers} gone")
        if workers:
            print(f"workers gone {time.monotonic() - self.killed_at:.2f} s after the supervisor's SIGKILL")

    async def plan_on(self, hardware: tuple[str, str]) -> common_pb2.Plan:
        """A plan computed on the two engines with these GPUs (it becomes the active one)."""
        pool = common_pb2.Pool(name="chat", model=MODEL, region="FR", slo=SLO)
        for engine_id, hw, url in zip(self.engine_ids, hardware, self.engines, strict=True):
            pool.engines.add(id=engine_id, url=url, hardware=hw)
        await self.stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(pools=[pool])))
        plan = (await self.stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=6), timeout=60)).plan
        self.plans[plan.version] = plan
        return plan

    def weights(self, version: int) -> dict[str, float]:
        """The weights plan ``version`` gives the pool's engines now."""
        _, interval = interval_at(self.plans[version], time.time())
        assert interval is not None
        return {w.engine_id: w.weight for w in interval.routing_weights if w.pool == "chat"}

    async def route(self) -> tuple[int, str]:
        """One routing decision: (plan version, engine), recorded with the weight it used."""
        request = router_pb2.RequestDescriptor(pool="chat", completion=router_pb2.CompletionInput(prompt="hello"))
        route = await self.route_stub.Route(router_pb2.RouteRequest(request=request), timeout=10, wait_for_ready=True)
        match = EXPLAINED.match(route.reason)
        if route.plan_version:
            assert match, route.reason
            engine, weight, version = match.group(1), float(match.group(2)), int(match.group(3))
            assert version == route.plan_version and engine == route.engine.id, route.reason
            self.decisions.append((version, engine, weight))
        return route.plan_version, route.engine.id

    async def client(self, stop: asyncio.Event) -> None:
        """Generates until ``stop``, retrying a failed call every RETRY_S; counts the answers."""
        request = router_pb2.RequestDescriptor(pool="chat", completion=router_pb2.CompletionInput(prompt="hello"))
        while not stop.is_set():
            started = time.monotonic()
            try:
                first = None
                async for chunk in self.route_stub.Generate(router_pb2.GenerateRequest(
                        request=request, sampling=router_pb2.SamplingParams(max_tokens=4)), timeout=20):
                    first = first or time.monotonic() - started
                    if chunk.finish_reason:
                        self.answered += 1
                        self.slowest_ttft_s = max(self.slowest_ttft_s, first)
            except grpc.aio.AioRpcError as exc:
                self.timeline.append((time.monotonic(), f"call started at {started:.3f}: {exc.code().name} "
                                                        f"{exc.details()!r}"))
                retryable = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                # a worker stopping (SIGTERM from the kernel once its supervisor died) may reset a stream it
                # accepted as it went: CANCELLED, but only from the process just killed (a call made before the kill,
                # or in the moment after it, before the stopping workers stopped taking calls)
                if self.killed_at is not None and (started < self.killed_at
                                                   or time.monotonic() - self.killed_at < KILL_WINDOW_S):
                    retryable += (grpc.StatusCode.CANCELLED,)
                assert exc.code() in retryable, self.explain(exc)
                await asyncio.sleep(RETRY_S)

    def explain(self, exc: grpc.aio.AioRpcError) -> str:
        """The failed call with the timeline of kills, restarts and failed calls, and the router's log tail."""
        lines = [f"{at:.3f} {event}" for at, event in self.timeline]
        log = self.router_dir / "router.log"
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no router log)"
        return f"{exc.code().name} {exc.details()!r}\n" + "\n".join(lines) + "\nrouter.log:\n" + tail

    async def router_reports(self, version: int) -> list[optimizer_pb2.EnforcementReport]:
        status = await self.stub.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest(version=version), timeout=10)
        return [r for r in status.reports if r.component == "router"]

    async def applied_since(self, version: int, since_s: float) -> bool:
        return any(r.state == APPLIED and r.reported_at.ToNanoseconds() / 1e9 >= since_s
                   for r in await self.router_reports(version))

    async def close(self) -> None:
        for proc in (self.router, self.optimizer):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                await asyncio.to_thread(proc.wait, 30)
        for name in ("channel", "router_channel"):
            if hasattr(self, name):
                await getattr(self, name).close()


def stored_plan_version(path: Path) -> int | None:
    """The plan version the router's database holds as its last good plan."""
    db = sqlite3.connect(path, timeout=30)
    try:
        row = db.execute("SELECT plan_version FROM last_plan").fetchone()
    finally:
        db.close()
    return None if row is None else int(row[0])


def children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
            for c in (task / "children").read_text().split()]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return "\nState:\tZ" not in status


@pytest.fixture
async def fleet(request, tmp_path, start_inprocess, emulators):
    started = Fleet(tmp_path, getattr(request, "param", 1))
    try:
        await started.start(start_inprocess, emulators)
        yield started
    finally:
        await started.close()


@pytest.mark.parametrize("fleet", [1, 2], indirect=True, ids=["one-process", "two-workers"])
async def test_router_sigkill_mid_switch_restarts_on_whole_weights_and_reports_the_truth(fleet: Fleet) -> None:
    first = await fleet.plan_on(("A100-80GB", "H100-80GB"))
    await until(lambda: _on(fleet, first.version), 30, f"the router on v{first.version}")
    await until(lambda: fleet.applied_since(first.version, 0), 30, "the router's APPLIED report of v1")
    stop = asyncio.Event()
    client = asyncio.ensure_future(fleet.client(stop))
    try:
        # the switch cut half-way: v2 in force in memory, its storing waiting for the database, then SIGKILL
        with WriteLock(fleet.router_dir / "router.db"):
            second = await fleet.plan_on(("H100-80GB", "A100-80GB"))
            assert fleet.weights(second.version) != fleet.weights(first.version), "the plans must differ"
            await until(lambda: _on(fleet, second.version), 30, f"the router switching to v{second.version}")
            await asyncio.sleep(0.3)
            workers = await fleet.kill_router()
        # the workers (if any) drain and exit once their write is let go: none is left
        await fleet.workers_gone(workers, 30)
        # nothing claims the router applied v2 unless it did: the one process was killed before confirming it;
        # workers get SIGTERM and may store v2 in the moment between the lock's release and their exit
        applied = any(r.state == APPLIED for r in await fleet.router_reports(second.version))
        stored = stored_plan_version(fleet.router_dir / "router.db")
        assert not applied or (fleet.workers > 1 and stored == second.version), (applied, stored)
        restarted_s = await fleet.start_router()
        # back on its stored plan (v1, whole) or already on v2 (whole), then on v2 without an operator
        await until(lambda: _on(fleet, second.version), 30, f"the restarted router on v{second.version}")
        await until(lambda: fleet.applied_since(second.version, restarted_s), 30,
                    "the restarted router's APPLIED report of v2")

        # killed right after a completed switch: the restarted router reports on the plan in force again
        third = await fleet.plan_on(("A100-80GB", "A100-80GB"))
        await until(lambda: _on(fleet, third.version), 30, f"the router on v{third.version}")
        await until(lambda: fleet.applied_since(third.version, 0), 30, "the router's APPLIED report of v3")
        await fleet.workers_gone(await fleet.kill_router(), 30)
        restarted_s = await fleet.start_router()
        assert (await fleet.route())[0] == third.version  # from its database, before the optimizer is heard
        await until(lambda: fleet.applied_since(third.version, restarted_s), 30,
                    "the restarted router's APPLIED report of v3")
        answered = fleet.answered
        await until(lambda: fleet.answered >= answered + 3, 30, "answers after the restart")
    finally:
        stop.set()
        await asyncio.wait_for(client, 60)
    active = (await fleet.stub.GetPlan(optimizer_pb2.GetPlanRequest(), timeout=10)).plan.version
    assert active == third.version == (await fleet.route())[0]
    # never a mix: each decision used the weight its engine has in the version the decision names
    for version, engine, weight in fleet.decisions:
        assert fleet.weights(version)[engine] == pytest.approx(weight, rel=1e-6, abs=1e-9), (version, engine)
    versions = {v for v, _, _ in fleet.decisions}
    assert {first.version, second.version, third.version} <= versions
    assert fleet.answered > 10 and fleet.slowest_ttft_s < SLO.ttft_s, (fleet.answered, fleet.slowest_ttft_s)
    print(f"decisions {len(fleet.decisions)} on versions {sorted(versions)}; answered {fleet.answered}; "
          f"slowest time to first token {fleet.slowest_ttft_s:.3f} s")


async def _on(fleet: Fleet, version: int) -> bool:
    return (await fleet.route())[0] == version


async def test_a_plan_the_router_cannot_store_is_reported_so_and_a_restart_converges(fleet: Fleet) -> None:
    first = await fleet.plan_on(("A100-80GB", "H100-80GB"))
    await until(lambda: _on(fleet, first.version), 30, f"the router on v{first.version}")
    stop = asyncio.Event()
    client = asyncio.ensure_future(fleet.client(stop))
    try:
        # the database locked past its busy timeout (15 s): v2 is routed on, and the report says it is not stored
        with WriteLock(fleet.router_dir / "router.db"):
            second = await fleet.plan_on(("H100-80GB", "A100-80GB"))
            await until(lambda: _on(fleet, second.version), 30, f"the router on v{second.version}")

            async def reported_unstored() -> bool:
                return any(r.state == APPLIED and "not stored in the router's database" in r.detail
                           and "locked" in r.detail for r in await fleet.router_reports(second.version))

            await until(reported_unstored, 60, "the router's report that v2 is not stored", every_s=0.5)
        # killed before anything stored v2: the restart routes on v1 (whole), then on v2 without an operator
        await fleet.kill_router()
        restarted_s = await fleet.start_router()
        await until(lambda: _on(fleet, second.version), 30, f"the restarted router on v{second.version}")

        async def reported_stored() -> bool:
            return any(r.state == APPLIED and r.reported_at.ToNanoseconds() / 1e9 >= restarted_s
                       and "not stored" not in r.detail for r in await fleet.router_reports(second.version))

        await until(reported_stored, 30, "the restarted router's APPLIED report of v2, stored")
        answered = fleet.answered
        await until(lambda: fleet.answered >= answered + 3, 30, "answers after the restart")
    finally:
        stop.set()
        await asyncio.wait_for(client, 60)
    for version, engine, weight in fleet.decisions:
        assert fleet.weights(version)[engine] == pytest.approx(weight, rel=1e-6, abs=1e-9), (version, engine)
    assert fleet.answered > 10 and fleet.slowest_ttft_s < SLO.ttft_s, (fleet.answered, fleet.slowest_ttft_s)
