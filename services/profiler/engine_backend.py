"""Engine backend: a sweep point measured on a running engine through its OpenAI-compatible API.

Per point (GreenLLM Sec. V-A, GreenCache Sec. 5.2):

1. the configuration is put in force: with ``spec.engine_url`` the engine there must already serve the
   configuration's model (``prepare`` refuses one it does not serve); without it, the profiler starts one engine
   per configuration (``--engine-launcher``: ``greenserve-engine-sim`` with the configuration's simulator
   profile, or ``vllm serve`` with its model, flags as the gpu-partitioner's launcher writes them) and stops it
   after the configuration's ladder; then its LMCache sizes through the cache-manager's ``ResizeCache``;
2. open-loop arrivals at the rate (Poisson, or the trace's inter-arrivals rescaled): cache pre-fill and
   warm-up requests first (not measured), then the measured requests; every request is a streamed
   ``/v1/completions`` call with the workload's prompt as token ids (shared prefix blocks get the same ids,
   so prefix reuse is real; the rest is unique to the request, the point and the backend instance, so a point
   never hits the engine's cache with an earlier point's prompts) and ``max_tokens`` = its output length with
   ``ignore_eos``;
3. per request, client side: TTFT (first streamed token), TPOT ((end - TTFT) / (tokens - 1)), end-to-end;
4. ``/metrics`` is scraped when the window opens and closes (prefix-cache and LMCache hits, the engine's own
   latency histograms for the agreement figure) and every sampling interval (batch size = running requests);
5. power: NVML (energy counter, else power samples every ``power_interval_s``) when it initialises, else the
   engine's modelled power metric, else none; for a MIG configuration whose engine runs on the MIG device named
   by ``--engine-cuda-visible-devices``, the instance's share from the gpu-partitioner's energy split
   (``GetEnergy``) replaces the whole GPU's; the point's ``power_source`` says which.

``engine_modelled_s_per_wall_s`` s > 1 is for emulated engines running s times faster than the engine they model:
arrivals are sent s times faster and client-side latencies multiplied by s, so points are in modelled seconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import secrets
import time
from typing import Any

import aiohttp
import httpx
import numpy as np

from greenserve.common.client import ChannelConfig, create_channel
from greenserve.common.errors import FailedPrecondition, InvalidArgument
from greenserve.profiler import engine_metrics, mode_config, workload_catalog
from greenserve.profiler.keys import config_key, simulator_profile, simulator_profile_name
from greenserve.profiler.method import Method
from greenserve.profiler.points import PointExtras, RequestSamples, summarize
from greenserve.profiler.power import NvmlPowerMeter, load_nvml
from greenserve.v1 import cache_manager_pb2, cache_manager_pb2_grpc, common_pb2, profiler_pb2

log = logging.getLogger("greenserve.profiler.engine")

PROBE_TIMEOUT_S = 3.0
RESIZE_TIMEOUT_S = 600.0  # a size change is a controlled LMCache restart; the cache-manager bounds it itself
VOCAB_LOW, VOCAB_HIGH = 100, 30_000  # token ids every Llama tokenizer (32k or 128k vocab) accepts


def prompt_token_ids(prompt_tokens: int, block_hashes: tuple[int, ...], block_tokens: int, request_seed: int,
                     point_seed: int = 0, vocab_high: int = VOCAB_HIGH) -> list[int]:
    """Token ids of a prompt: each shared prefix block is the same ids wherever it appears (prefix reuse is real
    on the engine); the rest is unique to the request (``request_seed``) within its point (``point_seed``)."""
    ids: list[int] = []
    for block in block_hashes:
        if len(ids) + block_tokens > prompt_tokens:
            break
        rng = np.random.default_rng([abs(int(block)), 7 if block >= 0 else 11])
        ids.extend(rng.integers(VOCAB_LOW, vocab_high, block_tokens).tolist())
    rest = prompt_tokens - len(ids)
    if rest > 0:
        rng = np.random.default_rng([request_seed, point_seed, 13])
        ids.extend(rng.integers(VOCAB_LOW, vocab_high, rest).tolist())
    return ids


class CompletionStream:
    """What the profiler reads of one streamed ``/v1/completions`` answer, fed the body's bytes as they arrive:
    when the first generated token reached the client, and the token count (the usage chunk, vLLM's
    ``include_usage``; else the events after the first). Only the bytes up to the first token are parsed; after
    it, only the stream's last few KB are kept, so the client's parsing does not compete with the engine for the
    CPU at high rates (one event per token)."""

    EVENT = b"data: {"
    TAIL_BYTES = 8192

    def __init__(self) -> None:
        self.first_s: float | None = None
        self._head = b""
        self._tail = b""
        self._events = 0

    def feed(self, data: bytes) -> None:
        if self.first_s is None:
            self._head += data
            data = self._first_token()
            if self.first_s is None:
                return
        if not data:
            return
        joined = self._tail[-len(self.EVENT) + 1:] + data if self._tail else data
        self._events += joined.count(self.EVENT)
        self._tail = (self._tail + data)[-self.TAIL_BYTES:]

    def _first_token(self) -> bytes:
        head, start = self._head, 0
        while True:
            end = head.find(b"\n\n", start)
            if end < 0:
                return b""
            event = head[start:end].strip()
            start = end + 2
            if not event.startswith(b"data: ") or event == b"data: [DONE]":
                continue
            choices = json.loads(event[6:]).get("choices") or []
            if choices and choices[0].get("text"):
                self.first_s = time.monotonic()
                self._head = b""
                return head[start:]

    def tokens(self) -> int:
        """Generated tokens: the last usage chunk's ``completion_tokens``, else the token events counted."""
        for event in reversed(self._tail.split(b"\n\n")):
            event = event.strip()
            if b'"completion_tokens"' in event and event.startswith(b"data: {"):
                value = (json.loads(event[6:]).get("usage") or {}).get("completion_tokens")
                if value is not None:
                    return int(value)
        if self.first_s is None:
            return 0
        return self._events + 1


class EngineBackend:
    """The SWEEP_BACKEND_ENGINE measurements (one instance per sweep run)."""

    source = common_pb2.PROFILE_SOURCE_MEASURED
    name = "engine"

    def __init__(self, settings: Any, *, nvml: Any | None = None, vocab_high: int = VOCAB_HIGH) -> None:
        self.settings = settings
        #: prompt token ids are drawn below this (a model with a smaller vocabulary, e.g. the tiny test Llama's
        #: 1,024, refuses larger ids: "Token id ... is out of vocabulary")
        self.vocab_high = vocab_high
        self._client: httpx.AsyncClient | None = None
        self._session: aiohttp.ClientSession | None = None
        self._nvml = nvml
        self._nvml_note = ""
        self._served: list[str] = []
        self._url = ""  # the engine the profiler started for the configuration in measurement
        self._supervisor: Any = None
        self._launch_note = ""
        # the engine keeps its prefix cache between points (and across a restart of the profiler): a point's
        # unshared prompt tokens are salted with this instance and the point, so they never repeat earlier ones
        self._prompt_nonce = secrets.randbits(63)
        #: the last point's /metrics window and its means (the bench compares them with client-side figures)
        self.last_window: engine_metrics.WindowMetrics | None = None
        #: CPU seconds this process used per wall second during the last window (> ~0.8: the client may be the
        #: bottleneck and latencies are overstated)
        self.last_client_cpu_fraction: float = math.nan
        #: the last point's per-request client-side timings (a caller pooling repeated points takes them)
        self.last_samples: RequestSamples | None = None

    # -- plumbing -----------------------------------------------------------------------------------

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
            self._client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None, connect=PROBE_TIMEOUT_S))
        return self._client

    def _stream_session(self) -> aiohttp.ClientSession:
        """The pooled client of the streamed completions: aiohttp's (C HTTP parser) costs a fraction of httpx's
        CPU per streamed token, and the client shares the host with the engine it measures (a client late to
        read a token overstates TTFT)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=PROBE_TIMEOUT_S))
        return self._session

    def _power_meter(self, interval_s: float) -> NvmlPowerMeter | None:
        mode = getattr(self.settings, "nvml_power", "auto")
        if mode == "off":
            return None
        if self._nvml is None:
            try:
                self._nvml = load_nvml()
            except Exception as exc:  # noqa: BLE001 - pynvml.NVMLError_LibraryNotFound / DriverNotLoaded, ImportError
                if mode == "nvml":
                    raise FailedPrecondition(f"NVML did not initialise: {exc}", field="nvml_power") from None
                self._nvml_note = f"NVML unavailable ({type(exc).__name__})"
                self._nvml = False
        if self._nvml is False:
            return None
        return NvmlPowerMeter(self._nvml, getattr(self.settings, "nvml_device_index", 0), interval_s)

    async def _cache_manager(self) -> tuple[Any, Any]:
        s = self.settings
        channel = create_channel(ChannelConfig(address=s.cache_manager_addr, token=s.token(), tls_ca=s.tls_ca))
        return channel, cache_manager_pb2_grpc.CacheManagerServiceStub(channel)

    async def _mig_energy_j(self, mig_uuid: str) -> float | None:
        """Energy the gpu-partitioner attributes to a MIG instance (its split of the GPU's NVML counter), joules;
        None when it is not reachable or does not know the instance."""
        from greenserve.v1 import gpu_partitioner_pb2, gpu_partitioner_pb2_grpc

        s = self.settings
        addr = getattr(s, "gpu_partitioner_addr", "")
        if not addr:
            return None
        channel = create_channel(ChannelConfig(address=addr, token=s.token(), tls_ca=s.tls_ca))
        try:
            reply = await gpu_partitioner_pb2_grpc.GpuPartitionerServiceStub(channel).GetEnergy(
                gpu_partitioner_pb2.GetEnergyRequest(), timeout=PROBE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - grpc.aio.AioRpcError: gpu-partitioner down or not there
            log.warning("gpu-partitioner energy unavailable", extra={"error": str(exc)})
            return None
        finally:
            await channel.close()
        for gpu in reply.gpus:
            for instance in gpu.instances:
                if instance.mig_uuid == mig_uuid:
                    return instance.energy_j
        return None

    def _served_model(self, config: common_pb2.ProfileConfig) -> str | None:
        if config.model in self._served:
            return config.model
        try:
            served = simulator_profile(config).model
        except ValueError:
            return None
        return served if served in self._served else None

    # -- Backend protocol ---------------------------------------------------------------------------

    def _launcher(self, spec: profiler_pb2.SweepSpec) -> Any:
        from greenserve.common.engine_launch import make_launcher

        s = self.settings
        return make_launcher(s.engine_launcher, time_scale=spec.engine_modelled_s_per_wall_s or 1.0,
                             gpu_memory_utilization=s.engine_gpu_memory_utilization)

    def _engine_spec(self, spec: profiler_pb2.SweepSpec, config: common_pb2.ProfileConfig, port: int) -> Any:
        from greenserve.common.engine_launch import EngineSpec

        hardware = config.hardware + (f"-MIG-{config.mig_profile}" if config.mig_profile else "")
        try:
            short = simulator_profile_name(config).split("@", 1)[0]
        except ValueError:
            short = config.model
        mode: dict[str, Any] = {}
        if mode_config.is_mode_config(config):  # the launcher writes the mode's flags (emulator --mode, vLLM's)
            d = config.draft
            draft_sim = mode_config.draft_simulator_model(config) if config.HasField("draft") else ""
            mode = {"serving_mode": config.serving_mode, "draft_model": d.model,
                    "draft_simulator_model": draft_sim, "num_speculative_tokens": d.num_speculative_tokens or 3,
                    "acceptance_fraction": d.acceptance_fraction, "old_hardware": config.old_hardware,
                    "link_bandwidth_bytes_per_s": config.link_bandwidth_bytes_per_s}
        return EngineSpec(engine_id="profiler-" + short, pool="profiler", served_model=config.model,
                          variant=config.model_variant, model=config.model, simulator_model=short, vllm_args=(),
                          gpu_uuid="", mig_uuid=self.settings.engine_cuda_visible_devices, hardware=hardware,
                          host="127.0.0.1", port=port, **mode)

    async def _launch(self, spec: profiler_pb2.SweepSpec, config: common_pb2.ProfileConfig) -> str:
        """Stop the engine of the previous configuration and start this one's; its URL."""
        from greenserve.common.engine_launch import EngineSupervisor, parse_port_range

        if self._supervisor is None:
            self._supervisor = EngineSupervisor(self._launcher(spec), port_range=parse_port_range(
                self.settings.engine_port_range), log_dir=self.settings.engine_log_dir)
        await self._supervisor.stop_all()
        engine = await self._supervisor.start(self._engine_spec(spec, config, self._supervisor.next_port()))
        await self._supervisor.wait_healthy(engine, self.settings.engine_start_timeout_s)
        self._launch_note = "engine started by the profiler: " + " ".join(engine.command.argv)
        if engine.command.note:
            self._launch_note += f" ({engine.command.note})"
        self._url, self._served = engine.spec.url, [config.model]
        return self._url

    def _base(self, spec: profiler_pb2.SweepSpec) -> str:
        return (spec.engine_url or self._url).rstrip("/")

    async def prepare(self, spec: profiler_pb2.SweepSpec) -> None:
        """The engine answers and serves every configuration's model (or the profiler can start one per
        configuration); the cache server is registered."""
        if not spec.engine_url:
            if self.settings.engine_launcher == "none":
                raise FailedPrecondition("required: this profiler starts no engines (--engine-launcher none)",
                                         field="spec.engine_url")
            launcher = self._launcher(spec)
            for i, config in enumerate(spec.configs):
                if self.settings.engine_launcher == "vllm" and config.HasField("draft") and not config.draft.model:
                    raise InvalidArgument(f"spec.configs[{i}].draft.model", "required by the vLLM launcher: the "
                                          "draft vLLM loads (Hugging Face id or path)")
                try:
                    launcher.command(self._engine_spec(spec, config, 0))
                except ValueError as exc:
                    if mode_config.is_mode_config(config):  # e.g. vLLM's DPD / DSD: a second engine to start
                        raise FailedPrecondition(f"the {self.settings.engine_launcher} launcher cannot start this "
                                                 f"mode: {exc}", field=f"spec.configs[{i}].serving_mode") from None
                    raise InvalidArgument(f"spec.configs[{i}]", str(exc)) from None
            await self._check_cache_server(spec)
            return
        base = spec.engine_url.rstrip("/")
        try:
            reply = await self._http().get(f"{base}/v1/models", timeout=PROBE_TIMEOUT_S)
            reply.raise_for_status()
            payload = reply.json()
            if not isinstance(payload, dict):  # else .get is an AttributeError: INTERNAL instead of this refusal
                raise ValueError(f"not a JSON object: {str(payload)[:100]}")
            self._served = [m["id"] for m in payload.get("data", [])]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise FailedPrecondition(f"engine {spec.engine_url} did not answer GET /v1/models: "
                                     f"{type(exc).__name__}: {exc}", field="spec.engine_url") from None
        for i, config in enumerate(spec.configs):
            if self._served_model(config) is None:
                raise FailedPrecondition(
                    f"the engine serves {self._served}, not {config.model!r}; restarting engines per configuration "
                    "is not done by the profiler (start one engine per model)", field=f"spec.configs[{i}].model")
        await self._check_cache_server(spec)

    async def _check_cache_server(self, spec: profiler_pb2.SweepSpec) -> None:
        if spec.cache_server_id:
            channel, stub = await self._cache_manager()
            try:
                servers = await stub.ListCacheServers(cache_manager_pb2.ListCacheServersRequest(),
                                                      timeout=PROBE_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - grpc.aio.AioRpcError: cache-manager down
                raise FailedPrecondition(f"cache-manager at {self.settings.cache_manager_addr} did not answer: {exc}",
                                         field="spec.cache_server_id") from None
            finally:
                await channel.close()
            if spec.cache_server_id not in {s.id for s in servers.servers}:
                raise FailedPrecondition(f"cache-manager has no server {spec.cache_server_id!r}",
                                         field="spec.cache_server_id")

    async def apply_config(self, spec: profiler_pb2.SweepSpec, config: common_pb2.ProfileConfig) -> str:
        notes = []
        if not spec.engine_url:
            await self._launch(spec, config)
            notes.append(self._launch_note)
        elif not self._served:
            await self.prepare(spec)
        if not (config.cache_dram_bytes or config.cache_disk_bytes) or not spec.cache_server_id:
            return "; ".join(notes)
        channel, stub = await self._cache_manager()
        try:
            request = cache_manager_pb2.ResizeCacheRequest(server_id=spec.cache_server_id,
                                                           dram_bytes=config.cache_dram_bytes)
            if config.cache_disk_bytes:
                request.disk_bytes = config.cache_disk_bytes
            reply = await stub.ResizeCache(request, timeout=RESIZE_TIMEOUT_S)
        finally:
            await channel.close()
        if not reply.result.applied:
            raise RuntimeError(f"cache-manager could not resize {spec.cache_server_id}: {reply.result.detail}")
        notes.append(f"cache set through the cache-manager: server {spec.cache_server_id} DRAM "
                     f"{reply.result.dram_bytes} B, disk {reply.result.disk_bytes} B")
        return "; ".join(notes)

    def provenance(self, spec: profiler_pb2.SweepSpec, config: common_pb2.ProfileConfig) -> tuple[str, str]:
        scale = spec.engine_modelled_s_per_wall_s or 1.0
        note = f"engine {spec.engine_url or self._url} (model {self._served_model(config) or config.model})"
        if scale != 1.0:
            note += f", time scale {scale:g} (latencies in modelled seconds)"
        if self._nvml_note:
            note += f"; {self._nvml_note}"
        return note, ""

    async def close(self) -> None:
        if self._supervisor is not None:
            await self._supervisor.stop_all()
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- one point ----------------------------------------------------------------------------------

    async def _scrape(self, base: str) -> engine_metrics.Snapshot | None:
        try:
            reply = await self._http().get(f"{base}/metrics", timeout=PROBE_TIMEOUT_S)
            reply.raise_for_status()
            return engine_metrics.parse(reply.text)
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("metrics scrape failed", extra={"url": base, "error": str(exc)})
            return None

    async def _send(self, base: str, model: str, ids: list[int], max_tokens: int, timeout_s: float,
                    scale: float) -> tuple[float, float, float, int]:
        """(ttft, tpot, e2e, generated tokens) in modelled seconds; NaNs when the request failed."""
        body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
                "temperature": 0.0, "stream_options": {"include_usage": True}}
        t0 = time.monotonic()
        stream = CompletionStream()
        try:
            async with asyncio.timeout(timeout_s):
                async with self._stream_session().post(f"{base}/v1/completions", json=body) as reply:
                    if reply.status != 200:
                        await reply.read()
                        return math.nan, math.nan, math.nan, 0
                    async for data in reply.content.iter_any():
                        stream.feed(data)
            end = time.monotonic()
            first = stream.first_s
            n = stream.tokens()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return math.nan, math.nan, math.nan, 0
        if first is None:
            return math.nan, math.nan, math.nan, 0
        ttft, e2e = (first - t0) * scale, (end - t0) * scale
        tpot = (e2e - ttft) / (n - 1) if n > 1 else math.nan
        return ttft, tpot, e2e, n

    async def measure(self, spec: profiler_pb2.SweepSpec, config: common_pb2.ProfileConfig, rate_per_s: float,
                      method: Method) -> common_pb2.ProfilePoint:
        if not self._served:
            await self.apply_config(spec, config)
        base = self._base(spec)
        model = self._served_model(config) or config.model
        scale = spec.engine_modelled_s_per_wall_s or 1.0
        warmup = method.warmup_requests(rate_per_s) + method.prefill_requests(rate_per_s, config)
        pw = workload_catalog.build(spec.workload, rate_per_s, warmup=warmup,
                                    measured=method.measured_requests(rate_per_s), seed=spec.seed,
                                    arrival=method.arrival)
        wl = pw.workload
        hashes = wl.block_hashes or [()] * len(wl)
        point_id = f"{self._prompt_nonce}|{spec.workload}|{config_key(config)}|{rate_per_s!r}".encode()
        point_seed = int.from_bytes(hashlib.blake2b(point_id, digest_size=8).digest(), "big")
        prompts = [prompt_token_ids(p, h, wl.hash_block_tokens, spec.seed * 1_000_003 + i, point_seed, self.vocab_high)
                   for i, (p, h) in enumerate(zip(wl.prompt_tokens, hashes))]
        timeout_wall_s = method.request_timeout_s / scale
        meter = self._power_meter(method.power_interval_s / scale)
        device = getattr(self.settings, "engine_cuda_visible_devices", "")
        mig_uuid = device if config.mig_profile and device.startswith("MIG-") else ""
        mig_energy0: float | None = None
        running: list[float] = []
        before: engine_metrics.Snapshot | None = None
        sampler: asyncio.Task[None] | None = None

        async def sample_running() -> None:
            while True:
                snap = await self._scrape(base)
                value = snap.gauge("running") if snap else None
                if value is not None:
                    running.append(value)
                await asyncio.sleep(max(method.power_interval_s / scale, 0.1))

        tasks: list[asyncio.Task[tuple[float, float, float, int]]] = []
        t_origin = time.monotonic()
        a0 = wl.arrival_s[0]
        window_start = cpu_start = 0.0
        try:
            for i, arrival in enumerate(wl.arrival_s):
                delay = t_origin + (arrival - a0) / scale - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if i == pw.warmup:
                    before = await self._scrape(base)
                    window_start = time.monotonic()
                    cpu_start = time.process_time()
                    if meter is not None:
                        await meter.start()
                    if mig_uuid:
                        mig_energy0 = await self._mig_energy_j(mig_uuid)
                    sampler = asyncio.get_running_loop().create_task(sample_running())
                tasks.append(asyncio.get_running_loop().create_task(
                    self._send(base, model, prompts[i], wl.output_tokens[i], timeout_wall_s, scale)))
            results = await asyncio.gather(*tasks[pw.warmup:])
            wall_s = time.monotonic() - window_start
            self.last_client_cpu_fraction = (time.process_time() - cpu_start) / wall_s if wall_s > 0 else math.nan
        except BaseException:
            for t in tasks:
                t.cancel()
            if sampler is not None:
                sampler.cancel()
            if meter is not None:
                await meter.stop()
            raise
        if sampler is not None:
            sampler.cancel()
        power_w, power_source = math.nan, ""
        if meter is not None:
            power_w, power_source, _ = await meter.stop()
        if mig_uuid and mig_energy0 is not None:
            mig_energy1 = await self._mig_energy_j(mig_uuid)
            if mig_energy1 is not None and mig_energy1 > mig_energy0 and wall_s > 0:
                # the slice's share (gpu-partitioner's split of the GPU counter), not the whole GPU
                power_w, power_source = (mig_energy1 - mig_energy0) / wall_s, "gpu_partitioner_mig_split"
            elif power_source:
                power_source += "_whole_gpu"  # no split for the window: the whole GPU's power, said so
        after = await self._scrape(base)
        await asyncio.gather(*tasks[: pw.warmup], return_exceptions=True)
        single = sum(1 for r in results if r[3] == 1)  # one output token: vLLM's per-request TPOT of 0
        win = engine_metrics.window(before, after, single) if before and after else engine_metrics.WindowMetrics()
        self.last_window = win
        if not math.isfinite(power_w) and win.energy_j is not None and wall_s > 0:
            power_w, power_source = win.energy_j / (wall_s * scale), "engine_metric"
        hit = win.prefix_hit_fraction
        if win.kv_connector == "degraded":  # asked for thousands of tokens, served none: the tier does not work
            log.warning("profiler: the engine's KV connector (LMCache tier) served none of the prefix tokens it was "
                        "asked for in this window (degraded mode?): its hit fraction is not counted")
        elif win.lmcache_hit_fraction is not None:
            hit = (hit or 0.0) + win.lmcache_hit_fraction
        arrivals = np.asarray(wl.arrival_s[pw.warmup:], dtype=float)
        arr = np.asarray(results, dtype=float).reshape(-1, 4)
        samples = RequestSamples(arrival_s=arrivals, ttft_s=arr[:, 0], tpot_s=arr[:, 1], e2e_s=arr[:, 2],
                                 output_tokens=np.asarray(wl.output_tokens[pw.warmup:], dtype=float),
                                 prompt_tokens=np.asarray(wl.prompt_tokens[pw.warmup:], dtype=float))
        self.last_samples = samples
        extras = PointExtras(power_w=power_w, power_source=power_source,
                             cache_hit_fraction=min(hit, 1.0) if hit is not None else math.nan,
                             mean_batch_size=float(np.mean(running)) if running else math.nan,
                             kv_connector=win.kv_connector if before and after else "")
        return summarize(rate_per_s, samples, spec.slo, extras, ci_g_per_kwh=method.ci_g_per_kwh)
