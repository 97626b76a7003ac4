"""DPD made real (issue 19): the node's whole (non-MIG) GPUs in the inventory, the vLLM pair's commands, a refusal
naming the field when the node has no older GPU, and on the local fleet a DPD plan starting the two emulated
engines, registering them as one engine with its prefill URL, and a request through the router streaming the
decoder's text."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from greenserve.common.client import ChannelConfig
from greenserve.common.engine_launch import (
    EmulatorLauncher,
    EngineSpec,
    EngineSupervisor,
    VllmLauncher,
    decoder_id,
)
from greenserve.common.persistence import Database
from greenserve.common.plan_follow import APPLIED, REFUSED
from greenserve.gpu_partitioner.apply import ApplyCoordinator
from greenserve.gpu_partitioner.backend import NotSupportedError
from greenserve.gpu_partitioner.backend_nvml import NvmlBackend
from greenserve.gpu_partitioner.backend_sim import SimulatedBackend, parse_gpu_spec
from greenserve.gpu_partitioner.enforcer import MigEnforcer
from greenserve.gpu_partitioner.instance_engines import engine_id_for
from greenserve.gpu_partitioner.peer_clients import RouterEngines
from greenserve.router.front.service import RouterSettings
from greenserve.router.front.service import build as build_router
from greenserve.v1 import common_pb2, router_pb2, router_pb2_grpc

from tests.cache_manager.conftest import lmcache_venv
from tests.gpu_partitioner.fake_pynvml import FakeNvml

NODE = "node-d"
DPD = common_pb2.SERVING_MODE_DISAGGREGATED
POOL = common_pb2.Pool(
    name="chat", model="meta-llama/Llama-2-7b-chat-hf",
    variants=[common_pb2.ModelVariant(name="7b", model="meta-llama/Llama-2-7b-chat-hf", simulator_model="llama2-7b",
                                      quality_fraction=1.0)])


def _spec(**kw: Any) -> EngineSpec:
    base = dict(engine_id="e1", pool="chat", served_model=POOL.model, variant="7b", model=POOL.model,
                simulator_model="llama2-7b", vllm_args=(), gpu_uuid="GPU-1", mig_uuid="MIG-1",
                hardware="A100-40GB-MIG-7g.40gb", host="127.0.0.1", port=8000, serving_mode=DPD,
                old_hardware="T4", link_bandwidth_bytes_per_s=2e9, pd_peer_host="127.0.0.1", pd_init_port=8102,
                pd_alloc_port=8103)
    base.update(kw)
    return EngineSpec(**base)


def test_vllm_runs_dpd_as_a_pair_with_lmcache_pd_settings_and_still_refuses_dsd() -> None:
    launcher = VllmLauncher()
    prefill = launcher.command(_spec(pd_role="prefill"))
    decode = launcher.command(_spec(engine_id="e1/decode", pd_role="decode", gpu_uuid="GPU-T4", mig_uuid="",
                                    hardware="T4", port=8101))
    for cmd, role in ((prefill, "kv_producer"), (decode, "kv_consumer")):
        config = json.loads(cmd.argv[cmd.argv.index("--kv-transfer-config") + 1])
        assert config["kv_connector"] == "LMCacheConnectorV1" and config["kv_role"] == role
        assert config["kv_connector_extra_config"]["discard_partial_chunks"] is False
        assert cmd.env["LMCACHE_ENABLE_PD"] == "True" and cmd.env["LMCACHE_TRANSFER_CHANNEL"] == "nixl"
        assert cmd.env["PYTHONHASHSEED"] == "0"
        assert cmd.env["LMCACHE_PD_BACKEND_MODE"] == "sync"  # the backend that honours the skipped proxy notification
    assert json.loads(decode.argv[decode.argv.index("--kv-transfer-config") + 1])[
        "kv_connector_extra_config"]["skip_last_n_tokens"] == 1
    assert prefill.env["LMCACHE_PD_ROLE"] == "sender" and prefill.env["CUDA_VISIBLE_DEVICES"] == "MIG-1"
    assert prefill.env["LMCACHE_PD_SKIP_PROXY_NOTIFICATION"] == "True"
    assert decode.env["LMCACHE_PD_ROLE"] == "receiver" and decode.env["CUDA_VISIBLE_DEVICES"] == "GPU-T4"
    assert (decode.env["LMCACHE_PD_PEER_HOST"], decode.env["LMCACHE_PD_PEER_INIT_PORT"],
            decode.env["LMCACHE_PD_PEER_ALLOC_PORT"]) == ("127.0.0.1", "8102", "8103")
    assert decode.argv[decode.argv.index("--port") + 1] == "8101"
    with pytest.raises(ValueError, match="pair"):  # DPD as one engine
        launcher.command(_spec())
    with pytest.raises(ValueError, match="no disaggregated speculative"):
        launcher.command(_spec(serving_mode=common_pb2.SERVING_MODE_DISAGGREGATED_SPEC_DECODE))
    with pytest.raises(ValueError, match="init/alloc"):
        launcher.command(_spec(pd_role="decode", pd_init_port=0))
    emulated = EmulatorLauncher(argv0=["sim"]).command(_spec(engine_id="e1/decode", pd_role="decode", mig_uuid="",
                                                           gpu_uuid="GPU-V", hardware="V100"))
    argv = emulated.argv
    assert argv[argv.index("--pd-role") + 1] == "decode" and argv[argv.index("--profile") + 1] == "llama2-7b@V100"
    assert emulated.env["CUDA_VISIBLE_DEVICES"] == "GPU-V"


def test_lmcache_accepts_the_pd_environment_of_both_engines_of_the_pair() -> None:
    """LMCache 0.5.6's own code (its virtualenv, ``lmcache_pd_config_check.py``) builds the PD backend configuration
    of each engine from the environment the launcher gives it. Without ``LMCACHE_PD_BACKEND_MODE=sync`` the prefiller
    got LMCache's default async backend, which asserts a proxy host and port and so failed at start."""
    python = lmcache_venv() / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no LMCache virtualenv at {python.parent.parent} (scripts/install-lmcache.sh)")
    launcher = VllmLauncher()
    prefill = launcher.command(_spec(pd_role="prefill"))
    decode = launcher.command(_spec(engine_id="e1/decode", pd_role="decode", gpu_uuid="GPU-T4", mig_uuid="",
                                    hardware="T4", port=8101))
    for cmd, role in ((prefill, "sender"), (decode, "receiver")):
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
               "LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1", "LMCACHE_DISABLE_BANNER": "1", **cmd.env}
        result = subprocess.run([str(python), str(Path(__file__).with_name("lmcache_pd_config_check.py"))],
                                env=env, capture_output=True, text=True, timeout=120)
        lines = result.stdout.strip().splitlines()
        assert lines, result.stderr[-2000:]
        answer = json.loads(lines[-1])
        assert answer["ok"], f"{role}: {answer['error']}"
        assert (answer["mode"], answer["role"]) == ("sync", role)


def test_the_inventory_lists_whole_gpus(db: Database) -> None:
    nvml = NvmlBackend(FakeNvml([("A100-40GB", True), ("T4", False), ("A100-40GB", False)]))
    mig, t4, mig_off = nvml.list_gpus()
    assert (t4.mig_capable, t4.whole, t4.hardware, t4.model) == (False, True, "T4", None)
    assert (mig.whole, mig.hardware) == (False, "A100-40GB")
    assert (mig_off.mig_capable, mig_off.whole, mig_off.hardware) == (True, True, "A100-40GB")
    with pytest.raises(NotSupportedError):
        nvml.geometry(t4.uuid)
    sim = SimulatedBackend(db, parse_gpu_spec("A100-40GB,V100"))
    a100, v100 = sim.list_gpus()
    assert (v100.mig_capable, v100.whole, v100.hardware, v100.model) == (False, True, "V100", None)
    assert not a100.whole
    with pytest.raises(NotSupportedError):
        sim.set_mig_mode(v100.uuid, True)
    sim.start_process(v100.uuid)  # an engine on the whole GPU draws busy power
    assert sim.read_power(v100.uuid).power_w == pytest.approx(300.0)
    with pytest.raises(ValueError, match="has no MIG"):
        parse_gpu_spec("T4:mig")


@pytest.fixture
async def rig(db: Database, start_inprocess: Any, tmp_path: Path, request: pytest.FixtureRequest
              ) -> AsyncIterator[tuple]:
    router = await start_inprocess(RouterSettings, build_router, http_port=0, watch_plans=False, feeds=False,
                                   health_interval_s=0.2, scrape_interval_s=0.2, log_level="WARNING")
    backend = SimulatedBackend(db, parse_gpu_spec(getattr(request, "param", "A100-40GB,V100")))
    link = RouterEngines(ChannelConfig(address=router.address))
    base = random.randrange(33100, 34000, 100)
    supervisor = EngineSupervisor(EmulatorLauncher(time_scale=10.0), port_range=(base, base + 99),
                                  log_dir=tmp_path / "engines", stop_grace_s=5.0)

    async def fleet() -> dict[str, common_pb2.Pool]:
        return {POOL.name: POOL}

    enforcer = MigEnforcer(backend=backend, coordinator=ApplyCoordinator(db, backend, link), node=NODE, fleet=fleet,
                           router=link, supervisor=supervisor, drain_timeout_s=10.0, health_timeout_s=60.0)
    channel = grpc.aio.insecure_channel(router.address)
    http = f"http://127.0.0.1:{router.server.registrations[0].servicer.http.port}"
    try:
        yield enforcer, backend, supervisor, router_pb2_grpc.RouterServiceStub(channel), http
    finally:
        await supervisor.stop_all()
        await link.close()
        await channel.close()


def _plan(version: int, gpu: str, mode: int, old: str = "V100") -> tuple[common_pb2.Plan, common_pb2.PlanInterval]:
    interval = common_pb2.PlanInterval(
        mig_layouts=[common_pb2.MigLayout(gpu_uuid=gpu, placements=[common_pb2.MigPlacement(
            profile="7g.40gb", start=0, size=8, pool="chat", model_variant="7b")])],
        serving_modes=[common_pb2.ServingModeTarget(pool="chat", serving_mode=mode, old_hardware=old,
                                                    link_bandwidth_bytes_per_s=2e9)])
    interval.start.FromSeconds(0)
    interval.end.FromSeconds(4_000_000_000)
    plan = common_pb2.Plan(version=version, intervals=[interval])
    return plan, plan.intervals[0]


async def _generation_tokens(s: aiohttp.ClientSession, url: str) -> float:
    async with s.get(url + "/metrics") as resp:
        text = await resp.text()
    return sum(float(m) for m in re.findall(r"^vllm:generation_tokens_total\{[^}]*\} (\S+)$", text, re.MULTILINE))


async def test_a_dpd_plan_starts_the_pair_and_the_router_streams_the_decoders_text(rig: tuple) -> None:
    enforcer, backend, supervisor, routers, http = rig
    a100, v100 = backend.list_gpus()
    outcome = await enforcer.reconcile(*_plan(1, a100.uuid, DPD))
    assert outcome.state == APPLIED, outcome.detail
    assert "DPD decoder on V100" in outcome.detail
    inst = backend.gpu(a100.uuid).instances[0]
    prefiller = supervisor.by_mig_uuid()[inst.uuid]
    decoder = supervisor.decoder_of(prefiller.spec.engine_id)
    assert decoder is not None and decoder.spec.gpu_uuid == v100.uuid
    assert decoder.command.env["CUDA_VISIBLE_DEVICES"] == v100.uuid
    argv = decoder.command.argv
    assert argv[argv.index("--pd-role") + 1] == "decode" and argv[argv.index("--profile") + 1] == "llama2-7b@V100"
    listed = (await routers.ListEngines(router_pb2.ListEnginesRequest())).engines
    assert [(s.engine.id, s.engine.url, s.engine.prefill_url) for s in listed] == [
        (engine_id_for(NODE, inst.uuid), decoder.spec.url, prefiller.spec.url)]
    spec = json.loads(listed[0].engine.prefill_kv_transfer_params)["disagg_spec"]  # where the decoder's NIXL listens
    assert spec == {"receiver_host": "127.0.0.1", "receiver_init_port": [decoder.spec.pd_init_port],
                    "receiver_alloc_port": [decoder.spec.pd_alloc_port]}
    assert len({prefiller.spec.port, decoder.spec.port, decoder.spec.pd_init_port, decoder.spec.pd_alloc_port}) == 4
    body = {"model": POOL.model, "prompt": "tell me about carbon " * 20, "max_tokens": 9, "stream": True}
    text = []
    async with aiohttp.ClientSession() as s:
        async with s.post(http + "/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            async for line in resp.content:
                if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
                    obj = json.loads(line[6:])
                    text += [c.get("text", "") for c in obj.get("choices", [])]
        assert "".join(text), "the decoder streamed text"
        assert await _generation_tokens(s, prefiller.spec.url) == 1  # the prefill step's one token
        assert await _generation_tokens(s, decoder.spec.url) == 9  # the answer, from the decoder
    # the decoder dies: the next reconcile restarts the pair (a prefiller alone cannot serve)
    os.killpg(decoder.pid, signal.SIGKILL)
    await decoder.process.wait()
    outcome = await enforcer.reconcile(*_plan(1, a100.uuid, DPD))
    assert outcome.state == APPLIED and "had exited" in outcome.detail, outcome.detail
    prefiller, old_decoder = supervisor.by_mig_uuid()[inst.uuid], decoder
    decoder = supervisor.decoder_of(prefiller.spec.engine_id)
    assert decoder is not None and decoder.returncode is None and decoder.pid != old_decoder.pid
    listed = (await routers.ListEngines(router_pb2.ListEnginesRequest())).engines
    assert [(s.engine.url, s.engine.prefill_url) for s in listed] == [(decoder.spec.url, prefiller.spec.url)]
    # back to Standalone: the pair goes (both processes), one engine on the instance
    outcome = await enforcer.reconcile(*_plan(2, a100.uuid, common_pb2.SERVING_MODE_STANDALONE))
    assert outcome.state == APPLIED, outcome.detail
    assert prefiller.returncode is not None and decoder.returncode is not None
    assert decoder_id(prefiller.spec.engine_id) not in supervisor.engines
    listed = (await routers.ListEngines(router_pb2.ListEnginesRequest())).engines
    assert [s.engine.prefill_url for s in listed] == [""]


@pytest.mark.parametrize("rig", ["A100-40GB"], indirect=True)
async def test_dpd_without_an_older_gpu_on_the_node_is_refused_naming_the_field(rig: tuple) -> None:
    enforcer, backend, supervisor, _routers, _ = rig
    (a100,) = backend.list_gpus()
    outcome = await enforcer.reconcile(*_plan(1, a100.uuid, DPD, old="T4"))
    assert outcome.state == REFUSED and "serving_modes[0].old_hardware" in outcome.detail, outcome.detail
    assert backend.gpu(a100.uuid).instances == [] and not supervisor.engines, "nothing changed"


async def test_the_service_lists_and_meters_a_whole_gpu(start_inprocess: Any, router: Any) -> None:
    from greenserve.common.client import create_channel
    from greenserve.gpu_partitioner.service import GpuPartitionerSettings, build
    from greenserve.v1 import gpu_partitioner_pb2, gpu_partitioner_pb2_grpc

    svc = await start_inprocess(GpuPartitionerSettings, build, backend="simulated", sim_gpus="A100-40GB,T4",
                                router_addr=router.address, energy_sample_interval_s=0, follow_plans=False)
    channel = create_channel(ChannelConfig(address=svc.address))
    try:
        stub = gpu_partitioner_pb2_grpc.GpuPartitionerServiceStub(channel)
        gpus = (await stub.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())).gpus
        assert [g.mig_enabled for g in gpus] == [True, False] and gpus[1].name == "T4 (simulated)"
        assert gpus[1].model == common_pb2.GPU_MODEL_OTHER
        energy = (await stub.GetEnergy(gpu_partitioner_pb2.GetEnergyRequest(gpu_uuids=[gpus[1].uuid]))).gpus
        assert energy[0].power_w == pytest.approx(energy[0].idle_power_w) and not energy[0].instances
        with pytest.raises(grpc.aio.AioRpcError) as err:  # no MIG on it: refused, not INTERNAL
            await stub.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(layout=common_pb2.MigLayout(
                gpu_uuid=gpus[1].uuid, placements=[common_pb2.MigPlacement(profile="1g.5gb")])))
        assert err.value.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT), \
            err.value.details()
    finally:
        await channel.close()
