"""Fault 5 of issue 36, the router replicas' and workers' part: two router replicas on one SQLite database, one of
them (two workers) hearing the optimizer late, while plans are activated in quick succession and across a plan
interval boundary.

Real processes: the forecaster, the optimizer and two router replicas on one database, A (one process) and B (a
supervisor and two workers), all on one virtual clock running at ``SPEED`` x (an hourly plan interval passes in
30 s, so the pushes cross a boundary). B reaches the optimizer through a proxy that holds every byte from the
optimizer for ``LAG_S``: its workers' WatchPlans streams deliver each plan late, while A stores each plan at once in
the shared database, from which B's workers take it first. Their streams then deliver the plans they already moved
past, and their plan followers reconcile again at each interval boundary.

What must hold:
* never backwards: the plan version of the routing decisions through each replica (one gRPC connection each, so
  one worker; Route, one call at a time) never decreases;
* the stale plans are skipped and said so: B's workers drop them (their log) and report them REFUSED "skipped as
  stale" (plan status);
* agreement: both replicas route on the newest plan within ``AGREE_S`` of its activation;
* an operator's rollback (ActivatePlan of an older version) still reaches both, and they stay on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from pathlib import Path

import grpc
import pytest
from greenserve.common.clock import VirtualClock, hour_floor_s, set_clock
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc, router_pb2, router_pb2_grpc

from tests.conftest import free_port
from tests.process import start_service_process

from .conftest import seeded_forecaster, start_optimizer, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SPEED = 120.0  # virtual seconds per real second: an hourly plan interval lasts 30 s
LAG_S = 3.0  # how late B hears the optimizer: longer than a plan takes to reach B through the database
PUSH_EVERY_S = 0.6  # one plan activated this often (real seconds; the computation's own time comes on top)
MIN_PLANS = 8
AGREE_S = 15.0  # B's stream is LAG_S late; room for two loaded cores
MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"
VERSION_IN_REASON = re.compile(r"plan_weight=\S+ v(\d+)")


class LaggingProxy:
    """A TCP proxy to ``upstream`` that passes the client's bytes at once and the upstream's ``lag_s`` late (in
    order), so that whatever the client hears from the upstream, it hears late."""

    def __init__(self, upstream_port: int, lag_s: float) -> None:
        self.upstream_port = upstream_port
        self.lag_s = lag_s
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            self._tasks.discard(task)
            return
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()

        async def hold() -> None:
            while data := await up_r.read(65536):
                held.put_nowait((time.monotonic() + self.lag_s, data))
            held.put_nowait((time.monotonic() + self.lag_s, b""))

        async def release() -> None:
            while True:
                due, data = await held.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if not data:
                    return
                client_w.write(data)
                await client_w.drain()

        parts = [asyncio.ensure_future(pump(client_r, up_w)), asyncio.ensure_future(hold()),
                 asyncio.ensure_future(release())]
        try:
            await asyncio.wait(parts, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass  # stop(): the connection ends here (a handler task must not end cancelled: asyncio logs it)
        finally:
            for part in parts:
                part.cancel()
            await asyncio.gather(*parts, return_exceptions=True)
            for writer in (client_w, up_w):
                writer.close()
            self._tasks.discard(task)


def start_replica(data_dir: Path, db: Path, port: int, engines: list[str], optimizer_port: int, workers: int,
                  log_level: str) -> object:
    env = {"GREENSERVE_WORKERS": str(workers), "GREENSERVE_HTTP_PORT": "-1", "GREENSERVE_FEEDS": "false", "GREENSERVE_LOG_LEVEL": log_level,
           "GREENSERVE_SCRAPE_INTERVAL_S": "0.2", "GREENSERVE_HEALTH_INTERVAL_S": "0.5"}
    return start_service_process(
        "greenserve.router", "greenserve.v1.RouterService", data_dir, port, env=env, log_name="router.log",
        extra_args=[f"--db-url=sqlite:///{db}", f"--engines={','.join(engines)}", "--default-pool=chat",
                    f"--optimizer-addr=127.0.0.1:{optimizer_port}"])


class Decisions:
    """One client per replica, one Route call at a time: the plan version of each decision, in order."""

    def __init__(self, stubs: dict[str, router_pb2_grpc.RouterServiceStub]) -> None:
        self.stubs = stubs
        self.versions: dict[str, list[int]] = {name: [] for name in stubs}

    async def route(self, name: str) -> int:
        request = router_pb2.RequestDescriptor(pool="chat", completion=router_pb2.CompletionInput(prompt="hello"))
        route = await self.stubs[name].Route(router_pb2.RouteRequest(request=request), timeout=10)
        named = VERSION_IN_REASON.search(route.reason)
        if named:  # the reason names the version whose weight chose the engine
            assert int(named.group(1)) == route.plan_version, route.reason
        self.versions[name].append(route.plan_version)
        return route.plan_version

    async def run(self, name: str, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.route(name)
            await asyncio.sleep(0.01)

    def backwards(self, name: str) -> list[tuple[int, int, int]]:
        """(index, newest seen before, version) of each decision naming an older version than one before it."""
        out, newest = [], 0
        for i, version in enumerate(self.versions[name]):
            if version < newest:
                out.append((i, newest, version))
            newest = max(newest, version)
        return out


@pytest.fixture
def virtual_clock(monkeypatch):
    """Every process of the test (this one and the services it starts) on one virtual clock at SPEED x, from three
    quarters into the current hour (the GREENSERVE_CLOCK_* environment the services read, this process's clock)."""
    anchor_s = time.time()
    start_s = hour_floor_s(anchor_s) + 2700.0
    monkeypatch.setenv("GREENSERVE_CLOCK_START", f"{start_s:.3f}")
    monkeypatch.setenv("GREENSERVE_CLOCK_SPEED", f"{SPEED:g}")
    monkeypatch.setenv("GREENSERVE_CLOCK_ANCHOR_S", f"{anchor_s:.6f}")
    clock = VirtualClock(start_s, SPEED, anchor_s)
    previous = set_clock(clock)
    yield clock
    set_clock(previous)


async def test_replicas_never_route_on_an_older_plan_and_agree_on_the_newest(tmp_path, emulators,
                                                                               virtual_clock) -> None:
    fc_port, opt_port, a_port, b_port = free_port(), free_port(), free_port(), free_port()
    procs = []
    proxy = None
    channels: list[grpc.aio.Channel] = []
    try:
        procs.append(await seeded_forecaster(tmp_path, fc_port))
        procs.append(await start_optimizer(tmp_path, opt_port, fc_port))
        proxy = LaggingProxy(opt_port, LAG_S)
        await proxy.start()
        engines = [e.url for e in await emulators(2)]
        db = tmp_path / "router.db"
        procs.append(await asyncio.to_thread(start_replica, tmp_path / "a", db, a_port, engines, opt_port, 1, "WARNING"))
        procs.append(await asyncio.to_thread(start_replica, tmp_path / "b", db, b_port, engines, proxy.port, 2,
                                          "INFO"))
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{p}") for p in (opt_port, a_port, b_port)]
        opt = optimizer_pb2_grpc.OptimizerServiceStub(channels[0])
        stubs = {"A": router_pb2_grpc.RouterServiceStub(channels[1]),
                 "B": router_pb2_grpc.RouterServiceStub(channels[2])}
        listed = (await stubs["A"].ListEngines(router_pb2.ListEnginesRequest(), timeout=10)).engines
        pool = common_pb2.Pool(name="chat", model=MODEL, region="FR",
                               slo=common_pb2.Slo(ttft_s=2.0, tpot_s=0.2, attainment_fraction=0.9))
        for state, hardware in zip(sorted(listed, key=lambda s: s.engine.id), ("A100-80GB", "H100-80GB"),
                                   strict=True):
            pool.engines.add(id=state.engine.id, url=state.engine.url, hardware=hardware)
        await opt.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(pools=[pool])))

        decisions = Decisions(stubs)
        stop = asyncio.Event()
        clients = [asyncio.ensure_future(decisions.run(name, stop)) for name in stubs]
        plans: list[common_pb2.Plan] = []
        try:
            first_s = virtual_clock.now_s()
            boundary_s = (math.floor(first_s / 3600.0) + 1) * 3600.0
            # plans in quick succession until MIN_PLANS are out and the clock is past an interval boundary
            while len(plans) < MIN_PLANS or virtual_clock.now_s() < boundary_s + 2 * PUSH_EVERY_S * SPEED:
                if plans:
                    await asyncio.sleep(PUSH_EVERY_S)
                plans.append((await opt.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=4),
                                                    timeout=60)).plan)
                pushed_at = time.monotonic()
            newest = plans[-1].version
            for name in stubs:
                await until(lambda name=name: decisions.versions[name][-1:] == [newest], AGREE_S,
                            f"replica {name} routing on v{newest}")
            agreed_s = time.monotonic() - pushed_at
            for name in stubs:
                assert not decisions.backwards(name), (name, decisions.backwards(name)[:10])

            # an operator's rollback: both replicas on it (B hears it LAG_S late), and stay there
            target = plans[-3].version
            await opt.ActivatePlan(optimizer_pb2.ActivatePlanRequest(version=target), timeout=10)
            for name in stubs:
                await until(lambda name=name: decisions.versions[name][-1:] == [target], AGREE_S,
                            f"replica {name} routing on the rolled-back v{target}")
            marks = {name: len(v) for name, v in decisions.versions.items()}
            await asyncio.sleep(2 * LAG_S)
        finally:
            stop.set()
            await asyncio.gather(*clients)
        for name, mark in marks.items():
            assert set(decisions.versions[name][mark:]) == {target}, (name, decisions.versions[name][mark:])

        versions = {p.version for p in plans}
        assert [p.version for p in plans] == sorted(versions) and len(versions) == len(plans), "one version a plan"
        b_log = (tmp_path / "b" / "router.log").read_text()
        dropped = sorted({int(v) for v in re.findall(r"plan v(\d+) from the stream dropped", b_log)})
        assert dropped, "B's streams delivered no plan after its workers moved past it: the lag did not show"
        skipped = []
        for version in sorted(versions):
            status = await opt.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest(version=version), timeout=10)
            if any(r.component == "router" and r.state == optimizer_pb2.ENFORCEMENT_STATE_REFUSED
                   and f"plan v{version} skipped as stale" in r.detail for r in status.reports):
                skipped.append(version)
        assert skipped and newest not in skipped, (skipped, dropped)
        print(f"{len(plans)} plans v{plans[0].version}..v{newest} across the boundary at virtual "
              f"{time.strftime('%H:%M', time.gmtime(boundary_s))}; decisions A {len(decisions.versions['A'])}, "
              f"B {len(decisions.versions['B'])}; both on v{newest} {agreed_s:.2f} s after its activation; "
              f"B skipped as stale: {skipped}")
    finally:
        for channel in channels:
            await channel.close()
        if proxy is not None:
            await proxy.stop()
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(proc.wait, 30)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
