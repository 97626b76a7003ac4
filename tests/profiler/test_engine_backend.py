"""Engine backend: /metrics names old and new, NVML power through a fake pynvml, prompts with real prefix reuse,
and a sweep against an emulated engine with the cache size applied through the cache-manager on a real LMCache
server."""

from __future__ import annotations

import asyncio
import re

import grpc
import httpx
import pytest

from greenserve.cache_manager.service import CacheManagerSettings
from greenserve.cache_manager.service import build as build_cache_manager
from greenserve.profiler import engine_backend, engine_metrics
from greenserve.profiler.engine_backend import prompt_token_ids
from greenserve.profiler.power import NvmlPowerMeter
from greenserve.simulator.emulator import EmulatorConfig, EngineEmulator
from greenserve.simulator.engine_profile import load_profile
from greenserve.v1 import cache_manager_pb2, cache_manager_pb2_grpc, common_pb2, profiler_pb2

from tests.cache_manager.conftest import lmcache_server  # noqa: F401 - the real LMCache server fixture
from tests.gpu_partitioner.fake_pynvml import FakeNvml

from .conftest import config, wait_state

OLD_VLLM = """# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 1000
vllm:gpu_prefix_cache_queries_total{engine="1",model_name="m"} 1000
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 300
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.01",model_name="m"} 3
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.5
vllm:time_per_output_token_seconds_count{model_name="m"} 50
# TYPE lmcache:num_requested_tokens counter
lmcache:num_requested_tokens_total 500
# TYPE lmcache:num_hit_tokens counter
lmcache:num_hit_tokens_total 100
"""


def test_metrics_window_reads_old_names_and_lmcache() -> None:
    before = engine_metrics.parse(OLD_VLLM)
    after = engine_metrics.parse(OLD_VLLM.replace(" 1000", " 2000").replace("} 300", "} 800")
                                 .replace("} 0.5", "} 1.5").replace("} 50", "} 100")
                                 .replace("_total 500", "_total 1500").replace("_total 100", "_total 400"))
    win = engine_metrics.window(before, after)
    assert win.prefix_hit_fraction == pytest.approx(500 / 2000)  # summed over both engine ranks
    assert win.tpot_mean_s == pytest.approx(1.0 / 50) and win.names["tpot"] == "vllm:time_per_output_token_seconds"
    assert win.lmcache_hit_fraction == pytest.approx(300 / 1000)
    assert win.ttft_mean_s is None and win.energy_j is None


# vLLM 0.33 with LMCache's multiprocess connector: the connector's hits are vLLM's own external_prefix_cache_*
# counters (vllm/v1/metrics/loggers.py); no lmcache:* series is on vLLM's page in that mode
VLLM_WITH_MP_CONNECTOR = """# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 200
# TYPE vllm:external_prefix_cache_queries counter
vllm:external_prefix_cache_queries_total{engine="0",model_name="m"} 800
# TYPE vllm:external_prefix_cache_hits counter
vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 250
"""


def test_metrics_window_reads_the_connectors_hits_from_vllms_external_prefix_counters() -> None:
    """Over the window 2000 prompt tokens were queried, 500 hit vLLM's prefix cache and, of the 1500 it missed,
    LMCache supplied 600: 600 / 2000 of the prompt tokens, which adds to the local 500 / 2000."""
    before = engine_metrics.parse(VLLM_WITH_MP_CONNECTOR)
    after = engine_metrics.parse(VLLM_WITH_MP_CONNECTOR.replace("} 1000", "} 3000").replace("} 200", "} 700")
                                 .replace("} 800", "} 2300").replace("} 250", "} 850"))
    win = engine_metrics.window(before, after)
    assert win.prefix_hit_fraction == pytest.approx(500 / 2000)
    assert win.lmcache_hit_fraction == pytest.approx(600 / 2000)
    # a vLLM without a connector exports the counters at 0: no connector figure, LMCache's in-process one if any
    idle = VLLM_WITH_MP_CONNECTOR.replace("} 800", "} 0").replace("} 250", "} 0")
    quiet = idle.replace("} 1000", "} 3000").replace("} 200", "} 700")
    assert engine_metrics.window(engine_metrics.parse(idle), engine_metrics.parse(quiet)).lmcache_hit_fraction is None
    lm = "# TYPE lmcache:num_requested_tokens counter\nlmcache:num_requested_tokens_total {r}\n" \
         "# TYPE lmcache:num_hit_tokens counter\nlmcache:num_hit_tokens_total {h}\n"
    win = engine_metrics.window(engine_metrics.parse(idle + lm.format(r=0, h=0)),
                                engine_metrics.parse(quiet + lm.format(r=400, h=100)))
    assert win.lmcache_hit_fraction == pytest.approx(100 / 400)


async def test_a_point_on_the_emulator_reads_vllms_per_request_tpot_and_connector_counters_first() -> None:
    """Against the emulator a point reads what it reads against vLLM 0.33: the per-request TPOT histogram (the first
    name; before, the emulator had none and the point fell back to the per-token inter-token latency) and the
    connector's external_prefix_cache counters, which the emulator, modelling no connector, shows at 0 as a vLLM
    without one does (no LMCache share: the cache-hit fraction is the prefix cache's alone)."""
    from greenserve.profiler.method import resolve
    from greenserve.profiler.settings_view import EngineSettingsView

    emu = EngineEmulator(EmulatorConfig(host="127.0.0.1", port=0, profile="llama3-8b@H100-80GB", time_scale=5.0))
    await emu.start()
    backend = engine_backend.EngineBackend(EngineSettingsView(nvml_power="off"))
    try:
        spec = profiler_pb2.SweepSpec(
            backend=profiler_pb2.SWEEP_BACKEND_ENGINE, engine_url=emu.url, engine_modelled_s_per_wall_s=5.0,
            workload="humaneval", request_rates_per_s=[2.0], point_duration_s=5.0, seed=3,
            slo=common_pb2.Slo(ttft_s=1.0, tpot_s=0.1, attainment_fraction=0.9), configs=[config()],
            method=common_pb2.ProfileMethod(warmup_s=1.0, stop_rule=common_pb2.LADDER_STOP_RULE_FULL_LADDER))
        point = await backend.measure(spec, spec.configs[0], 2.0, resolve(spec))
        text = (await backend._http().get(f"{emu.url}/metrics")).text
    finally:
        await backend.close()
        await emu.stop()
    win = backend.last_window
    assert win is not None and point.failed_requests == 0
    assert win.names["tpot"] == "vllm:request_time_per_output_token_seconds"
    # the engine's per-request TPOT is the client's (e2e - TTFT) / (tokens - 1), request by request (within 2 % on
    # an idle host; the client's end time is late by the host's latency x the time scale)
    assert win.tpot_mean_s == pytest.approx(point.tpot_mean_s, rel=0.2)
    snap = engine_metrics.parse(text)
    for quantity in ("external_queries_tokens", "external_hits_tokens"):
        assert snap.pick(engine_metrics.COUNTERS[quantity]) == (engine_metrics.COUNTERS[quantity][0], 0.0)
    assert win.lmcache_hit_fraction is None and win.prefix_hit_fraction is not None
    assert point.cache_hit_fraction == pytest.approx(win.prefix_hit_fraction)


async def test_nvml_energy_counter_then_power_samples() -> None:
    fake = FakeNvml([("H100-80GB", False)])
    fake.nvmlInit()
    meter = NvmlPowerMeter(fake, 0, interval_s=0.02)
    await meter.start()
    fake.devices[0].energy_mj += 30_000  # 30 J over the window
    await asyncio.sleep(0.2)
    watts, source, samples = await meter.stop()
    assert source == "nvml_energy_counter" and samples >= 2
    assert 30 / 0.4 < watts < 30 / 0.19  # 30 J over ~0.2 s

    def unsupported(handle):  # a GPU without the counter (pre-Volta): NVML_ERROR_NOT_SUPPORTED
        raise fake.NVMLError(fake.NVML_ERROR_NOT_SUPPORTED)

    fake.nvmlDeviceGetTotalEnergyConsumption = unsupported
    fake.devices[0].power_mw = 250_000
    await meter.start()
    await asyncio.sleep(0.1)
    watts, source, samples = await meter.stop()
    assert (source, watts) == ("nvml_power_samples", 250.0) and samples >= 2


def test_shared_prefix_blocks_get_the_same_token_ids() -> None:
    a = prompt_token_ids(600, (5, 9), 256, request_seed=1)
    b = prompt_token_ids(700, (5, 9, 11), 256, request_seed=2)
    c = prompt_token_ids(600, (6,), 256, request_seed=3)
    assert len(a) == 600 and len(b) == 700
    assert a[:512] == b[:512] and a[512:] != b[512:600]
    assert a[:256] != c[:256]



def test_prompt_ids_stay_below_the_backends_vocabulary_bound() -> None:
    """A model with a small vocabulary (the tiny test Llama's tokenizer has 744 tokens) refuses larger ids ("Token id
    ... is out of vocabulary", every request failed): ``EngineBackend(vocab_high=...)`` bounds the ids it sends."""
    ids = prompt_token_ids(1500, (5,), 256, request_seed=1, vocab_high=700)
    assert len(ids) == 1500 and max(ids) < 700 and min(ids) >= engine_backend.VOCAB_LOW
    assert max(prompt_token_ids(1500, (), 256, request_seed=1)) >= 700  # the default stays the Llama-wide bound
    assert engine_backend.EngineBackend(object(), vocab_high=700).vocab_high == 700

@pytest.mark.slow
async def test_engine_sweep_against_emulator_with_cache_via_cache_manager(
        start_inprocess, tmp_path, profiler, lmcache_server, monkeypatch) -> None:  # noqa: F811
    emu = EngineEmulator(EmulatorConfig(host="127.0.0.1", port=0, profile="llama3-8b@H100-80GB", time_scale=5.0))
    await emu.start()
    fake = FakeNvml([("H100-80GB", False)])
    fake.nvmlInit()
    monkeypatch.setattr(engine_backend, "load_nvml", lambda: fake)
    try:
        cm = await start_inprocess(CacheManagerSettings, build_cache_manager, data_dir=tmp_path / "cm",
                                   lmcache_restart_command=lmcache_server.restart_command())
        async with grpc.aio.insecure_channel(cm.address) as channel:
            cm_stub = cache_manager_pb2_grpc.CacheManagerServiceStub(channel)
            await cm_stub.RegisterCacheServer(cache_manager_pb2.RegisterCacheServerRequest(
                server=cache_manager_pb2.CacheServer(id="s1", pool="p1", url=lmcache_server.http_url)))
            size = lmcache_server.status()["storage_manager"]["l1_manager"]["memory_total_bytes"]
            target = size // 2
            stub = await profiler(import_published=False, cache_manager_addr=cm.address, nvml_power="nvml")
            spec = profiler_pb2.SweepSpec(
                backend=profiler_pb2.SWEEP_BACKEND_ENGINE, engine_url=emu.url, engine_modelled_s_per_wall_s=5.0,
                workload="multiturn", request_rates_per_s=[2.0, 4.0], point_duration_s=4.0, seed=5,
                slo=common_pb2.Slo(ttft_s=1.0, tpot_s=0.1, attainment_fraction=0.9), cache_server_id="s1",
                configs=[config(model="meta-llama/Meta-Llama-3-8B-Instruct", cache_dram_bytes=target)],
                method=common_pb2.ProfileMethod(warmup_s=1.0, cache_prefill_requests=4, power_interval_s=0.2,
                                                stop_rule=common_pb2.LADDER_STOP_RULE_FULL_LADDER))
            sweep = (await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))).sweep
            final = await wait_state(stub, sweep.id, {profiler_pb2.SWEEP_STATE_SUCCEEDED, profiler_pb2.SWEEP_STATE_FAILED,
                                                      profiler_pb2.SWEEP_STATE_CANCELLED}, timeout_s=400)
            assert final.state == profiler_pb2.SWEEP_STATE_SUCCEEDED, final.error
            assert lmcache_server.status()["storage_manager"]["l1_manager"]["memory_total_bytes"] == target
            key, version = final.profile_ids[0].rsplit("@", 1)
            profile = (await stub.GetProfile(profiler_pb2.GetProfileRequest(config_key=key))).profile
            assert profile.source == common_pb2.PROFILE_SOURCE_MEASURED and f"dram={target}" in key
            assert "cache set through the cache-manager" in profile.note and emu.url in profile.note
            assert len(profile.points) == 2
            for point in profile.points:
                assert point.requests == int(point.request_rate_per_s * 4.0) and point.failed_requests == 0
                assert 0 < point.ttft_p50_s and 0 < point.tpot_p50_s
                assert point.power_source == "nvml_power_samples" and point.power_w == 60.0
                assert 0 <= point.cache_hit_fraction <= 1 and point.mean_batch_size > 0
            # bad engine URL of the same spec: FAILED_PRECONDITION naming the field, nothing stored
            spec.engine_url = "http://127.0.0.1:9"
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "spec.engine_url" in err.value.details()
            assert len((await stub.ListSweeps(profiler_pb2.ListSweepsRequest())).sweeps) == 1
    finally:
        await emu.stop()


async def test_engine_per_configuration_started_by_the_profiler(profiler) -> None:
    """Without an engine URL the profiler starts an emulated engine per configuration (its hardware's profile)."""
    stub = await profiler(import_published=False, engine_launcher="emulator", nvml_power="off")
    spec = profiler_pb2.SweepSpec(
        backend=profiler_pb2.SWEEP_BACKEND_ENGINE, engine_modelled_s_per_wall_s=5.0, workload="sharegpt",
        request_rates_per_s=[2.0], point_duration_s=5.0, seed=2,
        slo=common_pb2.Slo(ttft_s=0.2, tpot_s=0.08, attainment_fraction=0.9),
        configs=[config(), config(hardware="A100-80GB")],
        method=common_pb2.ProfileMethod(warmup_s=1.0))
    sweep = (await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))).sweep
    final = await wait_state(stub, sweep.id, {profiler_pb2.SWEEP_STATE_SUCCEEDED, profiler_pb2.SWEEP_STATE_FAILED},
                             timeout_s=120)
    assert final.state == profiler_pb2.SWEEP_STATE_SUCCEEDED, final.error
    profiles = {}
    for pid in final.profile_ids:
        key, version = pid.rsplit("@", 1)
        profiles[key] = (await stub.GetProfile(profiler_pb2.GetProfileRequest(config_key=key))).profile
    h100 = profiles["llama3-8b@H100-80GB|workload=sharegpt"]
    a100 = profiles["llama3-8b@A100-80GB|workload=sharegpt"]
    assert "--profile llama3-8b@H100-80GB" in h100.note and "--profile llama3-8b@A100-80GB" in a100.note
    for profile, name in ((h100, "llama3-8b@H100-80GB"), (a100, "llama3-8b@A100-80GB")):
        point = profile.points[0]
        assert point.requests == 10 and point.failed_requests == 0 and point.tpot_mean_s > 0
        # no NVML: the power is the emulator's modelled energy counter over the window, between the profile's
        # idle and maximum draw, and the point says so
        engine_profile = load_profile(name)
        assert point.power_source == "engine_metric"
        assert engine_profile.idle_w < point.power_w < engine_profile.max_w
        assert point.energy_per_request_kwh > 0 and point.energy_per_output_token_j > 0
        url = re.search(r"engine (http://127\.0\.0\.1:\d+)", profile.note).group(1)
        with pytest.raises(httpx.ConnectError):  # the profiler stopped the engine after its ladder
            httpx.get(f"{url}/health", timeout=2)
    assert h100.points[0].power_w != a100.points[0].power_w
    # without a launcher an engine sweep needs its URL
    other = await profiler(import_published=False)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await other.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "spec.engine_url" in err.value.details()


def test_vllm_engine_started_by_the_profiler_runs_on_the_named_device_or_inherits_it() -> None:
    """--engine-cuda-visible-devices is the started vLLM's CUDA_VISIBLE_DEVICES; left empty (the default) the engine
    inherits the profiler's own instead of getting an empty value, with which CUDA shows it no GPU."""
    from greenserve.profiler.settings_view import EngineSettingsView

    spec = profiler_pb2.SweepSpec(backend=profiler_pb2.SWEEP_BACKEND_ENGINE, workload="sharegpt", configs=[config()])
    for device, expected in (("", None), ("MIG-4c60d78c-506f", "MIG-4c60d78c-506f"), ("GPU-1", "GPU-1")):
        backend = engine_backend.EngineBackend(EngineSettingsView(engine_launcher="vllm",
                                                                  engine_cuda_visible_devices=device))
        cmd = backend._launcher(spec).command(backend._engine_spec(spec, config(), 8200))
        assert cmd.argv[:3] == ("vllm", "serve", "llama3-8b")
        assert cmd.env.get("CUDA_VISIBLE_DEVICES") == expected


def test_engine_modelled_energy_metric_window() -> None:
    text = "# TYPE greenserve:engine_energy_joules counter\ngreenserve:engine_energy_joules_total{engine=\"0\"} {v}\n"
    win = engine_metrics.window(engine_metrics.parse(text.replace("{v}", "1000")),
                                engine_metrics.parse(text.replace("{v}", "4500")))
    assert win.energy_j == pytest.approx(3500.0)


async def test_mig_configuration_takes_its_share_from_the_gpu_partitioner(profiler, monkeypatch) -> None:
    """A MIG configuration's power is the instance's energy split from the gpu-partitioner, not the whole GPU."""
    from greenserve.v1 import gpu_partitioner_pb2, gpu_partitioner_pb2_grpc

    mig = "MIG-11111111-2222-3333-4444-555555555555"
    calls = []

    class FakePartitioner(gpu_partitioner_pb2_grpc.GpuPartitionerServiceServicer):
        async def GetEnergy(self, request, context):
            calls.append(1)
            gpu = gpu_partitioner_pb2.GpuEnergy(gpu_uuid="GPU-1", energy_j=1e6)
            gpu.instances.add(mig_uuid=mig, energy_j=100.0 * len(calls), power_w=0.0)  # +100 J per call
            return gpu_partitioner_pb2.GetEnergyResponse(gpus=[gpu])

    server = grpc.aio.server()
    gpu_partitioner_pb2_grpc.add_GpuPartitionerServiceServicer_to_server(FakePartitioner(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    fake = FakeNvml([("H100-80GB", True)])
    fake.nvmlInit()
    monkeypatch.setattr(engine_backend, "load_nvml", lambda: fake)
    emu = EngineEmulator(EmulatorConfig(host="127.0.0.1", port=0, profile="llama3-8b@H100-80GB-MIG-3g.40gb",
                                        time_scale=5.0))
    await emu.start()
    try:
        stub = await profiler(import_published=False, gpu_partitioner_addr=f"127.0.0.1:{port}",
                              engine_cuda_visible_devices=mig)
        spec = profiler_pb2.SweepSpec(
            backend=profiler_pb2.SWEEP_BACKEND_ENGINE, engine_url=emu.url, engine_modelled_s_per_wall_s=5.0,
            workload="sharegpt", request_rates_per_s=[2.0], point_duration_s=3.0,
            slo=common_pb2.Slo(ttft_s=1.0, tpot_s=0.1, attainment_fraction=0.9),
            configs=[config(model="meta-llama/Meta-Llama-3-8B-Instruct", mig_profile="3g.40gb")],
            method=common_pb2.ProfileMethod(warmup_s=0.5))
        sweep = (await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))).sweep
        final = await wait_state(stub, sweep.id, {profiler_pb2.SWEEP_STATE_SUCCEEDED, profiler_pb2.SWEEP_STATE_FAILED},
                                 timeout_s=120)
        assert final.state == profiler_pb2.SWEEP_STATE_SUCCEEDED, final.error
        point = (await stub.GetProfile(profiler_pb2.GetProfileRequest(
            config_key=final.profile_ids[0].rsplit("@", 1)[0]))).profile.points[0]
        assert point.power_source == "gpu_partitioner_mig_split" and len(calls) == 2
        assert 0 < point.power_w < 100.0 / 0.05 and point.power_w != 60.0  # 100 J over the window, not NVML's 60 W
    finally:
        await emu.stop()
        await server.stop(0)


async def test_points_of_a_ladder_do_not_reuse_each_others_prompts() -> None:
    """Requests of a workload without shared prefix blocks are unique across the ladder: the engine keeps its
    prefix cache from point to point (vLLM's automatic prefix caching), so a point that re-sent the previous
    point's prompts would measure cache hits the workload does not have (the simulator replays each point on an
    empty cache)."""
    from greenserve.profiler.method import resolve
    from greenserve.profiler.settings_view import EngineSettingsView

    emu = EngineEmulator(EmulatorConfig(host="127.0.0.1", port=0, profile="llama3-8b@H100-80GB", time_scale=20.0))
    await emu.start()
    backend = engine_backend.EngineBackend(EngineSettingsView(nvml_power="off"))
    try:
        spec = profiler_pb2.SweepSpec(
            backend=profiler_pb2.SWEEP_BACKEND_ENGINE, engine_url=emu.url, engine_modelled_s_per_wall_s=20.0,
            workload="longbench", request_rates_per_s=[1.0, 2.0], point_duration_s=4.0, seed=7,
            slo=common_pb2.Slo(ttft_s=15.0, tpot_s=0.15, attainment_fraction=0.9),
            configs=[config(model="llama3-8b")],
            method=common_pb2.ProfileMethod(warmup_s=1.0, stop_rule=common_pb2.LADDER_STOP_RULE_FULL_LADDER))
        await backend.prepare(spec)
        method = resolve(spec)
        hits = []
        for rate in spec.request_rates_per_s:
            point = await backend.measure(spec, spec.configs[0], rate, method)
            assert point.requests == 4 * rate and point.failed_requests == 0
            hits.append(point.cache_hit_fraction)
        assert hits == [0.0, 0.0]  # before: the second point hit the first point's prompts (~40 % of its tokens)
    finally:
        await backend.close()
        await emu.stop()


def test_completion_stream_reads_first_token_and_usage_across_any_split() -> None:
    """The client reads the streamed body as bytes: the first token and the usage chunk are found wherever the
    network splits the stream; without a usage chunk the token events are counted."""
    import json as _json

    def event(obj) -> bytes:
        return b"data: " + _json.dumps(obj).encode() + b"\n\n"

    tokens = [event({"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}], "usage": None})
              for i in range(5)]
    usage = event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}})
    with_usage = b"".join(tokens) + usage + b"data: [DONE]\n\n"
    without = b"".join(tokens) + b"data: [DONE]\n\n"
    for body, expected in ((with_usage, 5), (without, 5)):
        for cut in range(1, len(body), 7):
            for size in (1, 13, len(body)):
                stream = engine_backend.CompletionStream()
                parts = [body[:cut]] + [body[i:i + size] for i in range(cut, len(body), size)]
                first_at = None
                for i, part in enumerate(parts):
                    stream.feed(part)
                    if first_at is None and stream.first_s is not None:
                        first_at = sum(len(p) for p in parts[:i + 1])
                assert stream.tokens() == expected, (cut, size)
                assert first_at is not None and first_at >= len(tokens[0])  # not before the first event was whole
    empty = engine_backend.CompletionStream()
    empty.feed(b"data: [DONE]\n\n")
    assert empty.first_s is None and empty.tokens() == 0


def test_one_token_requests_are_taken_out_of_the_per_request_tpot_mean() -> None:
    """vLLM observes a per-request TPOT of 0 for a request of one output token; 10 such among 50 requests pulled the
    engine-side mean from 20 ms to 16 ms. The point passes how many finished (the client knows each one's tokens)."""
    page = ("# TYPE vllm:request_time_per_output_token_seconds histogram\n"
            'vllm:request_time_per_output_token_seconds_sum{{model_name="m"}} {s}\n'
            'vllm:request_time_per_output_token_seconds_count{{model_name="m"}} {c}\n')
    before, after = engine_metrics.parse(page.format(s=1.0, c=100)), engine_metrics.parse(page.format(s=1.8, c=150))
    assert engine_metrics.window(before, after).tpot_mean_s == pytest.approx(0.8 / 50)
    assert engine_metrics.window(before, after, single_token_requests=10).tpot_mean_s == pytest.approx(0.8 / 40)
    # the per-token histograms (older vLLM) never saw a one-token request: nothing is taken out of them
    old = page.replace("request_time_per_output_token", "time_per_output_token")
    win = engine_metrics.window(engine_metrics.parse(old.format(s=1.0, c=100)),
                                engine_metrics.parse(old.format(s=1.8, c=150)), single_token_requests=10)
    assert win.tpot_mean_s == pytest.approx(0.8 / 50)
    # every request of one token: no TPOT at all, not a division by zero
    assert engine_metrics.window(engine_metrics.parse(page.format(s=1.0, c=100)),
                                 engine_metrics.parse(page.format(s=1.0, c=110)),
                                 single_token_requests=10).tpot_mean_s is None
