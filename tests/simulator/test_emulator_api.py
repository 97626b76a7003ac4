"""The engine emulator driven by the official ``openai`` client and scraped with prometheus_client's parser."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from greenserve.simulator.emulator import EmulatorConfig, EngineEmulator
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

MODEL = "test-model"
LONG_PROMPT = " ".join(f"word{i % 37} and more context {i}" for i in range(60))


async def scrape(emu: EngineEmulator) -> dict[str, float]:
    """``/metrics`` as {sample name (+ finished_reason/le): value}, parsed by prometheus_client."""
    async with httpx.AsyncClient() as c:
        text = (await c.get(emu.url + "/metrics")).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("vllm:") and "model_name" in s.labels:
                assert s.labels["model_name"] == MODEL
            key = s.name
            if "finished_reason" in s.labels:
                key += ":" + s.labels["finished_reason"]
            if "le" in s.labels:
                key += ":" + s.labels["le"]
            out[key] = s.value
    return out


@pytest.fixture
async def emu() -> AsyncIterator[EngineEmulator]:
    e = EngineEmulator(EmulatorConfig(port=0, model=MODEL, time_scale=200.0))
    await e.start()
    yield e
    await e.stop()


def client(emu: EngineEmulator, **kw: object) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=emu.url + "/v1", api_key="x", max_retries=0, **kw)  # type: ignore[arg-type]


async def test_completion_non_streaming(emu: EngineEmulator) -> None:
    c = client(emu)
    r = await c.completions.create(model=MODEL, prompt="Hello there, engine!", max_tokens=7)
    assert r.object == "text_completion" and r.model == MODEL
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].text.startswith(" the model is an emulated engine")
    assert r.usage is not None and r.usage.completion_tokens == 7
    # "Hello" " there" "," " engin" "e" "!": pieces over 6 characters are cut (tokenizer rule)
    assert r.usage.prompt_tokens == 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7
    assert r.usage.prompt_tokens_details is not None and r.usage.prompt_tokens_details.cached_tokens == 0


async def test_completion_streaming_with_usage_matches_unary(emu: EngineEmulator) -> None:
    c = client(emu)
    unary = await c.completions.create(model=MODEL, prompt="stream me", max_tokens=12)
    stream = await c.completions.create(
        model=MODEL, prompt="stream me", max_tokens=12, stream=True, stream_options={"include_usage": True}
    )
    texts, finish, usage = [], [], None
    async for chunk in stream:
        if chunk.choices:
            texts.append(chunk.choices[0].text)
            finish.append(chunk.choices[0].finish_reason)
        else:
            usage = chunk.usage
    assert "".join(texts) == unary.choices[0].text
    assert len(texts) == 12 and finish[-1] == "length" and all(f is None for f in finish[:-1])
    assert usage is not None and usage.completion_tokens == 12 and usage.prompt_tokens == unary.usage.prompt_tokens


async def test_chat_streaming_and_not(emu: EngineEmulator) -> None:
    c = client(emu)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 2+2?"}]
    r = await c.chat.completions.create(model=MODEL, messages=messages, max_tokens=5)  # type: ignore[arg-type]
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == " the model is an emulated"
    stream = await c.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=5, stream=True, stream_options={"include_usage": True}  # type: ignore[arg-type]
    )
    roles, content, usage = [], "", None
    async for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.choices:
            roles.append(chunk.choices[0].delta.role)
            content += chunk.choices[0].delta.content or ""
        else:
            usage = chunk.usage
    assert roles[0] == "assistant" and content == r.choices[0].message.content
    assert usage is not None and usage.prompt_tokens == r.usage.prompt_tokens and usage.completion_tokens == 5
    # without include_usage there is no usage chunk
    plain = await c.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, stream=True)  # type: ignore[arg-type]
    assert all(chunk.choices for chunk in [ch async for ch in plain])


async def test_models_and_health(emu: EngineEmulator) -> None:
    models = await client(emu).models.list()
    assert [m.id for m in models.data] == [MODEL]
    async with httpx.AsyncClient() as c:
        assert (await c.get(emu.url + "/health")).status_code == 200


async def test_repeated_prompt_hits_prefix_cache_and_is_faster(emu: EngineEmulator) -> None:
    c = client(emu)
    before = await scrape(emu)
    first = await c.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=2)
    mid = await scrape(emu)
    second = await c.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=2)
    after = await scrape(emu)
    p = first.usage.prompt_tokens
    assert p > 200
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == (p - 1) // 16 * 16  # whole blocks; the last token is always recomputed (vLLM)
    ttft_first = mid["vllm:time_to_first_token_seconds_sum"] - before["vllm:time_to_first_token_seconds_sum"]
    ttft_second = after["vllm:time_to_first_token_seconds_sum"] - mid["vllm:time_to_first_token_seconds_sum"]
    assert ttft_second < ttft_first
    assert after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"] == 2 * p
    assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] == cached


async def test_metrics_move_with_requests(emu: EngineEmulator) -> None:
    c = client(emu)
    before = await scrape(emu)
    results = await asyncio.gather(
        *(c.completions.create(model=MODEL, prompt=f"request number {i}", max_tokens=4 + i) for i in range(3))
    )
    after = await scrape(emu)
    prompt = sum(r.usage.prompt_tokens for r in results)
    gen = sum(r.usage.completion_tokens for r in results)
    assert gen == 4 + 5 + 6
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == prompt
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == gen
    assert after["vllm:request_success_total:length"] - before["vllm:request_success_total:length"] == 3
    assert after["vllm:time_to_first_token_seconds_count"] - before["vllm:time_to_first_token_seconds_count"] == 3
    assert after["vllm:e2e_request_latency_seconds_count"] - before["vllm:e2e_request_latency_seconds_count"] == 3
    # every token after the first is one inter-token latency observation
    assert after["vllm:inter_token_latency_seconds_count"] - before["vllm:inter_token_latency_seconds_count"] == gen - 3
    # one per-request TPOT per finished request, vLLM's request_time_per_output_token_seconds
    assert (after["vllm:request_time_per_output_token_seconds_count"]
            - before["vllm:request_time_per_output_token_seconds_count"]) == 3
    # no KV connector is modelled: vLLM's connector counters are there, at 0, as on a vLLM without one
    assert after["vllm:external_prefix_cache_queries_total"] == after["vllm:external_prefix_cache_hits_total"] == 0
    assert after["vllm:e2e_request_latency_seconds_bucket:+Inf"] == after["vllm:e2e_request_latency_seconds_count"]
    assert after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0.0


async def test_waiting_queue_with_small_max_num_seqs() -> None:
    emu = EngineEmulator(EmulatorConfig(port=0, model=MODEL, time_scale=20.0, max_num_seqs=2))
    await emu.start()
    try:
        c = client(emu)
        tasks = [
            asyncio.create_task(c.completions.create(model=MODEL, prompt=f"p{i}", max_tokens=300)) for i in range(6)
        ]
        seen: list[tuple[float, float, float]] = []
        for _ in range(200):
            m = await scrape(emu)
            seen.append((m["vllm:num_requests_running"], m["vllm:num_requests_waiting"], m["vllm:kv_cache_usage_perc"]))
            if seen[-1][:2] == (2, 4):
                break
            await asyncio.sleep(0.005)
        assert (2, 4) in [s[:2] for s in seen]
        assert max(s[2] for s in seen) > 0
        results = await asyncio.gather(*tasks)
        assert all(r.usage.completion_tokens == 300 for r in results)
        m = await scrape(emu)
        assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
        assert m["vllm:request_queue_time_seconds_sum"] > 0  # four of them queued
    finally:
        await emu.stop()


async def test_client_disconnect_aborts_and_frees_blocks() -> None:
    emu = EngineEmulator(EmulatorConfig(port=0, model=MODEL, time_scale=5.0))
    await emu.start()
    try:
        body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 2000, "stream": True}
        async with httpx.AsyncClient(timeout=10) as c:
            async with c.stream("POST", emu.url + "/v1/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        break
                assert len(emu.engine.running) == 1 and emu.engine.pool.used_blocks > 0
        for _ in range(200):
            m = await scrape(emu)
            if m["vllm:request_success_total:abort"] == 1:
                break
            await asyncio.sleep(0.01)
        assert m["vllm:request_success_total:abort"] == 1
        assert m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0.0
        assert emu.engine.pool.used_blocks == 0
    finally:
        await emu.stop()


async def test_stop_string_cuts_text(emu: EngineEmulator) -> None:
    c = client(emu)
    r = await c.completions.create(model=MODEL, prompt="x", max_tokens=20, stop=[" emulated", "zzz"])
    assert r.choices[0].text == " the model is an"
    assert r.choices[0].finish_reason == "stop"
    stream = await c.completions.create(model=MODEL, prompt="x", max_tokens=20, stop=" emulated", stream=True)
    chunks = [ch async for ch in stream]
    assert "".join(ch.choices[0].text for ch in chunks) == " the model is an"
    assert chunks[-1].choices[0].finish_reason == "stop"
    # min_tokens holds the stop back until that many tokens exist
    full = (await c.completions.create(model=MODEL, prompt="x", max_tokens=40)).choices[0].text
    r = await c.completions.create(model=MODEL, prompt="x", max_tokens=40, stop=" the", extra_body={"min_tokens": 3})
    assert r.choices[0].finish_reason == "stop" and r.choices[0].stop_reason == " the"  # type: ignore[attr-defined]
    assert r.choices[0].text == full[: full.index(" the", 1)]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions", {"prompt": "x"}, 400, "model"),
        ("/v1/completions", {"model": MODEL}, 400, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, "prompt"),
        ("/v1/completions", {"model": "other", "prompt": "x"}, 404, "model"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2}, 400, "n"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 100000}, 400, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -1}, 400, "temperature"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": [""]}, 400, "stop"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 3, "min_tokens": 5}, 400, "min_tokens"),
        ("/v1/chat/completions", {"model": MODEL}, 400, "messages"),
        ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user"}]}, 400, "messages[0].content"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1}, 400, "max_completion_tokens"),
    ],
)
async def test_bad_requests_name_the_field(emu: EngineEmulator, path: str, body: dict, status: int, param: str) -> None:
    async with httpx.AsyncClient() as c:
        r = await c.post(emu.url + path, json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == status and param.split("[")[0] in err["message"] or status == 404


async def test_bad_request_through_openai_client(emu: EngineEmulator) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client(emu).completions.create(model=MODEL, prompt="x", max_tokens=0)
    assert "max_tokens" in str(info.value)
    with pytest.raises(openai.NotFoundError):
        await client(emu).chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    async with httpx.AsyncClient() as c:
        r = await c.post(emu.url + "/v1/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"


async def test_tokenize_matches_usage(emu: EngineEmulator) -> None:
    async with httpx.AsyncClient() as c:
        tok = (await c.post(emu.url + "/tokenize", json={"model": MODEL, "prompt": LONG_PROMPT})).json()
    r = await client(emu).completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=1)
    assert tok["count"] == r.usage.prompt_tokens == len(tok["tokens"])
    # token ids as the prompt give the same count and hit the cache the text prompt filled
    r2 = await client(emu).completions.create(model=MODEL, prompt=tok["tokens"], max_tokens=1)
    assert r2.usage.prompt_tokens == tok["count"] and r2.usage.prompt_tokens_details.cached_tokens > 0
