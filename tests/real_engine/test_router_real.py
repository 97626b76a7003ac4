"""The router in front of two real vLLM engines (CPU build, tiny model): the official OpenAI client through the
router's HTTP front, Generate over gRPC with a carbon receipt built from vLLM's own usage, prefix affinity seen in
vLLM's own ``vllm:prefix_cache_hits_total``, and an engine killed mid-stream failing over as it does with emulators
(tests/router/test_failures.py).

The two engines are started once for the module, each worker bound to its own core; the failover test kills one,
so it runs last. Weights are random: only structure, token counts and metrics are asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import openai
import pytest

from greenserve.profiler import engine_metrics
from greenserve.v1 import router_pb2
from greenserve.vllm_cpu import engines as vllm
from tests.real_engine.conftest import start_vllm
from tests.router.conftest import router  # noqa: F401 - the router fixture (in this event loop, HTTP front on)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
MODEL = vllm.SERVED_MODEL_NAME


@pytest.fixture(scope="module")
def two_engines(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[vllm.VllmEngine]]:
    where = tmp_path_factory.mktemp("two-engines")
    binds = vllm.cpu_binds(2)
    started: list[vllm.VllmEngine] = []
    try:
        for i in range(2):  # one after the other: two cold starts at once on 2 cores take twice as long each
            started.append(start_vllm(tiny_model, where, name=f"vllm-{i}", cpu_bind=binds[i]))
        yield started
    finally:
        for engine in started:
            engine.stop()


def engine_id(engine: vllm.VllmEngine) -> str:
    return engine.url.split("://")[1]


def counters(engine: vllm.VllmEngine) -> dict[str, float]:
    import httpx

    return engine_metrics.parse(httpx.get(engine.url + "/metrics", timeout=10).text).values


async def test_official_openai_client_through_the_router(two_engines, router) -> None:  # noqa: F811
    r = await router([e.url for e in two_engines])
    client = openai.AsyncOpenAI(base_url=r.http + "/v1", api_key="none", max_retries=0, timeout=120)
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    seen: set[str] = set()
    for i in range(12):  # distinct conversations: the affinity hash spreads them (all 12 on one: p = 1/2048)
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": f"conversation {i} {uuid.uuid4().hex}"}],
            extra_body={"ignore_eos": True})
        seen.add(raw.headers["x-greenserve-engine"])
        reply = raw.parse()
        assert reply.usage is not None and reply.usage.completion_tokens == 5 and reply.model == MODEL
    assert seen == {engine_id(e) for e in two_engines}, seen
    stream = await client.completions.create(model=MODEL, prompt="streamed through the router", max_tokens=7,
                                             stream=True, stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True})
    chunks = [c async for c in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    with pytest.raises(openai.BadRequestError):  # an engine's 400 reaches the client as vLLM wrote it
        await client.completions.create(model=MODEL, prompt="x", max_tokens=0)


async def test_grpc_generate_receipt_counts_what_vllm_counted(two_engines, router) -> None:  # noqa: F811
    r = await router([e.url for e in two_engines])
    prompt = f"{uuid.uuid4().hex} " + " ".join(f"line {i} of a shared report," for i in range(100))
    request = router_pb2.GenerateRequest(
        request=router_pb2.RequestDescriptor(model=MODEL, completion=router_pb2.CompletionInput(prompt=prompt)),
        sampling=router_pb2.SamplingParams(max_tokens=6))
    receipts = []
    for _ in range(2):
        msgs = [m async for m in r.stub.Generate(request)]
        assert msgs[0].engine_id and msgs[-1].finish_reason in ("stop", "length")
        receipts.append(msgs[-1].receipt)
    first, second = receipts
    assert 1 <= first.completion_tokens <= 6 and first.prompt_tokens > 256
    assert first.engine_id == second.engine_id, "the same prompt head goes to the same engine"
    # vLLM's own usage.prompt_tokens_details.cached_tokens: whole 128-token blocks, none the first time
    assert first.cached_prompt_tokens == 0
    assert 128 <= second.cached_prompt_tokens < second.prompt_tokens
    assert second.carbon.total_g > 0 and second.ttft_s > 0


async def test_prefix_affinity_shows_in_vllms_own_prefix_cache_hits(two_engines, router) -> None:  # noqa: F811
    r = await router([e.url for e in two_engines])
    documents = [f"{uuid.uuid4().hex} " + " ".join(f"clause {i} of contract {d}," for i in range(90))
                 for d in range(5)]
    before = [counters(e) for e in two_engines]
    client = openai.AsyncOpenAI(base_url=r.http + "/v1", api_key="none", max_retries=0, timeout=120)
    cached = 0
    engines_of: dict[int, set[str]] = {}
    for _turn in range(3):
        for d, doc in enumerate(documents):
            raw = await client.completions.with_raw_response.create(model=MODEL, prompt=doc + f" question {_turn}",
                                                                    max_tokens=2)
            engines_of.setdefault(d, set()).add(raw.headers["x-greenserve-engine"])
            usage = raw.parse().usage
            assert usage is not None and usage.prompt_tokens_details is not None
            cached += usage.prompt_tokens_details.cached_tokens or 0
    after = [counters(e) for e in two_engines]
    hits = [a["vllm:prefix_cache_hits_total"] - b.get("vllm:prefix_cache_hits_total", 0.0)
            for a, b in zip(after, before, strict=True)]
    queries = [a["vllm:prefix_cache_queries_total"] - b.get("vllm:prefix_cache_queries_total", 0.0)
               for a, b in zip(after, before, strict=True)]
    # each document's three turns went to one engine
    assert all(len(s) == 1 for s in engines_of.values()), engines_of
    # vLLM's own counters: every repeat hit the document's blocks on its engine (2 of 3 turns x 5 documents,
    # each at least two 128-token blocks), and the router's receipts saw the same tokens; an engine that served
    # no document was asked nothing
    assert sum(hits) == cached
    assert sum(hits) >= 10 * 256, (hits, queries)
    used = set().union(*engines_of.values())
    for engine, h, q in zip(two_engines, hits, queries, strict=True):
        if engine_id(engine) in used:
            assert h > 0 and q > 0, (engine_id(engine), h, q)
        else:
            assert h == 0 and q == 0, (engine_id(engine), h, q)


async def _stream(session: aiohttp.ClientSession, url: str, body: dict, committed: list[str]) -> dict:
    out = {"status": None, "engine": None, "tokens": 0, "done": False, "error": None}
    async with session.post(url, json=body) as resp:
        out["status"], out["engine"] = resp.status, resp.headers.get("x-greenserve-engine")
        if out["engine"]:
            committed.append(out["engine"])
        if resp.status != 200:
            return out
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                out["done"] = True
                break
            obj = json.loads(data)
            if "error" in obj:
                out["error"] = obj["error"]
            elif obj.get("choices") and obj["choices"][0].get("text") is not None:
                out["tokens"] += 1
    return out


async def test_an_engine_killed_mid_stream_fails_over(two_engines, router) -> None:  # noqa: F811
    """Runs last: it kills one of the module's engines (SIGKILL to its whole process group)."""
    r = await router([e.url for e in two_engines])
    url = r.http + "/v1/completions"
    long = {"model": MODEL, "prompt": f"a long answer {uuid.uuid4().hex}", "max_tokens": 1500, "ignore_eos": True,
            "stream": True}
    committed: list[str] = []
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        in_flight = asyncio.create_task(_stream(s, url, long, committed))
        deadline = time.monotonic() + 60
        while not committed:
            assert time.monotonic() < deadline and not in_flight.done(), "no first token in 60 s"
            await asyncio.sleep(0.01)
        victim = next(e for e in two_engines if engine_id(e) == committed[0])
        survivor = next(e for e in two_engines if e is not victim)
        # frozen first, so that the stream cannot finish before the kill lands (~370 tokens/s), then killed
        os.killpg(victim.pid, signal.SIGSTOP)
        os.killpg(victim.pid, signal.SIGKILL)
        cut = await asyncio.wait_for(in_flight, 60)
        # committed to the victim: ends (an error event, or the stream closed), never hangs nor is replayed
        assert cut["status"] == 200 and cut["engine"] == engine_id(victim)
        assert 0 < cut["tokens"] < 1500 and (cut["error"] is not None or not cut["done"]), cut
        later = await asyncio.wait_for(asyncio.gather(*(
            _stream(s, url, {**long, "prompt": f"after the crash {i}", "max_tokens": 8}, []) for i in range(6))), 120)
    assert all(res["status"] == 200 and res["done"] and res["tokens"] >= 1 for res in later), later
    assert all(res["engine"] == engine_id(survivor) for res in later), later
    deadline = time.monotonic() + 15
    while not r.core.registry.engines[engine_id(victim)].ejected_until:
        assert time.monotonic() < deadline, "the killed engine is not ejected"
        await asyncio.sleep(0.1)
    victim.process.wait(30)
    deadline = time.monotonic() + 10
    while vllm.group_alive(victim.pid):  # SIGKILL reaches EngineCore and the worker within moments
        assert time.monotonic() < deadline, f"left of the killed engine: {vllm.group_members(victim.pid)}"
        await asyncio.sleep(0.1)
