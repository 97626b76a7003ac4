"""What the router reads of an engine's replies outside the request path is capped (engine_replies.py): an engine
URL comes from RegisterEngine, and its /metrics, /health or /v1/models may answer an endless or huge body. The
router stays up, its memory stays bounded and the engine counts as failing that scrape or probe (logged once);
a real-size /metrics page (many LoRA adapters) still passes with 10x headroom."""

from __future__ import annotations

import asyncio
import json
import logging
import tracemalloc
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from greenserve.router.routing.engines import EJECTED, STALE, EngineRegistry, EngineState, HealthPolicy
from greenserve.router.routing.monitor import EngineMonitor
from greenserve.router.upstream.engine_replies import MAX_HEALTH_BYTES, MAX_METRICS_BYTES, MAX_MODELS_BYTES

MiB = 1024 * 1024
_METRICS_HEAD = b'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
_PAD_LINE = b"# " + b"p" * 1021 + b"\n"  # a comment line: scrape.py drops it, so only its size matters
_PAD_CHUNK = _PAD_LINE * 1024  # 1 MiB, built once: the fake engine allocates nothing per chunk


async def _stream(request: web.Request, head: bytes, mib: int | None) -> web.StreamResponse:
    """``head`` then ``mib`` MiB of padding (None: without end), chunked (no Content-Length)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await resp.prepare(request)
    await resp.write(head)
    sent = 0
    try:
        while mib is None or sent < mib:
            await resp.write(_PAD_CHUNK)
            sent += 1
    except (ConnectionError, RuntimeError):  # the router closed the connection at its cap
        return resp
    await resp.write_eof()
    return resp


@pytest.fixture
async def fake_engine() -> AsyncIterator[Callable[..., Any]]:
    """`await fake_engine(metrics=..., health=..., models=...)`: an engine whose replies are bodies of the given
    size in MiB (None: endless; 0: a normal small reply; bytes: that body, with its Content-Length)."""
    runners: list[web.AppRunner] = []

    async def start(metrics: Any = 0, health: Any = 0, models: Any = 0) -> str:
        async def metrics_h(request: web.Request) -> web.StreamResponse:
            if isinstance(metrics, bytes):
                return web.Response(body=metrics, content_type="text/plain")
            return await _stream(request, _METRICS_HEAD, metrics)

        async def health_h(request: web.Request) -> web.StreamResponse:
            if health == 0:
                return web.Response()
            return await _stream(request, b"", health)

        async def models_h(request: web.Request) -> web.StreamResponse:
            if isinstance(models, bytes):
                return web.Response(body=models, content_type="application/json")
            # valid JSON whatever its size: the model, then padding in a string
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            await resp.write(b'{"data": [{"id": "big-model"}], "pad": "')
            for _ in range(models):
                await resp.write(b"p" * MiB)
            await resp.write(b'"}')
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_get("/metrics", metrics_h)
        app.router.add_get("/health", health_h)
        app.router.add_get("/v1/models", models_h)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


def _monitor(url: str, probe_timeout_s: float = 30.0) -> tuple[EngineMonitor, EngineState]:
    """A monitor of one engine whose scrapes and probes the test makes itself (its session, not its loops)."""
    registry = EngineRegistry(HealthPolicy())
    engine, _ = registry.upsert(EngineState(id="e", url=url, pool="p", model="m"))
    monitor = EngineMonitor(registry, scrape_interval_s=60.0, health_interval_s=60.0, probe_timeout_s=probe_timeout_s)
    monitor._session = aiohttp.ClientSession()
    return monitor, engine


async def test_a_100_mib_metrics_page_fails_the_scrape_with_memory_bounded(fake_engine) -> None:
    """Read whole, the page was taken (a valid page: its padding is comment lines) after holding its 100 MiB, and
    again as text; now the scrape stops at MAX_METRICS_BYTES and fails."""
    url = await fake_engine(metrics=100)
    monitor, engine = _monitor(url)
    try:
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            ok = await monitor.scrape(engine)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert not ok and monitor.scrape_failures == 1 and engine.metrics_at == 0.0
        assert peak < 2 * MAX_METRICS_BYTES + 8 * MiB, f"{peak / MiB:.1f} MiB held by one scrape"
        # a declared Content-Length over the cap fails before anything is read
        declared = await fake_engine(metrics=_METRICS_HEAD + b"#" * (MAX_METRICS_BYTES + 1))
        engine.url = declared
        assert not await monitor.scrape(engine)
        # the same engine with a normal page scrapes again
        engine.url = await fake_engine(metrics=_METRICS_HEAD)
        assert await monitor.scrape(engine) and engine.running == 3.0
    finally:
        await monitor.stop()


async def test_an_endless_health_body_fails_the_probe(fake_engine) -> None:
    url = await fake_engine(health=None)
    monitor, engine = _monitor(url, probe_timeout_s=30.0)
    try:
        for _ in range(3):  # would hang until the 30 s timeout, reading without end
            assert not await asyncio.wait_for(monitor.probe(engine), 10.0)
        assert monitor.probe_failures == 3 and engine.ejected_until > 0.0
    finally:
        await monitor.stop()
    assert MAX_HEALTH_BYTES <= 64 * 1024


async def test_router_stays_up_against_endless_engine_replies(fake_engine, router, caplog) -> None:
    """An engine registered with endless /metrics and /health bodies: the router keeps serving, the engine is
    STALE and ejected (failed scrapes and probes), each cap is logged once, memory stays bounded."""
    url = await fake_engine(metrics=None, health=None)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with caplog.at_level(logging.WARNING, logger="greenserve.router.routing.monitor"):
            r = await router(probe_timeout_s=5.0, scrape_interval_s=0.2, stale_after_s=1.0, health_interval_s=0.2)
            registered = await r.stub.RegisterEngine(_register(url))
            assert registered.engine.id == "fake"
            await asyncio.sleep(2.5)
            peak = tracemalloc.get_traced_memory()[1] - base
            async with aiohttp.ClientSession() as s:
                async with s.get(r.http + "/health", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    assert resp.status in (200, 503)
                    assert (await resp.json())["engines"] == 1
    finally:
        tracemalloc.stop()
    monitor = r.core.monitor
    engine = r.core.registry.engines["fake"]
    assert monitor.scrape_failures >= 3 and monitor.probe_failures >= 3
    assert engine.state(asyncio.get_running_loop().time(), 1.0) in (STALE, EJECTED) and engine.eject_count >= 1
    warned = [rec for rec in caplog.records if "over its cap" in rec.getMessage()]
    assert sorted(getattr(rec, "path", "") for rec in warned) == ["/health", "/metrics"]
    # per engine: a metrics page and a health body at their caps, plus what aiohttp buffers
    assert peak < 2 * MAX_METRICS_BYTES + 16 * MiB, f"{peak / MiB:.1f} MiB"


def _register(url: str) -> Any:
    from greenserve.v1 import common_pb2, router_pb2

    return router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(id="fake", url=url, pool="p", model="m"))


async def test_an_oversized_models_answer_leaves_the_model_unknown(fake_engine, router, caplog) -> None:
    """--engines without a model: /v1/models is read at start; over MAX_MODELS_BYTES it is not taken."""
    big = await fake_engine(models=MAX_MODELS_BYTES // MiB + 4)
    small = await fake_engine(models=json.dumps({"data": [{"id": "small-model"}]}).encode())
    with caplog.at_level(logging.WARNING, logger="greenserve.router"):
        r = await router([big, small], probe_timeout_s=5.0)
    by_url = {e.url: e for e in r.core.registry.engines.values()}
    assert by_url[small].model == "small-model"
    assert by_url[big].model == ""
    assert any("over its cap" in rec.getMessage() for rec in caplog.records)


async def test_a_real_size_metrics_page_of_many_lora_adapters_is_scraped(emulators, fake_engine) -> None:
    """The emulator's page (vLLM V1's names and buckets) for 8 data-parallel ranks, plus 5,000
    vllm:lora_requests_info series (one per set of running and waiting adapters, which vLLM never drops): the cap
    leaves 10x headroom over it, and it scrapes."""
    emu = (await emulators(1))[0]
    async with aiohttp.ClientSession() as s:
        async with s.post(emu.url + "/v1/completions", json={"model": emu.model, "prompt": "hi", "max_tokens": 4}) as r:
            await r.read()
        async with s.get(emu.url + "/metrics") as r:
            page = await r.text()
    series = [line for line in page.splitlines() if line.startswith("vllm:")]
    lines = [line for line in page.splitlines() if not line.startswith("vllm:")]
    for rank in range(8):
        lines += [line.replace('engine="0"', f'engine="{rank}"') for line in series]
    lines.append("# TYPE vllm:lora_requests_info gauge")
    for i in range(5000):
        running = ",".join(f"tenant-{(i + k) % 100:03d}-adapter-v2" for k in range(4))
        waiting = ",".join(f"tenant-{(i * 7 + k) % 100:03d}-adapter-v2" for k in range(2))
        lines.append(f'vllm:lora_requests_info{{max_lora="8",running_lora_adapters="{running}",'
                     f'waiting_lora_adapters="{waiting}"}} 1.7647e+09')
    body = ("\n".join(lines) + "\n").encode()
    assert 1 * MiB < len(body) and 10 * len(body) <= MAX_METRICS_BYTES, len(body)
    monitor, engine = _monitor(await fake_engine(metrics=body))
    try:
        assert await monitor.scrape(engine)
    finally:
        await monitor.stop()
