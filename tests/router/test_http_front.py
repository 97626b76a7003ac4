"""The OpenAI-compatible HTTP front against emulated engines, driven by the official openai client."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
from greenserve.router.routing.scrape import parse_metrics

RECEIPT_KEYS = {"engine_id", "pool", "ttft_s", "tpot_s", "e2e_s", "prompt_tokens", "cached_prompt_tokens",
                "completion_tokens", "energy_kwh", "ci_g_per_kwh", "carbon", "plan_version", "slo_met"}


async def test_openai_client_streams_chat_and_gets_receipt(emulators, router) -> None:
    emus = await emulators(2)
    r = await router([e.url for e in emus])
    client = openai.AsyncOpenAI(base_url=r.http + "/v1", api_key="unused")
    stream = await client.chat.completions.create(
        model=emus[0].model, messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi " * 200}],
        max_tokens=12, stream=True)
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    receipt = chunks[-1].model_extra["greenserve"]
    assert RECEIPT_KEYS <= set(receipt)
    assert receipt["completion_tokens"] == 12
    assert receipt["engine_id"] in {e.url.split("://")[1] for e in emus}
    assert 0 < receipt["ttft_s"] <= receipt["e2e_s"]
    assert receipt["energy_kwh"] > 0 and receipt["carbon"]["total_g"] > 0
    assert receipt["ci_g_per_kwh"] == 261.0  # cited fallback: no forecaster
    # the client did not ask for usage: no usage chunk leaks through, the receipt rides the finish chunk
    assert chunks[-1].choices and chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)
    await client.close()


async def test_stream_with_usage_puts_receipt_on_usage_chunk(emulators, router) -> None:
    emus = await emulators(1)
    r = await router([emus[0].url])
    client = openai.AsyncOpenAI(base_url=r.http + "/v1", api_key="unused")
    stream = await client.completions.create(model=emus[0].model, prompt="tell me " * 50, max_tokens=6,
                                             stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].model_extra["greenserve"]["prompt_tokens"] == chunks[-1].usage.prompt_tokens
    await client.close()


async def test_unary_response_has_receipt_in_body_and_headers(emulators, router) -> None:
    emus = await emulators(1)
    r = await router([emus[0].url])
    client = openai.AsyncOpenAI(base_url=r.http + "/v1", api_key="unused")
    raw = await client.chat.completions.with_raw_response.create(
        model=emus[0].model, messages=[{"role": "user", "content": "hello"}], max_tokens=4)
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.model_extra["greenserve"]["completion_tokens"] == 4
    assert raw.headers["x-greenserve-engine"] == emus[0].url.split("://")[1]
    assert float(raw.headers["x-greenserve-carbon-g"]) > 0
    models = await client.models.list()
    assert [m.id for m in models.data] == [emus[0].model]
    await client.close()


async def test_health_metrics_and_bad_requests(emulators, router) -> None:
    emus = await emulators(1)
    r = await router([emus[0].url])
    async with aiohttp.ClientSession() as s:
        async with s.get(r.http + "/health") as resp:
            assert resp.status == 200 and (await resp.json())["routable_engines"] == 1
        async with s.post(r.http + "/v1/chat/completions", json={"model": emus[0].model, "messages": "x"}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["param"] == "messages"
        async with s.post(r.http + "/v1/completions", data=b"{not json") as resp:
            assert resp.status == 400
        # the engine's own 4xx is passed through (unknown model), without charging the engine a failure
        async with s.post(r.http + "/v1/completions", json={"model": "nope", "prompt": "x"}) as resp:
            assert resp.status in (400, 404)
        assert r.core.registry.engines[emus[0].url.split("://")[1]].consecutive_failures == 0
        async with s.post(r.http + "/v1/completions", json={"model": emus[0].model, "prompt": "x", "max_tokens": 2}) as resp:
            assert resp.status == 200
        async with s.get(r.http + "/metrics") as resp:
            text = await resp.text()
        assert 'greenserve_router_requests_total{outcome="ok",protocol="http"} 1.0' in text


async def test_no_engine_gives_503_and_limit_gives_429(emulators, router) -> None:
    r = await router([])
    async with aiohttp.ClientSession() as s:
        async with s.post(r.http + "/v1/completions", json={"model": "m", "prompt": "x"}) as resp:
            assert resp.status == 503
        async with s.get(r.http + "/health") as resp:
            assert resp.status == 503
    emus = await emulators(1, time_scale=1.0)
    r2 = await router([emus[0].url], max_in_flight=2)
    async with aiohttp.ClientSession() as s:
        body = {"model": emus[0].model, "prompt": "x " * 10, "max_tokens": 200, "stream": True}
        slow = [asyncio.create_task(s.post(r2.http + "/v1/completions", json=body)) for _ in range(2)]
        await asyncio.sleep(0.3)
        async with s.post(r2.http + "/v1/completions", json=body) as resp:
            assert resp.status == 429
            assert resp.headers["Retry-After"] == "1"
        for t in slow:
            (await t).close()


async def test_client_disconnect_cancels_upstream(emulators, router) -> None:
    emus = await emulators(1, time_scale=1.0)
    r = await router([emus[0].url])
    engine = next(iter(r.core.registry.engines.values()))
    async with aiohttp.ClientSession() as s:
        resp = await s.post(r.http + "/v1/completions", json={"model": emus[0].model, "prompt": "hello",
                                                              "max_tokens": 2000, "stream": True})
        await resp.content.readline()  # first token arrived
        assert engine.in_flight == 1
        resp.close()  # the caller goes away
    for _ in range(100):
        async with aiohttp.ClientSession() as s2:
            async with s2.get(emus[0].url + "/metrics") as m:
                running = parse_metrics(await m.text()).running
        if engine.in_flight == 0 and running == 0:
            break
        await asyncio.sleep(0.05)
    assert engine.in_flight == 0
    assert running == 0, "the engine still runs the abandoned request"


async def test_prefix_affinity_and_session_stickiness(emulators, router) -> None:
    emus = await emulators(3)
    r = await router([e.url for e in emus])
    prefix = "You are a helpful assistant. " * 100
    engines = set()
    async with aiohttp.ClientSession() as s:
        for i in range(6):
            body = {"model": emus[0].model, "prompt": prefix + f"question {i}", "max_tokens": 2}
            async with s.post(r.http + "/v1/completions", json=body) as resp:
                engines.add(resp.headers["x-greenserve-engine"])
                receipt = json.loads(await resp.read())["greenserve"]
        assert len(engines) == 1, "requests sharing a long prefix should stay on one engine at low load"
        assert receipt["cached_prompt_tokens"] > 0
        sticky = set()
        for i in range(5):
            body = {"model": emus[0].model, "prompt": f"unrelated {i} " * 3, "max_tokens": 2}
            async with s.post(r.http + "/v1/completions", json=body, headers={"x-greenserve-session": "user-7"}) as resp:
                sticky.add(resp.headers["x-greenserve-engine"])
        assert len(sticky) == 1
