"""The gpu-partitioner's reconcile of a plan interval: validation first, drain, journaled apply, engines started
(real emulated engines) and registered with a real in-process router, rollback on a fault midway."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from greenserve.common.client import ChannelConfig
from greenserve.common.engine_launch import EmulatorLauncher, EngineSupervisor
from greenserve.common.mig_geometry import Placement
from greenserve.common.persistence import Database
from greenserve.common.plan_follow import APPLIED, FAILED, REFUSED, ROLLED_BACK, PlanFollower
from greenserve.gpu_partitioner.apply import ApplyCoordinator
from greenserve.gpu_partitioner.backend_sim import SimulatedBackend
from greenserve.gpu_partitioner.enforcer import MigEnforcer
from greenserve.gpu_partitioner.instance_engines import engine_id_for
from greenserve.gpu_partitioner.models import ApplyRun
from greenserve.gpu_partitioner.peer_clients import RouterEngines
from greenserve.router.front.service import RouterSettings
from greenserve.router.front.service import build as build_router
from greenserve.v1 import common_pb2, router_pb2, router_pb2_grpc
from sqlalchemy import func, select

from tests.gpu_partitioner.test_apply import FaultyBackend

NODE = "node-a"
POOL = common_pb2.Pool(name="chat", model="meta-llama/Meta-Llama-3-8B-Instruct", variants=[
    common_pb2.ModelVariant(name="8b-bf16", model="meta-llama/Meta-Llama-3-8B-Instruct", simulator_model="llama3-8b",
                            quality_fraction=1.0),
    common_pb2.ModelVariant(name="1b", model="meta-llama/Llama-3.2-1B-Instruct", simulator_model="llama3.2-1b",
                            quality_fraction=0.7),
])


def _p(profile: str, start: int, size: int, pool: str = "", variant: str = "") -> common_pb2.MigPlacement:
    return common_pb2.MigPlacement(profile=profile, start=start, size=size, pool=pool, model_variant=variant)


def _plan(version: int, *layouts: common_pb2.MigLayout) -> tuple[common_pb2.Plan, common_pb2.PlanInterval]:
    interval = common_pb2.PlanInterval(mig_layouts=list(layouts))
    interval.start.FromSeconds(0)
    interval.end.FromSeconds(4_000_000_000)
    plan = common_pb2.Plan(version=version, intervals=[interval])
    return plan, plan.intervals[0]


class SpyRouter(RouterEngines):
    """The real router link, with every call written to a shared event log."""

    def __init__(self, config: ChannelConfig, events: list[tuple[str, Any]]) -> None:
        super().__init__(config)
        self.events = events

    async def drain(self, engine_ids: Any, timeout_s: float) -> list[str]:
        self.events.append(("drain", tuple(engine_ids)))
        return await super().drain(engine_ids, timeout_s)

    async def register(self, engine: common_pb2.Engine) -> None:
        self.events.append(("register", engine.id))
        await super().register(engine)

    async def deregister(self, engine_id: str) -> None:
        self.events.append(("deregister", engine_id))
        await super().deregister(engine_id)


class SpyBackend(FaultyBackend):
    def __init__(self, inner: Any, events: list[tuple[str, Any]], fail_at: int | None = None) -> None:
        super().__init__(inner, fail_at, "raise")
        self.events = events

    def destroy_instance(self, gpu_uuid: str, placement: Placement) -> Any:
        self.events.append(("destroy", str(placement)))
        return super().destroy_instance(gpu_uuid, placement)


@dataclass
class Rig:
    enforcer: MigEnforcer
    backend: SpyBackend
    gpu: str
    events: list[tuple[str, Any]]
    routers: router_pb2_grpc.RouterServiceStub
    supervisor: EngineSupervisor
    db: Database


@pytest.fixture
async def rig(db: Database, start_inprocess: Any, tmp_path: Path) -> AsyncIterator[Rig]:
    router = await start_inprocess(RouterSettings, build_router, http_port=0, watch_plans=False, feeds=False,
                                   health_interval_s=0.2, scrape_interval_s=0.2, log_level="WARNING")
    events: list[tuple[str, Any]] = []
    backend = SpyBackend(SimulatedBackend(db, [("A100-40GB", True)]), events)
    link = SpyRouter(ChannelConfig(address=router.address), events)
    base = random.randrange(20000, 32000, 100)  # below the ephemeral ports
    supervisor = EngineSupervisor(EmulatorLauncher(time_scale=10.0), port_range=(base, base + 99),
                                  log_dir=tmp_path / "engines", stop_grace_s=5.0)

    async def fleet() -> dict[str, common_pb2.Pool]:
        return {POOL.name: POOL}

    enforcer = MigEnforcer(backend=backend, coordinator=ApplyCoordinator(db, backend, link), node=NODE, fleet=fleet,
                           router=link, supervisor=supervisor, drain_timeout_s=10.0, health_timeout_s=60.0)
    channel = grpc.aio.insecure_channel(router.address)
    try:
        yield Rig(enforcer, backend, backend.list_gpus()[0].uuid, events, router_pb2_grpc.RouterServiceStub(channel),
                  supervisor, db)
    finally:
        await supervisor.stop_all()
        await link.close()
        await channel.close()


def _applies(db: Database) -> int:
    with db.session(readonly=True) as s:
        return int(s.scalar(select(func.count()).select_from(ApplyRun)) or 0)


async def _engines(rig: Rig) -> dict[str, common_pb2.Engine]:
    reply = await rig.routers.ListEngines(router_pb2.ListEnginesRequest())
    return {s.engine.id: s.engine for s in reply.engines}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_invalid_layout_and_unknown_pool_are_refused_and_change_nothing(rig: Rig) -> None:
    start = [Placement(0, 4, "4g.20gb"), Placement(4, 4, "3g.20gb")]
    for p in start:
        rig.backend.inner.create_instance(rig.gpu, p)
    before = rig.backend.gpu(rig.gpu).instances
    # two 3g.20gb overlap at slice 4: invalid for this GPU's geometry
    plan, interval = _plan(1, common_pb2.MigLayout(gpu_uuid=rig.gpu, placements=[
        _p("3g.20gb", 4, 4, "chat"), _p("3g.20gb", 4, 4, "chat")]))
    outcome = await rig.enforcer.reconcile(plan, interval)
    assert outcome.state == REFUSED, outcome
    assert "mig_layouts[0].placements" in outcome.detail and "nothing changed" in outcome.detail
    # a profile this GPU does not have
    plan, interval = _plan(2, common_pb2.MigLayout(gpu_uuid=rig.gpu, placements=[_p("3g.40gb", 0, 0, "chat")]))
    outcome = await rig.enforcer.reconcile(plan, interval)
    assert outcome.state == REFUSED and "3g.40gb" in outcome.detail, outcome
    # a valid layout naming an unknown pool, then an unknown variant
    for version, placement, field in ((3, _p("7g.40gb", 0, 8, "nope"), "pool"),
                                      (4, _p("7g.40gb", 0, 8, "chat", "70b"), "model_variant")):
        plan, interval = _plan(version, common_pb2.MigLayout(gpu_uuid=rig.gpu, placements=[placement]))
        outcome = await rig.enforcer.reconcile(plan, interval)
        assert outcome.state == REFUSED, outcome
        assert f"mig_layouts[0].placements[0].{field}" in outcome.detail
    assert rig.backend.gpu(rig.gpu).instances == before
    assert _applies(rig.db) == 0 and rig.events == [] and rig.supervisor.engines == {}


async def test_layout_applied_with_engines_then_changed_drain_first(rig: Rig) -> None:
    other_node_layout = common_pb2.MigLayout(gpu_uuid="GPU-on-another-node", placements=[_p("7g.40gb", 0, 8, "chat")])
    plan, interval = _plan(1, other_node_layout, common_pb2.MigLayout(gpu_uuid=rig.gpu, placements=[
        _p("4g.20gb", 0, 4, "chat", "8b-bf16"), _p("2g.10gb", 0, 0, "chat", "1b"), _p("1g.5gb", 0, 0)]))
    outcome = await rig.enforcer.reconcile(plan, interval)
    assert outcome.state == APPLIED, outcome.detail
    assert "1 layout(s) for other nodes' GPUs ignored" in outcome.detail
    gpu = rig.backend.gpu(rig.gpu)
    by_profile = {i.profile: i for i in gpu.instances}
    assert sorted(by_profile) == ["1g.5gb", "2g.10gb", "4g.20gb"]
    engines = await _engines(rig)
    four, two = by_profile["4g.20gb"], by_profile["2g.10gb"]
    assert set(engines) == {engine_id_for(NODE, four.uuid), engine_id_for(NODE, two.uuid)}, "no engine on the 1g"
    e4 = engines[engine_id_for(NODE, four.uuid)]
    assert (e4.pool, e4.model, e4.gpu_uuid, e4.mig_uuid, e4.kind) == (
        "chat", POOL.model, rig.gpu, four.uuid, common_pb2.ENGINE_KIND_SIMULATED)
    running = rig.supervisor.by_mig_uuid()
    assert running[four.uuid].spec.variant == "8b-bf16" and running[two.uuid].spec.variant == "1b"
    assert running[four.uuid].spec.hardware == "A100-40GB-MIG-4g.20gb"
    assert running[four.uuid].spec.busy_power_w > running[four.uuid].spec.idle_power_w > 0
    # the emulator got the closest profile of the variant's model, and the env names the MIG device
    argv = running[two.uuid].command.argv
    assert argv[argv.index("--profile") + 1].startswith("llama3.2-1b@")
    assert running[two.uuid].command.env == {"CUDA_VISIBLE_DEVICES": two.uuid}
    old_pid = running[two.uuid].pid

    # the same interval again: nothing changes
    rig.events.clear()
    again = await rig.enforcer.reconcile(plan, interval)
    assert again.state == APPLIED and "no change" in again.detail, again.detail
    assert rig.events == [] and rig.supervisor.by_mig_uuid()[two.uuid].pid == old_pid

    # the 2g is re-cut into two 1g: its engine is drained before the destroy, deregistered and stopped
    rig.enforcer.on_change = lambda: rig.events.append(("report", ()))  # the GPU report to the optimizer (poke)
    plan2, interval2 = _plan(2, common_pb2.MigLayout(gpu_uuid=rig.gpu, placements=[
        _p("4g.20gb", 0, 4, "chat", "8b-bf16"), _p("1g.5gb", 4, 1, "chat", "1b"), _p("1g.5gb", 5, 1),
        _p("1g.5gb", 6, 1)]))
    outcome = await rig.enforcer.reconcile(plan2, interval2)
    assert outcome.state == APPLIED, outcome.detail
    old_id = engine_id_for(NODE, two.uuid)
    kinds = [e[0] for e in rig.events]
    assert rig.events[0] == ("drain", (old_id,))
    assert kinds.index("deregister") < kinds.index("destroy") < kinds.index("register")
    # the optimizer hears of the destroyed instance at once, not once the new engine is healthy: until then its
    # fleet listed the old engine with its URL, and a router reading it registered that engine again
    assert kinds.index("destroy") < kinds.index("report") < kinds.index("register"), kinds
    assert not _alive(old_pid) and old_id not in rig.supervisor.engines
    engines = await _engines(rig)
    new_one = next(i for i in rig.backend.gpu(rig.gpu).instances if i.placement == Placement(4, 1, "1g.5gb"))
    assert set(engines) == {engine_id_for(NODE, four.uuid), engine_id_for(NODE, new_one.uuid)}
    assert rig.supervisor.by_mig_uuid()[four.uuid].pid == running[four.uuid].pid, "the kept 4g's engine kept running"


async def test_fault_midway_rolls_back_and_restarts_the_stopped_engine(rig: Rig) -> None:
    plan, interval = _plan(1, common_pb2.MigLayout(gpu_uuid=rig.gpu, placements=[
        _p("4g.20gb", 0, 4), _p("3g.20gb", 4, 4, "chat", "1b")]))
    assert (await rig.enforcer.reconcile(plan, interval)).state == APPLIED
    before = rig.backend.gpu(rig.gpu).layout
    rig.backend.fail_at = rig.backend.mutations + 2  # destroy 3g, create 2g: done; create 1g: fails
    plan2, interval2 = _plan(2, common_pb2.MigLayout(gpu_uuid=rig.gpu, placements=[
        _p("4g.20gb", 0, 4), _p("2g.10gb", 4, 2, "chat", "1b"), _p("1g.5gb", 6, 1)]))
    outcome = await rig.enforcer.reconcile(plan2, interval2)
    assert outcome.state == ROLLED_BACK, outcome.detail
    assert "injected failure" in outcome.detail and "rolled back" in outcome.detail
    after = rig.backend.gpu(rig.gpu)
    assert after.layout == before
    restored = next(i for i in after.instances if i.profile == "3g.20gb")
    assert f"restarted on {restored.uuid}" in outcome.detail
    engines = await _engines(rig)
    assert [e.mig_uuid for e in engines.values()] == [restored.uuid]


async def test_crashed_engine_is_reported_and_started_again(rig: Rig) -> None:
    plan, interval = _plan(1, common_pb2.MigLayout(gpu_uuid=rig.gpu, placements=[_p("7g.40gb", 0, 8, "chat")]))
    assert (await rig.enforcer.reconcile(plan, interval)).state == APPLIED
    engine = next(iter(rig.supervisor.engines.values()))
    os.killpg(engine.pid, 9)
    await asyncio.wait_for(engine.process.wait(), timeout=10)
    outcome = await rig.enforcer.reconcile(plan, interval)
    assert outcome.state == APPLIED, outcome.detail
    assert f"engine {engine.spec.engine_id} on {engine.spec.mig_uuid} had exited" in outcome.detail
    assert "started engine" in outcome.detail
    assert next(iter(rig.supervisor.engines.values())).returncode is None


async def test_busy_drain_fails_before_anything_changes(rig: Rig) -> None:
    plan, interval = _plan(1, common_pb2.MigLayout(gpu_uuid=rig.gpu, placements=[_p("7g.40gb", 0, 8)]))
    assert (await rig.enforcer.reconcile(plan, interval)).state == APPLIED

    async def busy(engine_ids: Any, timeout_s: float) -> list[str]:
        return list(engine_ids)

    instance = rig.backend.gpu(rig.gpu).instances[0]
    await rig.routers.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
        id="someone-elses", url="http://127.0.0.1:9", pool="chat", model=POOL.model, mig_uuid=instance.uuid)))
    rig.enforcer.router.drain = busy  # type: ignore[union-attr,method-assign]
    applies = _applies(rig.db)
    plan2, interval2 = _plan(2, common_pb2.MigLayout(gpu_uuid=rig.gpu, placements=[_p("4g.20gb", 0, 4)]))
    outcome = await rig.enforcer.reconcile(plan2, interval2)
    assert outcome.state == FAILED and "nothing changed" in outcome.detail and "someone-elses" in outcome.detail
    assert rig.backend.gpu(rig.gpu).instances == [instance] and _applies(rig.db) == applies


async def test_follower_reports_refused_for_an_invalid_plan(rig: Rig) -> None:
    follower = PlanFollower(component="gpu-partitioner", instance=NODE, channel=None, reconcile=rig.enforcer.reconcile)
    plan, _ = _plan(5, common_pb2.MigLayout(gpu_uuid=rig.gpu, placements=[_p("8g.80gb", 0, 0)]))
    await follower.offer(plan)
    assert follower.last_outcome is not None and follower.last_outcome.state == REFUSED
    assert follower.reporter.last is not None and follower.reporter.last.state == REFUSED
    assert follower.reporter.last.instance == NODE


async def test_a_layout_change_that_cannot_start_undrains_the_engines_of_others(rig: Rig) -> None:
    from greenserve.simulator.emulator import EmulatorConfig, EngineEmulator

    plan, interval = _plan(1, common_pb2.MigLayout(gpu_uuid=rig.gpu, placements=[_p("7g.40gb", 0, 8)]))
    assert (await rig.enforcer.reconcile(plan, interval)).state == APPLIED
    instance = rig.backend.gpu(rig.gpu).instances[0]
    emu = EngineEmulator(EmulatorConfig(host="127.0.0.1", port=0, time_scale=10.0))
    await emu.start()
    lock = rig.enforcer.coordinator._locks.setdefault(rig.gpu, asyncio.Lock())
    try:
        await rig.routers.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
            id="operators", url=emu.url, pool="chat", model=emu.model, mig_uuid=instance.uuid)))
        await lock.acquire()  # an ApplyLayout call is running on this GPU
        plan2, interval2 = _plan(2, common_pb2.MigLayout(gpu_uuid=rig.gpu, placements=[_p("4g.20gb", 0, 4)]))
        outcome = await rig.enforcer.reconcile(plan2, interval2)
        assert outcome.state == FAILED and "layout not applied" in outcome.detail, outcome.detail
        assert ("drain", ("operators",)) in rig.events
        state = (await _engines(rig))["operators"].state
        assert state not in (common_pb2.ENGINE_STATE_DRAINING, common_pb2.ENGINE_STATE_DRAINED)
        assert rig.backend.gpu(rig.gpu).instances == [instance]
    finally:
        if lock.locked():
            lock.release()
        await emu.stop()


async def test_vllm_launcher_path_with_a_stand_in_vllm(rig: Rig, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The vLLM launcher through the real process path: a stand-in `vllm` executable records its argv and
    CUDA_VISIBLE_DEVICES, then serves the OpenAI API (the emulator) where `vllm serve` was told to."""
    import json
    import sys

    from greenserve.common.engine_launch import VllmLauncher

    record = tmp_path / "vllm-calls.jsonl"
    fake = tmp_path / "vllm"
    fake.write_text(f"""#!{sys.executable}
import json, os, sys
argv = sys.argv[1:]
with open({str(record)!r}, "a") as fh:
    fh.write(json.dumps({{"argv": argv, "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}}) + "\\n")
opt = lambda name: argv[argv.index(name) + 1]
os.execv(sys.executable, [sys.executable, "-m", "greenserve.simulator.emulator", "--host", opt("--host"),
                          "--port", opt("--port"), "--model", opt("--served-model-name")])
""")
    fake.chmod(0o755)
    base = random.randrange(20000, 32000, 100)  # below the ephemeral ports
    supervisor = EngineSupervisor(VllmLauncher(executable=str(fake), max_model_len=4096), port_range=(base, base + 99),
                                  stop_grace_s=5.0)
    rig.enforcer.supervisor = supervisor
    rig.enforcer.lmcache_servers = {"chat": "tcp://127.0.0.1:5555"}
    try:
        plan, interval = _plan(1, common_pb2.MigLayout(gpu_uuid=rig.gpu, placements=[
            _p("4g.20gb", 0, 4, "chat", "1b"), _p("3g.20gb", 4, 4)]))
        outcome = await rig.enforcer.reconcile(plan, interval)
        assert outcome.state == APPLIED, outcome.detail
        four = next(i for i in rig.backend.gpu(rig.gpu).instances if i.profile == "4g.20gb")
        (call,) = [json.loads(line) for line in record.read_text().splitlines()]
        assert call["cuda"] == four.uuid
        argv = call["argv"]
        assert argv[:2] == ["serve", "meta-llama/Llama-3.2-1B-Instruct"]
        assert argv[argv.index("--served-model-name") + 1] == POOL.model
        assert argv[argv.index("--max-model-len") + 1] == "4096"
        assert json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_connector"] == "LMCacheMPConnector"
        (engine,) = (await _engines(rig)).values()
        assert (engine.kind, engine.mig_uuid, engine.pool) == (common_pb2.ENGINE_KIND_VLLM, four.uuid, "chat")
    finally:
        await supervisor.stop_all()


async def test_a_layout_for_this_node_whose_gpu_was_never_listed_is_a_vanished_gpu_not_another_nodes(rig: Rig) -> None:
    """A freshly started partitioner has listed no GPU yet: the layout's node (stamped by the optimizer from the
    fleet inventory) tells a GPU of this node that NVML no longer lists from another node's GPU."""
    assert not rig.enforcer.seen_gpus  # nothing listed yet: as after a restart
    here = rig.gpu
    gone = "GPU-00000000-0000-0000-0000-00000000dead"
    elsewhere = "GPU-00000000-0000-0000-0000-00000000beef"
    plan, interval = _plan(
        1, common_pb2.MigLayout(gpu_uuid=here, node=NODE, placements=[_p("3g.20gb", 0, 4), _p("3g.20gb", 4, 4)]),
        common_pb2.MigLayout(gpu_uuid=gone, node=NODE, placements=[_p("7g.40gb", 0, 8)]),
        common_pb2.MigLayout(gpu_uuid=elsewhere, node="node-b", placements=[_p("7g.40gb", 0, 8)]))
    outcome = await rig.enforcer.reconcile(plan, interval)
    assert outcome.state == FAILED, outcome
    assert f"partially applied: 1 of 2 GPU layouts of node {NODE}" in outcome.detail, outcome.detail
    assert f"GPU {gone}: layout refused: the GPU is not on this node any more" in outcome.detail, outcome.detail
    assert elsewhere not in outcome.detail and "1 layout(s) for other nodes' GPUs ignored" in outcome.detail
    assert sorted(i.profile for i in rig.backend.list_gpus()[0].instances) == ["3g.20gb", "3g.20gb"]
    assert rig.enforcer.vanished == {gone}

    # the same layouts without a node (an older optimizer): the never-listed GPU is taken for another node's
    for layout in interval.mig_layouts:
        layout.node = ""
    plan.version = 2
    outcome = await rig.enforcer.reconcile(plan, interval)
    assert outcome.state == APPLIED and "2 layout(s) for other nodes' GPUs ignored" in outcome.detail, outcome
