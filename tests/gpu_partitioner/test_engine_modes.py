"""Serving modes made real (issue 19 item 6): vLLM's flags for speculative decoding and disaggregated prefill, the
emulator's modes, and a mode change in a plan restarting the instance's emulated engine in the new mode."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from greenserve.common.client import ChannelConfig
from greenserve.common.engine_launch import (
    EmulatorLauncher,
    EngineSpec,
    EngineSupervisor,
    VllmLauncher,
)
from greenserve.common.persistence import Database
from greenserve.common.plan_follow import APPLIED
from greenserve.gpu_partitioner.apply import ApplyCoordinator
from greenserve.gpu_partitioner.backend_sim import SimulatedBackend
from greenserve.gpu_partitioner.enforcer import MigEnforcer
from greenserve.gpu_partitioner.instance_engines import engine_id_for
from greenserve.gpu_partitioner.peer_clients import RouterEngines
from greenserve.router.front.service import RouterSettings
from greenserve.router.front.service import build as build_router
from greenserve.simulator.emulator.modes import ModeSettings
from greenserve.v1 import common_pb2, router_pb2, router_pb2_grpc

NODE = "node-m"
POOL = common_pb2.Pool(
    name="chat", model="meta-llama/Llama-2-7b-chat-hf",
    variants=[common_pb2.ModelVariant(name="7b", model="meta-llama/Llama-2-7b-chat-hf", simulator_model="llama2-7b",
                                      quality_fraction=1.0)],
    draft=common_pb2.SpeculativeDraft(model="meta-llama/Llama-3.2-1B-Instruct", simulator_model="llama3.2-1b",
                                      acceptance_fraction=0.457, num_speculative_tokens=3))


def _spec(mode: int, **kw: Any) -> EngineSpec:
    base = dict(engine_id="e1", pool="chat", served_model=POOL.model, variant="7b", model=POOL.model,
                simulator_model="llama2-7b", vllm_args=(), gpu_uuid="GPU-1", mig_uuid="MIG-1",
                hardware="A100-40GB-MIG-7g.40gb", host="127.0.0.1", port=8000, serving_mode=mode,
                draft_model=POOL.draft.model, draft_simulator_model="llama3.2-1b", acceptance_fraction=0.457)
    base.update(kw)
    return EngineSpec(**base)


def test_vllm_speculative_config_and_disaggregated_prefill_flags() -> None:
    argv = VllmLauncher().command(_spec(common_pb2.SERVING_MODE_SPEC_DECODE)).argv
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "draft_model", "model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 3}
    assert "--speculative-config" not in VllmLauncher().command(_spec(common_pb2.SERVING_MODE_STANDALONE)).argv
    with pytest.raises(ValueError, match="draft"):
        VllmLauncher().command(_spec(common_pb2.SERVING_MODE_SPEC_DECODE, draft_model=""))
    for mode, why in ((common_pb2.SERVING_MODE_DISAGGREGATED, "prefill/decode pair"),
                      (common_pb2.SERVING_MODE_DISAGGREGATED_SPEC_DECODE, "no disaggregated speculative")):
        with pytest.raises(ValueError, match=why):
            VllmLauncher().command(_spec(mode, old_hardware="T4"))
    # the DPD pair's two commands: test_dpd_pair.py


def test_launchers_say_which_modes_their_engines_cannot_run() -> None:
    target = common_pb2.ServingModeTarget
    no_draft = common_pb2.Pool(name="chat", model=POOL.model)
    vllm, emulator = VllmLauncher(), EmulatorLauncher(argv0=["sim"])
    dsd = target(pool="chat", serving_mode=common_pb2.SERVING_MODE_DISAGGREGATED_SPEC_DECODE, old_hardware="T4")
    spec = target(pool="chat", serving_mode=common_pb2.SERVING_MODE_SPEC_DECODE)
    assert "no disaggregated speculative decoding" in vllm.mode_problem(dsd, POOL)
    assert "draft.model" in vllm.mode_problem(spec, no_draft)
    for mode in (common_pb2.SERVING_MODE_STANDALONE, common_pb2.SERVING_MODE_SPEC_DECODE,
                 common_pb2.SERVING_MODE_DISAGGREGATED):  # DPD runs as a pair (its older GPU: _check_pairs)
        assert vllm.mode_problem(target(pool="chat", serving_mode=mode), POOL) == ""
    dpd = target(pool="chat", serving_mode=common_pb2.SERVING_MODE_DISAGGREGATED, old_hardware="T4")
    assert "one KV connector per engine" in vllm.mode_problem(dpd, POOL, "tcp://10.0.0.5:5555")
    assert emulator.mode_problem(dsd, POOL) == "" and emulator.mode_problem(spec, POOL) == ""
    assert "old_hardware" in emulator.mode_problem(target(pool="chat", serving_mode=dsd.serving_mode), POOL)
    assert "draft.simulator_model" in emulator.mode_problem(spec, no_draft)


def test_emulator_gets_the_mode_and_its_profiles() -> None:
    launcher = EmulatorLauncher(argv0=["sim"])
    argv = launcher.command(_spec(common_pb2.SERVING_MODE_SPEC_DECODE)).argv
    assert argv[argv.index("--mode") + 1] == "spec_decode"
    assert argv[argv.index("--draft-profile") + 1] == "llama3.2-1b@A100-40GB"  # the draft beside the target
    assert argv[argv.index("--spec-acceptance") + 1] == "0.457"
    argv = launcher.command(_spec(common_pb2.SERVING_MODE_DISAGGREGATED_SPEC_DECODE, old_hardware="T4",
                                  link_bandwidth_bytes_per_s=2e9)).argv
    assert argv[argv.index("--draft-profile") + 1] == "llama3.2-1b@T4"  # the draft on the older GPU
    assert float(argv[argv.index("--link-bandwidth-bytes-per-s") + 1]) == 2e9
    dpd = launcher.command(_spec(common_pb2.SERVING_MODE_DISAGGREGATED, old_hardware="V100"))
    assert dpd.argv[dpd.argv.index("--decode-profile") + 1] == "llama2-7b@V100"
    with pytest.raises(ValueError, match="old_hardware"):
        launcher.command(_spec(common_pb2.SERVING_MODE_DISAGGREGATED_SPEC_DECODE))
    with pytest.raises(ValueError, match="draft_profile"):
        ModeSettings("dsd").validate()


@pytest.fixture
async def rig(db: Database, start_inprocess: Any, tmp_path: Path) -> AsyncIterator[tuple]:
    router = await start_inprocess(RouterSettings, build_router, http_port=0, watch_plans=False, feeds=False,
                                   health_interval_s=0.2, scrape_interval_s=0.2, log_level="WARNING")
    backend = SimulatedBackend(db, [("A100-40GB", True)])
    link = RouterEngines(ChannelConfig(address=router.address))
    base = random.randrange(32100, 33000, 100)
    supervisor = EngineSupervisor(EmulatorLauncher(time_scale=10.0), port_range=(base, base + 99),
                                  log_dir=tmp_path / "engines", stop_grace_s=5.0)

    async def fleet() -> dict[str, common_pb2.Pool]:
        return {POOL.name: POOL}

    enforcer = MigEnforcer(backend=backend, coordinator=ApplyCoordinator(db, backend, link), node=NODE, fleet=fleet,
                           router=link, supervisor=supervisor, drain_timeout_s=10.0, health_timeout_s=60.0)
    import grpc

    channel = grpc.aio.insecure_channel(router.address)
    try:
        yield enforcer, backend, supervisor, router_pb2_grpc.RouterServiceStub(channel)
    finally:
        await supervisor.stop_all()
        await link.close()
        await channel.close()


def _plan(version: int, gpu: str, *modes: common_pb2.ServingModeTarget
          ) -> tuple[common_pb2.Plan, common_pb2.PlanInterval]:
    interval = common_pb2.PlanInterval(
        mig_layouts=[common_pb2.MigLayout(gpu_uuid=gpu, placements=[common_pb2.MigPlacement(
            profile="7g.40gb", start=0, size=8, pool="chat", model_variant="7b")])],
        serving_modes=list(modes))
    interval.start.FromSeconds(0)
    interval.end.FromSeconds(4_000_000_000)
    plan = common_pb2.Plan(version=version, intervals=[interval])
    return plan, plan.intervals[0]


async def test_a_mode_change_in_the_plan_restarts_the_engine_in_that_mode(rig: tuple) -> None:
    enforcer, backend, supervisor, routers = rig
    gpu = backend.list_gpus()[0].uuid
    plan, interval = _plan(1, gpu, common_pb2.ServingModeTarget(pool="chat",
                                                                serving_mode=common_pb2.SERVING_MODE_STANDALONE))
    outcome = await enforcer.reconcile(plan, interval)
    assert outcome.state == APPLIED, outcome.detail
    inst = backend.gpu(gpu).instances[0]
    first = supervisor.by_mig_uuid()[inst.uuid]
    assert "--mode" not in first.command.argv
    steps = [
        (common_pb2.ServingModeTarget(pool="chat", serving_mode=common_pb2.SERVING_MODE_SPEC_DECODE),
         "spec_decode", "llama3.2-1b@A100-40GB"),
        (common_pb2.ServingModeTarget(pool="chat", serving_mode=common_pb2.SERVING_MODE_DISAGGREGATED_SPEC_DECODE,
                                      old_hardware="T4", link_bandwidth_bytes_per_s=2e9), "dsd", "llama3.2-1b@T4"),
    ]
    previous = first
    for version, (target, mode, draft) in enumerate(steps, start=2):
        plan, interval = _plan(version, gpu, target)
        outcome = await enforcer.reconcile(plan, interval)
        assert outcome.state == APPLIED, outcome.detail
        engine = supervisor.by_mig_uuid()[inst.uuid]
        assert engine.pid != previous.pid and previous.returncode is not None, "the old engine was stopped"
        argv = engine.command.argv
        assert argv[argv.index("--mode") + 1] == mode and argv[argv.index("--draft-profile") + 1] == draft
        assert engine.spec.role == ("chat", "7b", mode)
        listed = await routers.ListEngines(router_pb2.ListEnginesRequest())
        assert [s.engine.id for s in listed.engines] == [engine_id_for(NODE, inst.uuid)]  # registered, healthy
        previous = engine
    # the same mode again: nothing restarts
    again = await enforcer.reconcile(plan, interval)
    assert again.state == APPLIED and supervisor.by_mig_uuid()[inst.uuid].pid == previous.pid
