"""LMCache's KV connectors on a real vLLM engine (CPU build, tiny model), end to end: the product sees that the
in-process connector's tier does not work and plans without it, and sees that the multiprocess one's does.

The gpu-partitioner's launcher starts ``vllm serve`` of .venv-vllm-lmcache (the same vLLM plus LMCache 0.5.6:
``scripts/install-vllm.sh --with-lmcache``). With ``--kv-transfer-config`` naming ``LMCacheConnectorV1`` and an
LMCache configuration (``LMCACHE_CONFIG_FILE``) whose remote store is a running LMCache server of .venv-lmcache
(``lm://``), the connector starts, but LMCache has no CPU connector for vLLM's KV cache ("No supported cpu connector
found") and runs in degraded mode. The profiler's engine backend measures one point of multi-turn conversations
(each turn's prompt extends the previous context: shared prefixes of several 256-token blocks), the engine is
restarted and the same point measured again: the engine's own prefix cache hits within the point, the connector is
asked for thousands of tokens it was given before the restart and serves none, so the point's
``kv_connector_state`` is DEGRADED. Stored in the profiler and read by the optimizer, that profile makes the plan
report the pool's LMCache tier NOT WORKING and give it no cache target.

The control runs the same two measurements through the launcher's own LMCache path (``--engine-lmcache-servers``:
``LMCacheMPConnector`` to a ``lmcache server``): on the CPU build it works, the restarted engine gets the prefixes
from the server and the point is WORKING. So the verdict is the connector's, not an artefact of the workload (an
engine whose own cache holds everything asks a working connector only for tokens it never had).

Every new request to the degraded in-process connector also waits for LMCache's lookup RPC to time out
(``lookup_timeout_ms``, 3 s by default): the worker side that would answer it never started. The configuration here
sets 1 s to keep the test short. Wall time on 2 shared cores, most of it two engine starts each: 77 s and 80 s at
load average 2.8-4.7; 285 s and 187 s at 7.5-10.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from greenserve.common.engine_launch import EngineSpec, EngineSupervisor, VllmLauncher, make_launcher
from greenserve.gpu_partitioner.settings import GpuPartitionerSettings
from greenserve.optimizer import cache_tier_health
from greenserve.profiler import engine_metrics
from greenserve.profiler.engine_backend import EngineBackend
from greenserve.profiler.keys import config_key
from greenserve.profiler.method import as_proto, resolve
from greenserve.profiler.settings import ProfilerSettings
from greenserve.profiler.service import build as build_profiler
from greenserve.profiler.settings_view import EngineSettingsView
from greenserve.profiler.store import validate_profile
from greenserve.v1 import common_pb2, optimizer_pb2, profiler_pb2, profiler_pb2_grpc
from greenserve.vllm_cpu import engines as vllm
from tests.cache_manager.conftest import lmcache_venv, running_lmcache_server
from tests.optimizer.conftest import forecaster, optimizer
from tests.optimizer.test_plans import FLEET, _setup
from tests.real_engine.conftest import free_port
from tests.real_engine.test_launcher_real import POOL_MODEL, cpu_env, spec_for, started, wait_group_gone

__all__ = ["cpu_env", "forecaster", "optimizer"]  # fixtures, used by name below

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

DEGRADED_LOG_LINE = "No supported cpu connector found"
MAX_MODEL_LEN = 4096  # the multi-turn workload's later turns pass 2,048 tokens (the tiny model takes 4,096)
TINY_VOCAB = 700  # token ids the tiny model's tokenizer has (as scripts/real_engine_profile.py)
RATE_PER_S = 1.0
MEASURED_REQUESTS = 10


def wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, f"the LMCache server exited: {log.read_text()[-2000:]}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            assert time.monotonic() < deadline, f"the LMCache server did not listen in {timeout_s:.0f} s"
            time.sleep(0.2)


@pytest.fixture
def lmcache_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu_env: None) -> Iterator[Path]:
    """A running LMCache server (.venv-lmcache or $GREENSERVE_LMCACHE_VENV, ``python -m lmcache.v1.server``) and the
    LMCache configuration naming it, in the environment the launcher's engines inherit."""
    server_python = lmcache_venv() / "bin" / "python"
    why = vllm.lmcache_unavailable_reason() or vllm.unavailable_reason()
    if why is None and not server_python.exists():
        why = f"no LMCache server virtualenv at {lmcache_venv()} (bash scripts/install-lmcache.sh makes it)"
    if why:
        pytest.skip(why)
    port = free_port()
    log = tmp_path / "lmcache-server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([str(server_python), "-m", "lmcache.v1.server", "127.0.0.1", str(port),
                                   "cpu"], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True, env={**os.environ, "LMCACHE_TRACK_USAGE": "false"})
    try:
        wait_for_port(port, server, log)
        config = tmp_path / "lmcache.yaml"
        config.write_text(f"chunk_size: 256\nlocal_cpu: false\nremote_url: lm://127.0.0.1:{port}\n"
                          "remote_serde: naive\nlookup_timeout_ms: 1000\n")
        monkeypatch.setenv("LMCACHE_CONFIG_FILE", str(config))
        monkeypatch.setenv("LMCACHE_TRACK_USAGE", "false")
        yield config
    finally:
        vllm.stop_group(server, grace_s=10)


def lmcache_supervisor(tmp_path: Path) -> EngineSupervisor:
    """The launcher as the gpu-partitioner makes it (--engine-launcher vllm --engine-vllm-executable
    .venv-vllm-lmcache/bin/vllm --engine-max-model-len 4096)."""
    settings = GpuPartitionerSettings.model_validate({
        "engine_launcher": "vllm", "engine_vllm_executable": str(vllm.lmcache_venv() / "bin" / "vllm"),
        "engine_max_model_len": MAX_MODEL_LEN, "data_dir": tmp_path})
    launcher = make_launcher(settings.engine_launcher, max_model_len=settings.engine_max_model_len,
                             gpu_memory_utilization=settings.engine_gpu_memory_utilization,
                             vllm_executable=settings.engine_vllm_executable)
    assert isinstance(launcher, VllmLauncher)
    return EngineSupervisor(launcher, log_dir=tmp_path / "engines", stop_grace_s=20.0)


def sweep_spec(url: str, hardware: str) -> profiler_pb2.SweepSpec:
    return profiler_pb2.SweepSpec(
        backend=profiler_pb2.SWEEP_BACKEND_ENGINE, engine_url=url, workload="multiturn",
        request_rates_per_s=[RATE_PER_S], seed=3,
        slo=common_pb2.Slo(ttft_s=5.0, tpot_s=0.5, attainment_fraction=0.9),
        configs=[common_pb2.ProfileConfig(model=POOL_MODEL, hardware=hardware, workload="multiturn")],
        method=common_pb2.ProfileMethod(warmup_s=1.0, requests_per_point=MEASURED_REQUESTS,
                                        stop_rule=common_pb2.LADDER_STOP_RULE_FULL_LADDER))


async def fill_then_measure(sup: EngineSupervisor, spec: EngineSpec,
                            name: str) -> tuple[common_pb2.Profile, dict[str, float], str]:
    """The profiler's engine backend runs one point of the workload on the engine (the tier, if it works, stores
    every prompt's KV), the engine is restarted (its own prefix cache empty, the LMCache server still running), and
    the same point (the same backend: the same prompts) is measured again: whatever prefix the restarted engine
    gets beyond its own cache can only come from the tier. Returns the second point as a MEASURED profile, vLLM's
    counters' changes over it and the engine's log."""
    sweep = sweep_spec(spec.url, spec.hardware)
    method = resolve(sweep)
    config = sweep.configs[0]
    backend = EngineBackend(EngineSettingsView(nvml_power="off"), vocab_high=TINY_VOCAB)
    engine = await started(sup, spec, name)
    try:
        await backend.prepare(sweep)
        await backend.measure(sweep, config, RATE_PER_S, method)
    finally:
        await backend.close()
        await sup.stop_all()
    await wait_group_gone(engine.pid)
    engine = await started(sup, spec, f"{name}, restarted")
    try:
        first = engine_metrics.parse(httpx.get(spec.url + "/metrics", timeout=10).text)
        await backend.prepare(sweep)
        point = await backend.measure(sweep, config, RATE_PER_S, method)
        last = engine_metrics.parse(httpx.get(spec.url + "/metrics", timeout=10).text)
    finally:
        await backend.close()
        await sup.stop_all()
    await wait_group_gone(engine.pid)
    deltas = {counter: last.values.get(counter, 0.0) - first.values.get(counter, 0.0) for counter in (
        "vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total",
        "vllm:external_prefix_cache_hits_total")}
    profile = common_pb2.Profile(config_key=config_key(config), version=1, config=config, slo=sweep.slo,
                                 points=[point], source=common_pb2.PROFILE_SOURCE_MEASURED, method=as_proto(method),
                                 note=f"real vLLM (CPU build, tiny model), {name}")
    profile.created_at.GetCurrentTime()
    validate_profile(profile)
    print(f"{name}, the restarted engine's point: {point.requests} requests, vLLM's counters {deltas}, "
          f"verdict {common_pb2.KvConnectorState.Name(point.kv_connector_state)}")
    return profile, deltas, engine.log_path.read_text(errors="replace")


async def test_lmcaches_in_process_connector_is_degraded_and_planned_not_working(
        tiny_model: Path, tmp_path: Path, lmcache_config: Path, forecaster: Any, optimizer: Any,
        start_inprocess: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from greenserve_client.commands import plan as plan_cli

    kv = json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})
    sup = lmcache_supervisor(tmp_path)
    # the instance the fleet's "mig" engine stands for (tests/optimizer/test_plans.FLEET): its pool and hardware
    spec = spec_for(tiny_model, vllm_args=("--enforce-eager", "--enable-prefix-caching", "--kv-transfer-config", kv))
    profile, deltas, log = await fill_then_measure(sup, spec, "launcher, LMCacheConnectorV1")
    assert DEGRADED_LOG_LINE in log, log[-3000:]
    # vLLM's own counters: the shared prefixes hit the engine's own cache; the connector was asked for thousands of
    # tokens it had been given before the restart, and served none
    assert deltas["vllm:prefix_cache_hits_total"] >= 256, deltas
    assert deltas["vllm:external_prefix_cache_queries_total"] >= engine_metrics.DEGRADED_MIN_QUERY_TOKENS, deltas
    assert deltas["vllm:external_prefix_cache_hits_total"] == 0, deltas
    (point,) = profile.points
    assert point.requests == MEASURED_REQUESTS and point.failed_requests == 0
    assert point.kv_connector_state == common_pb2.KV_CONNECTOR_STATE_DEGRADED

    # the profiler stores it; the optimizer reads it and plans the pool without its LMCache tier
    profiler = await start_inprocess(ProfilerSettings, build_profiler, log_json=False)
    channel = grpc.aio.insecure_channel(profiler.address)
    try:
        stored = (await profiler_pb2_grpc.ProfilerServiceStub(channel).PutProfile(
            profiler_pb2.PutProfileRequest(profile=profile))).profile
    finally:
        await channel.close()
    assert [p.kv_connector_state for p in stored.points] == [common_pb2.KV_CONNECTOR_STATE_DEGRADED]
    running, stub, _ = await _setup(forecaster, optimizer, schedule_plans=False, profiler_addr=profiler.address)
    assert {e.hardware for p in FLEET.pools for e in p.engines if e.id == "mig"} == {spec.hardware}
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=FLEET))
    plan = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2))).plan
    (fault,) = plan.cache_tier_faults
    assert fault.pool == "chat" and fault.profile_config_key == stored.config_key
    assert "served no prefix tokens in 1 of 1 measured windows" in fault.reason
    assert not [t for iv in plan.intervals for t in iv.cache_targets if t.pool == "chat"]
    assert "pool chat: LMCache tier NOT WORKING, planned without it" in plan.explanation
    capsys.readouterr()
    await asyncio.to_thread(plan_cli.main, ["status", "--optimizer-addr", running.address])
    assert "LMCache tier of pool chat: NOT WORKING, planned without it" in capsys.readouterr().out


async def test_lmcaches_multiprocess_connector_serves_a_restarted_engine(tiny_model: Path, tmp_path: Path,
                                                                         cpu_env: None) -> None:
    """The control: the launcher's own LMCache path (a pool with an LMCache server, ``--engine-lmcache-servers``:
    ``LMCacheMPConnector`` to a ``lmcache server`` of .venv-lmcache) does work on the CPU build, and the same
    measurement says so (WORKING), so the verdict above is the connector's, not the workload's."""
    why = vllm.lmcache_unavailable_reason() or vllm.unavailable_reason()
    if why:
        pytest.skip(why)
    with running_lmcache_server(tmp_path) as server:
        spec = spec_for(tiny_model, lmcache_url=server.rpc_url,
                        vllm_args=("--enforce-eager", "--enable-prefix-caching"))
        profile, deltas, log = await fill_then_measure(lmcache_supervisor(tmp_path), spec,
                                                       "launcher, LMCacheMPConnector")
    assert DEGRADED_LOG_LINE not in log
    assert deltas["vllm:external_prefix_cache_hits_total"] >= 256, deltas
    (point,) = profile.points
    assert point.failed_requests == 0
    assert point.kv_connector_state == common_pb2.KV_CONNECTOR_STATE_WORKING
    assert cache_tier_health.faults(FLEET, [profile], {"mig": spec.hardware}) == {}
