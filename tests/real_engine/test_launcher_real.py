"""The gpu-partitioner's launcher on real vLLM (CPU build, tiny model): ``EngineSupervisor`` with ``VllmLauncher``
runs the very command line it builds for a MIG instance (``vllm serve MODEL --host --port --served-model-name
--gpu-memory-utilization --max-model-len``, ``CUDA_VISIBLE_DEVICES=<MIG UUID>``), waits for health and stops the
engine's process group; the SpecDecode mode's draft-model ``--speculative-config`` runs; and a KV connector given by
``--kv-transfer-config`` (vLLM's ExampleConnector, the one that works on CPU) serves a restarted engine the prefix
it stored, counted in ``vllm:external_prefix_cache_hits`` and read by the profiler as the connector's hit fraction.

What a CPU build does with the GPU flags is in docs/gpu_partitioner.md ("Real vLLM on CPU").
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from greenserve.common.engine_launch import EngineSpec, EngineSupervisor, VllmLauncher, make_launcher
from greenserve.gpu_partitioner.service import GpuPartitionerSettings
from greenserve.profiler import engine_metrics
from greenserve.v1 import common_pb2
from greenserve.vllm_cpu import engines as vllm
from tests.real_engine.conftest import STARTS, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
POOL_MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"


@pytest.fixture
def cpu_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What a CPU node's gpu-partitioner would run with: vLLM's CPU settings in its environment (the engines
    inherit it), as a GPU node's has CUDA's."""
    for key, value in vllm.engine_env(tmp_path / "scratch", base={}).items():
        monkeypatch.setenv(key, value)
    yield


def spec_for(model: Path, **changes: object) -> EngineSpec:
    spec = EngineSpec(engine_id="gpu-0/mig-0", pool="chat", served_model=POOL_MODEL, variant="", model=str(model),
                      simulator_model="llama3-8b", vllm_args=(), gpu_uuid="GPU-00000000-0000-0000-0000-000000000000",
                      mig_uuid="MIG-00000000-0000-0000-0000-000000000000", hardware="A100-80GB-MIG-3g.40gb",
                      host="127.0.0.1", port=free_port())
    return replace(spec, **changes)


def supervisor(tmp_path: Path) -> EngineSupervisor:
    """The launcher as the gpu-partitioner makes it from its settings (--engine-launcher vllm
    --engine-vllm-executable .venv-vllm/bin/vllm --engine-max-model-len 2048)."""
    settings = GpuPartitionerSettings.model_validate({
        "engine_launcher": "vllm", "engine_vllm_executable": str(vllm.venv() / "bin" / "vllm"),
        "engine_max_model_len": 2048, "data_dir": tmp_path})
    launcher = make_launcher(settings.engine_launcher, max_model_len=settings.engine_max_model_len,
                             gpu_memory_utilization=settings.engine_gpu_memory_utilization,
                             vllm_executable=settings.engine_vllm_executable)
    assert isinstance(launcher, VllmLauncher)
    return EngineSupervisor(launcher, log_dir=tmp_path / "engines", stop_grace_s=20.0)


async def started(sup: EngineSupervisor, spec: EngineSpec, name: str):
    t0 = time.monotonic()
    engine = await sup.start(spec)
    await sup.wait_healthy(engine, vllm.START_TIMEOUT_S)
    STARTS.append((name, time.monotonic() - t0))
    return engine


def completion(spec: EngineSpec, prompt: str, max_tokens: int, **extra: object) -> dict:
    reply = httpx.post(spec.url + "/v1/completions", timeout=120,
                       json={"model": spec.served_model, "prompt": prompt, "max_tokens": max_tokens, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()


async def wait_group_gone(pgid: int) -> None:
    deadline = time.monotonic() + 15
    while vllm.group_alive(pgid):
        assert time.monotonic() < deadline, f"left of the engine: {vllm.group_members(pgid)}"
        time.sleep(0.1)


async def test_the_gpu_command_line_runs_a_real_engine(tiny_model: Path, tmp_path: Path, cpu_env: None) -> None:
    sup = supervisor(tmp_path)
    spec = spec_for(tiny_model)
    engine = await started(sup, spec, "launcher, GPU command line")
    try:
        argv = engine.command.argv
        assert argv[1:3] == ("serve", str(tiny_model)) and "--gpu-memory-utilization" in argv
        assert engine.command.env == {"CUDA_VISIBLE_DEVICES": spec.mig_uuid}
        reply = completion(spec, "one instance of the pool", 6, ignore_eos=True)
        assert reply["model"] == POOL_MODEL and reply["usage"]["completion_tokens"] == 6
        snap = engine_metrics.parse(httpx.get(spec.url + "/metrics", timeout=10).text)
        assert snap.values["vllm:generation_tokens_total"] == 6
        assert len(vllm.group_members(engine.pid)) >= 3  # API server, EngineCore, worker
    finally:
        await sup.stop_all()
    await wait_group_gone(engine.pid)


async def test_spec_decode_with_a_draft_model_runs_on_cpu(tiny_model: Path, tmp_path: Path, cpu_env: None) -> None:
    """The SpecDecode mode's command (draft-model speculation) on the CPU build. The draft is the target itself,
    so greedy decoding accepts every proposed token: vLLM's own spec_decode counters say so."""
    sup = supervisor(tmp_path)
    spec = spec_for(tiny_model, serving_mode=common_pb2.SERVING_MODE_SPEC_DECODE, draft_model=str(tiny_model),
                    num_speculative_tokens=3, vllm_args=("--enforce-eager",))
    engine = await started(sup, spec, "launcher, spec decode")
    try:
        config = json.loads(engine.command.argv[engine.command.argv.index("--speculative-config") + 1])
        assert config == {"method": "draft_model", "model": str(tiny_model), "num_speculative_tokens": 3}
        reply = completion(spec, "a b c a b c", 60, ignore_eos=True, temperature=0)
        assert reply["usage"]["completion_tokens"] == 60
        text = httpx.get(spec.url + "/metrics", timeout=10).text
        values = {s.name: s.value for f in __import__("prometheus_client.parser", fromlist=["x"])
                  .text_string_to_metric_families(text) for s in f.samples if f.name.startswith("vllm:spec_decode")}
        drafted = values["vllm:spec_decode_num_draft_tokens_total"]
        assert drafted > 0 and values["vllm:spec_decode_num_accepted_tokens_total"] == drafted
    finally:
        await sup.stop_all()
    await wait_group_gone(engine.pid)


async def test_example_connector_serves_a_restarted_engine_its_stored_prefix(tiny_model: Path, tmp_path: Path,
                                                                             cpu_env: None) -> None:
    store = tmp_path / "kv-store"
    kv = json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                     "kv_connector_extra_config": {"shared_storage_path": str(store)}})
    sup = supervisor(tmp_path)
    spec = spec_for(tiny_model, vllm_args=("--enforce-eager", "--enable-prefix-caching", "--kv-transfer-config", kv))
    prompt = f"{uuid.uuid4().hex} " + " ".join(f"part {i} of the engine cache," for i in range(60))
    engine = await started(sup, spec, "launcher, ExampleConnector")
    try:
        first = completion(spec, prompt, 2)
        assert first["usage"]["prompt_tokens"] > 256
    finally:
        await sup.stop_all()
    await wait_group_gone(engine.pid)
    assert any(store.iterdir()), "the connector stored the prompt's KV"
    # a fresh engine: its own prefix cache is empty, so whatever hits comes from the connector
    engine = await started(sup, spec, "launcher, ExampleConnector restarted")
    try:
        before = engine_metrics.parse(httpx.get(spec.url + "/metrics", timeout=10).text)
        again = completion(spec, prompt, 2)
        after = engine_metrics.parse(httpx.get(spec.url + "/metrics", timeout=10).text)
    finally:
        await sup.stop_all()
    await wait_group_gone(engine.pid)
    tokens = again["usage"]["prompt_tokens"]

    def delta(name: str) -> float:
        return after.values.get(name, 0.0) - before.values.get(name, 0.0)

    assert delta("vllm:prefix_cache_hits_total") == 0
    external = delta("vllm:external_prefix_cache_hits_total")
    assert 128 <= external < tokens, (external, tokens)
    assert delta("vllm:external_prefix_cache_queries_total") == tokens
    win = engine_metrics.window(before, after)
    assert win.lmcache_hit_fraction == pytest.approx(external / tokens)
    assert engine_metrics.kv_connector_verdict(before, after) == "working"
