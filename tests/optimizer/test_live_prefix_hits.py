"""The live optimizer counts the prefix hits the system measured (issue 20): traffic with repeated prefixes through
the router to an emulated engine reaches the cache-manager's access history (ReportAccesses), and the next plan's
inputs carry the pool's hit fraction over the last hour (prefix_hits.py), named with its source in the plan's notes;
a pool without traffic gets no figure and the notes say why."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import grpc
import pytest
from greenserve.cache_manager.service import build as build_cache_manager
from greenserve.cache_manager.settings import CacheManagerSettings
from greenserve.common.clock import now_s
from greenserve.optimizer import inputs as planning_inputs
from greenserve.optimizer import prefix_hits
from greenserve.router.front.service import RouterSettings
from greenserve.router.front.service import build as build_router
from greenserve.router.routing.scrape import parse_metrics
from greenserve.simulator.emulator import EmulatorConfig, EngineEmulator
from greenserve.v1 import cache_manager_pb2 as cpb
from greenserve.v1 import (
    common_pb2,
    optimizer_pb2,
    optimizer_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
)

from tests.conftest import free_port
from tests.optimizer.conftest import ci_ref, engine, ingest_daily, load_ref, pool

pytestmark = pytest.mark.timeout(120)
MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"


def _access(kind: int, tokens: int, hit_tokens: int = 0, t: int = 1000, conversation: str = "") -> cpb.AccessRecord:
    record = cpb.AccessRecord(entry_key="k", kind=kind, tokens=tokens, hit_tokens=hit_tokens,
                              conversation_id=conversation)
    record.time.FromSeconds(t)
    return record


def test_measure_pairs_each_request_with_its_store() -> None:
    hit, miss, store = cpb.ACCESS_KIND_HIT, cpb.ACCESS_KIND_MISS, cpb.ACCESS_KIND_STORE
    records = [
        _access(miss, 100, t=1), _access(store, 100, t=1),  # a miss: 100 prompt tokens, none hit
        _access(hit, 60, 60, t=2), _access(store, 100, t=2),  # a partial hit: 60 of 100
        _access(hit, 80, 80, t=3),  # a whole-prompt hit: no store follows
        _access(store, 500, t=4),  # a store with no request before it (not routed): left out
    ]
    m = prefix_hits.measure(records)
    assert (m.requests, m.prompt_tokens, m.hit_tokens) == (3, 280, 140)
    assert m.fraction == pytest.approx(0.5)
    assert prefix_hits.measure([]).fraction == 0.0


async def _complete(session: aiohttp.ClientSession, url: str, prompt: str) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    async with session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()


async def test_next_plan_carries_the_measured_hit_fraction(start_inprocess, forecaster: Any, optimizer: Any,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    cache = await start_inprocess(CacheManagerSettings, build_cache_manager, instance="cm-1", log_level="WARNING")
    router = await start_inprocess(RouterSettings, build_router, http_port=0, watch_plans=False, feeds=True,
                                   cache_manager_addr=cache.address, forecaster_addr=forecaster.address,
                                   access_feed_interval_s=0.1, health_interval_s=0.2, scrape_interval_s=0.2,
                                   log_level="WARNING")
    router_http = f"http://127.0.0.1:{router.server.registrations[0].servicer.http.port}"
    emu = EngineEmulator(EmulatorConfig(host="127.0.0.1", port=0, model=MODEL, time_scale=50.0))
    await emu.start()
    try:
        rtr = router_pb2_grpc.RouterServiceStub(grpc.aio.insecure_channel(router.address))
        await rtr.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
            id="chat-1", url=emu.url, pool="chat", model=MODEL, kind=common_pb2.ENGINE_KIND_SIMULATED)))
        # Four documents, each asked about eight times: a long shared prefix and a short question.
        documents = [f"document {d}: " + " ".join(f"w{d}x{i}" for i in range(400)) for d in range(4)]
        prompts = [f"{doc}\nQuestion {q}: what does it say?" for q in range(8) for doc in documents]
        async with aiohttp.ClientSession() as session:
            for prompt in prompts:
                await _complete(session, router_http, prompt)

        cm_channel = grpc.aio.insecure_channel(cache.address)
        fleet = common_pb2.FleetInventory(pools=[
            pool("chat", [engine("chat-1", "A100-80GB", emu.url)]),
            pool("idle", [engine("idle-1", "A100-80GB")])])
        notes: list[str] = []
        for _ in range(100):  # the router's access feed sends every 0.1 s
            notes = []
            hits = await prefix_hits.fetch_hit_fractions(cm_channel, fleet, now_s(), notes)
            if "chat" in hits:
                break
            await asyncio.sleep(0.1)
        assert hits.get("chat", 0.0) > 0.3, notes  # 7 of 8 askings reuse a ~2,400-character document
        assert "idle" not in hits
        assert any("pool idle: 0 request(s)" in n and "no prefix reuse" in n for n in notes), notes
        # The engine's own vLLM counters (what the router scrapes) saw reuse too.
        async with aiohttp.ClientSession() as session, session.get(emu.url + "/metrics") as resp:
            metrics = parse_metrics(await resp.text())
        assert metrics.prefix_hits_tokens and metrics.prefix_queries_tokens
        assert metrics.prefix_hits_tokens / metrics.prefix_queries_tokens > 0.3

        # The optimizer's next plan: its inputs carry the figure, its notes name it and the source.
        fc = grpc.aio.insecure_channel(forecaster.address)
        await ingest_daily(fc, ci_ref("FR"), 60.0, 30.0)
        for name in ("chat", "idle"):
            await ingest_daily(fc, load_ref(name), 0.5, 0.2)
        captured: list[Any] = []
        real_gather = planning_inputs.gather

        async def gather(**kw: Any) -> Any:
            captured.append(await real_gather(**kw))
            return captured[-1]

        monkeypatch.setattr(planning_inputs, "gather", gather)
        running = await optimizer(schedule_plans=False, cache_solver="keep", mig_solver="keep",
                                  cache_manager_addr=cache.address)
        opt = optimizer_pb2_grpc.OptimizerServiceStub(grpc.aio.insecure_channel(running.address))
        await opt.SetFleet(optimizer_pb2.SetFleetRequest(fleet=fleet))
        plan = (await opt.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=1, dry_run=True))).plan
        assert captured and captured[-1].prefix_hit_fraction.get("chat", 0.0) >= 0.3
        assert "idle" not in captured[-1].prefix_hit_fraction
        line = next((n for n in plan.input_notes if n.startswith("prefix hits of pool chat")), "")
        assert "cache-manager access history" in line and "over the last hour" in line, list(plan.input_notes)
        await cm_channel.close()
    finally:
        await emu.stop()


async def test_no_figure_when_the_cache_manager_does_not_answer() -> None:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{free_port()}")
    fleet = common_pb2.FleetInventory(pools=[pool("chat", [engine("chat-1")]), pool("rag", [engine("rag-1")])])
    notes: list[str] = []
    assert await prefix_hits.fetch_hit_fractions(channel, fleet, now_s(), notes, timeout_s=2.0) == {}
    assert len(notes) == 1 and "UNAVAILABLE" in notes[0] and "chat, rag" in notes[0], notes
    assert await prefix_hits.fetch_hit_fractions(None, fleet, now_s(), notes) == {}
    assert "no cache-manager configured" in notes[-1]
    await channel.close()
