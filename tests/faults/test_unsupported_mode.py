"""Fault 4 of issue 36: a plan the fleet cannot carry. A serving mode the node's engines cannot run.

Real processes: the gpu-partitioner (simulated backend: an A100-40GB with MIG and a whole V100 for the
disaggregated modes' older GPU) in its own process with the vLLM launcher, whose ``vllm`` is a stand-in that logs
its arguments and runs the emulator (healthy); a router in this process; the optimizer's side is a test double that
keeps the plans and the reports in the optimizer's PlanStore and answers ``plan status`` (tests/faults/
partitioner_node.py).

The pool runs standalone, then the plan asks for disaggregated speculative decoding (DSD), which vLLM does not have
(GreenLLM's DSD is its own plug-in), then for a mode number no greenserve release knows (a malformed target), then
for speculative decoding, which vLLM runs. What must hold: DSD is REFUSED naming ``serving_modes[0]``, the mode and
the pool, the malformed one REFUSED naming ``serving_modes[0].serving_mode``; both before anything changes: the
standalone engine keeps running (the same process) and serving; no engine is launched for them and no retry follows
(a refusal is final for that plan: no back-off loop at all); ``greenserve plan status`` shows the reason; the next
plan with a mode the engines run is applied.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import grpc
import pytest
from greenserve.router.front.service import RouterSettings
from greenserve.router.front.service import build as build_router
from greenserve.v1 import common_pb2, optimizer_pb2, router_pb2, router_pb2_grpc

from tests.up_process import children_of, pids_alive

from .conftest import until
from .partitioner_node import plan_status_cli, serve_status_optimizer, start_partitioner, stop_partitioner

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

APPLIED = optimizer_pb2.ENFORCEMENT_STATE_APPLIED
REFUSED = optimizer_pb2.ENFORCEMENT_STATE_REFUSED
CHECK_S = 0.5  # --engine-check-interval-s: the watchdog's tick (a FAILED outcome would be retried from it)
WATCH_S = 6.0  # how long a refused plan is watched for retries and launches

POOL = common_pb2.Pool(
    name="chat", model="meta-llama/Llama-2-7b-chat-hf",
    variants=[common_pb2.ModelVariant(name="7b", model="meta-llama/Llama-2-7b-chat-hf", simulator_model="llama2-7b",
                                      quality_fraction=1.0)],
    draft=common_pb2.SpeculativeDraft(model="meta-llama/Llama-3.2-1B-Instruct", simulator_model="llama3.2-1b",
                                      acceptance_fraction=0.457, num_speculative_tokens=3))


def stand_in_vllm(directory: Path, launches: Path) -> None:
    """A ``vllm`` that appends its arguments (one JSON line) to ``launches`` and serves as the emulator."""
    fake = directory / "vllm"
    fake.write_text(f"""#!{sys.executable}
import json, os, sys
argv = sys.argv[1:]
with open({str(launches)!r}, "a") as fh:
    fh.write(json.dumps(argv) + "\\n")
opt = lambda name: argv[argv.index(name) + 1]
os.execv(sys.executable, [sys.executable, "-m", "greenserve.simulator.emulator", "--host", opt("--host"),
                          "--port", opt("--port"), "--model", opt("--served-model-name"), "--time-scale", "20"])
""")
    fake.chmod(0o755)


def _interval(gpu: str, mode: common_pb2.ServingModeTarget) -> common_pb2.PlanInterval:
    return common_pb2.PlanInterval(
        mig_layouts=[common_pb2.MigLayout(gpu_uuid=gpu, placements=[common_pb2.MigPlacement(
            profile="7g.40gb", start=0, size=8, pool="chat", model_variant="7b")])],
        serving_modes=[mode])


async def test_a_mode_the_engines_cannot_run_is_refused_and_the_previous_mode_kept(start_inprocess,
                                                                                    tmp_path) -> None:
    router = await start_inprocess(RouterSettings, build_router, http_port=0, watch_plans=False, feeds=False,
                                   health_interval_s=0.2, default_pool="chat", log_level="WARNING")
    optimizer, server, opt_port = await serve_status_optimizer(tmp_path / "optimizer.db", [POOL])
    channel = grpc.aio.insecure_channel(router.address)
    rtr = router_pb2_grpc.RouterServiceStub(channel)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launches = tmp_path / "launches.jsonl"
    stand_in_vllm(bin_dir, launches)
    base = random.randrange(20000, 32000, 100)
    proc = start_partitioner(
        [f"--data-dir={tmp_path / 'gp'}", "--host=127.0.0.1", "--port=0", "--backend=simulated",
         "--sim-gpus=A100-40GB,V100", "--node-name=n1", f"--optimizer-addr=127.0.0.1:{opt_port}",
         f"--router-addr={router.address}", "--engine-launcher=vllm", f"--engine-port-range={base}-{base + 99}",
         "--energy-sample-interval-s=0", "--no-log-json", f"--engine-check-interval-s={CHECK_S}",
         "--engine-health-timeout-s=60", "--engine-stop-grace-s=2", "--log-level=WARNING"],
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    seen: set[int] = set()

    def launched() -> list[list[str]]:
        return [json.loads(line) for line in launches.read_text().splitlines()] if launches.exists() else []

    def engines() -> list[int]:
        alive = [pid for pid in children_of(proc.pid) if pids_alive([pid])]
        seen.update(alive)
        return alive

    async def outcome(version: int) -> optimizer_pb2.EnforcementReport:
        def done() -> list[optimizer_pb2.EnforcementReport]:
            return [r for _, r in optimizer.arrivals
                    if r.plan_version == version and r.state != optimizer_pb2.ENFORCEMENT_STATE_APPLYING]
        await until(lambda: done() or proc.poll() is not None, 90, f"the outcome of plan v{version}")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        return done()[0]

    async def routed_to() -> str:
        request = router_pb2.RequestDescriptor(pool="chat", completion=router_pb2.CompletionInput(prompt="hello"))
        return (await rtr.Route(router_pb2.RouteRequest(request=request), timeout=10)).engine.id

    try:
        await until(lambda: optimizer.gpu_reports or proc.poll() is not None, 60, "the node's GPU report")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        gpu = next(g.uuid for g in optimizer.gpu_reports[0].gpus if g.mig_enabled)

        # 1. standalone: the engine starts and serves
        v1 = await optimizer.publish(_interval(gpu, common_pb2.ServingModeTarget(
            pool="chat", serving_mode=common_pb2.SERVING_MODE_STANDALONE)))
        first = await outcome(v1)
        assert first.state == APPLIED, first.detail
        (engine_pid,) = engines()
        engine_id = await routed_to()
        assert len(launched()) == 1

        # 2. DSD, which vLLM cannot run: refused before anything changes
        v2 = await optimizer.publish(_interval(gpu, common_pb2.ServingModeTarget(
            pool="chat", serving_mode=common_pb2.SERVING_MODE_DISAGGREGATED_SPEC_DECODE, old_hardware="V100",
            link_bandwidth_bytes_per_s=2e9)))
        refused = await outcome(v2)
        assert refused.state == REFUSED, (optimizer_pb2.EnforcementState.Name(refused.state), refused.detail)
        assert "serving_modes[0]" in refused.detail and "dsd" in refused.detail and "'chat'" in refused.detail, \
            refused.detail
        assert "nothing changed" in refused.detail, refused.detail
        deadline = time.monotonic() + WATCH_S
        while time.monotonic() < deadline:  # the previous mode's engine keeps running and serving; no retries
            assert engines() == [engine_pid]
            assert await routed_to() == engine_id
            await asyncio.sleep(0.25)
        assert len(launched()) == 1, launched()
        assert [r.state for _, r in optimizer.arrivals if r.plan_version == v2] == [
            optimizer_pb2.ENFORCEMENT_STATE_APPLYING, REFUSED]
        status = await asyncio.to_thread(plan_status_cli, opt_port)
        assert status.returncode == 3, status.stderr  # the fleet does not match the plan
        shown = json.loads(status.stdout)
        assert shown["version"] == v2
        (report,) = shown["reports"]
        assert report["state"] == "refused" and "dsd" in report["detail"] and "chat" in report["detail"], report

        # 3. a mode number no release knows (a malformed target): refused naming the field
        v3 = await optimizer.publish(_interval(gpu, common_pb2.ServingModeTarget(pool="chat", serving_mode=99)))
        malformed = await outcome(v3)
        assert malformed.state == REFUSED and "serving_modes[0].serving_mode" in malformed.detail, malformed.detail
        assert engines() == [engine_pid] and len(launched()) == 1

        # 4. speculative decoding, which vLLM runs: the engine is restarted in that mode
        v4 = await optimizer.publish(_interval(gpu, common_pb2.ServingModeTarget(
            pool="chat", serving_mode=common_pb2.SERVING_MODE_SPEC_DECODE)))
        applied = await outcome(v4)
        assert applied.state == APPLIED, applied.detail
        last = launched()[-1]
        assert len(launched()) == 2 and json.loads(last[last.index("--speculative-config") + 1])["model"] == \
            POOL.draft.model
        await until(lambda: engines() and engines() != [engine_pid], 30, "the engine in the new mode")
    finally:
        await stop_partitioner(proc)
        for pid in pids_alive(list(seen)):
            os.killpg(pid, signal.SIGKILL)
        await channel.close()
        await server.stop(0)
        optimizer.db.close()
