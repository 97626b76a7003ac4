"""Fault 4 of issue 36: a plan the fleet cannot carry. An engine that fails its health check after every launch.

Real processes: the gpu-partitioner (simulated MIG backend) runs in its own process with the vLLM launcher, whose
``vllm`` is a stand-in that starts the emulator with ``--hang`` (it binds its port, then never answers
``/health``) and logs each launch; a router in this process serves the pool on an emulated engine of its own; the
optimizer's side is a test double that streams the plan and records the reports (tests/gpu_partitioner).

What must hold: the partitioner reports the plan FAILED with the reason (the layout is applied, the engine did not
start); the engine that failed is stopped, never left running; the fleet keeps serving on the engine it had; and
the retries back off (before: one launch every --engine-check-interval-s tick, for ever), each wait about double
the one before, up to --engine-retry-backoff-max-s.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from greenserve.router.front.service import RouterSettings
from greenserve.router.front.service import build as build_router
from greenserve.simulator.emulator import EmulatorConfig, EngineEmulator
from greenserve.v1 import common_pb2, optimizer_pb2, router_pb2, router_pb2_grpc

from tests.gpu_partitioner.test_follow import InTestOptimizer, _serve
from tests.process import stop_process
from tests.up_process import children_of, pids_alive

from .conftest import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

CHECK_S = 0.5  # --engine-check-interval-s
HEALTH_S = 1.0  # --engine-health-timeout-s
BACKOFF_MAX_S = 4.0  # --engine-retry-backoff-max-s
WATCH_S = 22.0  # long enough for the launches 1 s, 2 s and 4 s apart after the first retry (each cycle ~3 s)


def stand_in_vllm(directory: Path, launches: Path) -> None:
    fake = directory / "vllm"
    fake.write_text(f"""#!{sys.executable}
import os, sys, time
argv = sys.argv[1:]
with open({str(launches)!r}, "a") as fh:
    fh.write(f"{{time.monotonic()}}\\n")
opt = lambda name: argv[argv.index(name) + 1]
os.execv(sys.executable, [sys.executable, "-m", "greenserve.simulator.emulator", "--host", opt("--host"),
                          "--port", opt("--port"), "--model", opt("--served-model-name"), "--hang"])
""")
    fake.chmod(0o755)


async def test_an_engine_failing_health_is_reported_stopped_and_retried_with_backoff(start_inprocess,
                                                                                     tmp_path) -> None:
    router = await start_inprocess(RouterSettings, build_router, http_port=0, watch_plans=False, feeds=False,
                                   health_interval_s=0.2, default_pool="chat", log_level="WARNING")
    kept = EngineEmulator(EmulatorConfig(host="127.0.0.1", port=0, time_scale=20.0))
    await kept.start()
    channel = grpc.aio.insecure_channel(router.address)
    rtr = router_pb2_grpc.RouterServiceStub(channel)
    await rtr.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
        id="kept", url=kept.url, pool="chat", model="m", kind=common_pb2.ENGINE_KIND_SIMULATED)))
    optimizer = InTestOptimizer()
    server, opt_port = await _serve(optimizer)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launches = tmp_path / "launches.txt"
    stand_in_vllm(bin_dir, launches)
    base = random.randrange(20000, 32000, 100)
    proc = subprocess.Popen(
        [sys.executable, "-m", "greenserve.gpu_partitioner", "--host=127.0.0.1", "--port=0",
         f"--data-dir={tmp_path / 'gp'}", "--backend=simulated", "--sim-gpus=A100-40GB", "--node-name=n1",
         f"--optimizer-addr=127.0.0.1:{opt_port}", f"--router-addr={router.address}", "--engine-launcher=vllm",
         f"--engine-port-range={base}-{base + 99}", "--energy-sample-interval-s=0", "--no-log-json",
         f"--engine-check-interval-s={CHECK_S}", f"--engine-health-timeout-s={HEALTH_S}",
         f"--engine-retry-backoff-max-s={BACKOFF_MAX_S}", "--engine-stop-grace-s=1", "--log-level=WARNING"],
        env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    seen: set[int] = set()
    try:
        await until(lambda: optimizer.gpu_reports or proc.poll() is not None, 60, "the node's GPU report")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        gpu = optimizer.gpu_reports[0].gpus[0].uuid
        interval = common_pb2.PlanInterval(mig_layouts=[common_pb2.MigLayout(gpu_uuid=gpu, placements=[
            common_pb2.MigPlacement(profile="3g.20gb", start=4, size=4, pool="chat", model_variant="1b"),
            common_pb2.MigPlacement(profile="4g.20gb", start=0, size=4)])])
        interval.start.FromSeconds(0)
        interval.end.FromSeconds(4_000_000_000)
        await optimizer.plans.put(common_pb2.Plan(version=7, intervals=[interval]))

        def failed() -> list[optimizer_pb2.EnforcementReport]:
            return [r for r in optimizer.enforcement if r.state == optimizer_pb2.ENFORCEMENT_STATE_FAILED]

        await until(lambda: failed() or proc.poll() is not None, 60, "FAILED from the partitioner")
        assert proc.poll() is None
        report = failed()[0]
        assert report.plan_version == 7 and "health" in report.detail, report.detail
        # the layout is applied (partly: its engine did not start), as the next inventory report says
        await until(lambda: any(len(r.gpus[0].instances) == 2 for r in optimizer.gpu_reports), 30, "the new layout")

        request = router_pb2.RequestDescriptor(pool="chat", completion=router_pb2.CompletionInput(prompt="hello"))
        deadline = time.monotonic() + WATCH_S
        while time.monotonic() < deadline:
            engines = [pid for pid in children_of(proc.pid) if pids_alive([pid])]
            seen.update(engines)
            assert len(engines) <= 1, f"failed engines left running: {engines}"
            route = await rtr.Route(router_pb2.RouteRequest(request=request), timeout=10)
            assert route.engine.id == "kept"  # the fleet serves on the engine it had
            await asyncio.sleep(0.25)
        times = [float(line) for line in launches.read_text().split()]
        gaps = [b - a for a, b in zip(times, times[1:])]
        # each gap is a launch's cycle (start, HEALTH_S, stop: about 3 s here, more on a loaded machine) plus the
        # wait: before, one tick (the gaps all alike); now 2 x CHECK_S, doubling, up to BACKOFF_MAX_S
        assert len(times) >= 3, gaps  # it keeps trying
        assert gaps[-1] - gaps[0] >= 2.0, gaps
        assert all(g <= BACKOFF_MAX_S + 8.0 for g in gaps), gaps  # the wait is bounded
        assert all(r.state != optimizer_pb2.ENFORCEMENT_STATE_APPLIED for r in optimizer.enforcement)
    finally:
        await stop_process(proc, group=True)
        for pid in pids_alive(list(seen)):
            os.killpg(pid, signal.SIGKILL)
        await channel.close()
        await server.stop(0)
        await kept.stop()
