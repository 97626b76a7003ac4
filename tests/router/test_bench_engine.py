"""The bench engine (services/bench/router_engine.py): its streams have the emulator's shape, a real router
in front parses them (HTTP and gRPC, streamed and not), its /metrics reads as the router's scraper reads
vLLM's, one timer tick serves every open stream, and bad requests are refused naming the field."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from greenserve.bench.router_engine import BenchEngine, expected_text, start
from greenserve.router.routing.scrape import parse_metrics
from greenserve.router.upstream.dispatcher import chunk_text
from greenserve.v1 import router_pb2
from greenserve_client.generation import generate


@pytest.fixture
async def bench_engine() -> AsyncIterator[Callable[..., Any]]:
    """`await bench_engine(**kwargs)`: (engine, url) of a BenchEngine served in this event loop."""
    servers: list[asyncio.Server] = []

    async def make(**kwargs: Any) -> tuple[BenchEngine, str]:
        engine = BenchEngine(**{"tpot_s": 0.002, **kwargs})
        server = await start(engine)
        servers.append(server)
        return engine, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield make
    for server in servers:
        server.close()


async def _events(url: str, path: str, body: dict[str, Any]) -> tuple[int, str, list[Any]]:
    """Status, content type and the decoded SSE events ("[DONE]" kept as the string)."""
    async with aiohttp.ClientSession() as session, session.post(url + path, json=body) as resp:
        raw = (await resp.read()).decode()
        status, ctype = resp.status, resp.content_type
    out: list[Any] = []
    for event in raw.split("\n\n"):
        if event.startswith("data: "):
            data = event[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return status, ctype, out


def _shape(obj: Any) -> Any:
    """The structure of an event: keys and value types, with the values that differ by engine dropped."""
    if isinstance(obj, dict):
        return {k: _shape(v) for k, v in obj.items() if k not in ("id", "created", "model")}
    if isinstance(obj, list):
        return [_shape(v) for v in obj]
    if isinstance(obj, str):
        return obj if obj in ("[DONE]", "length", "assistant", "text_completion", "chat.completion.chunk") else "s"
    return type(obj).__name__ if obj is not None else None


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("include_usage", [False, True])
async def test_stream_has_the_emulators_shape(emulators, bench_engine, chat: bool, include_usage: bool) -> None:
    (emu,) = await emulators(1, eos_probability=0.0)
    _, url = await bench_engine(model=emu.model)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body: dict[str, Any] = {"model": emu.model, "max_tokens": 5, "stream": True}
    body.update({"messages": [{"role": "user", "content": "hello there"}]} if chat else {"prompt": "hello there"})
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    s_emu, ct_emu, ev_emu = await _events(emu.url, path, body)
    s_bench, ct_bench, ev_bench = await _events(url, path, body)
    assert s_emu == s_bench == 200 and ct_emu == ct_bench == "text/event-stream"
    assert len(ev_bench) == len(ev_emu) == 5 + chat + include_usage + 1
    assert [_shape(e) for e in ev_bench] == [_shape(e) for e in ev_emu]
    assert "".join(chunk_text(e) for e in ev_bench if isinstance(e, dict) and e["choices"]) == expected_text(5)
    if include_usage:
        assert ev_bench[-2]["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("chat", [False, True])
async def test_router_http_and_grpc_read_its_streams(bench_engine, router, chat: bool) -> None:
    engine, url = await bench_engine()
    r = await router([url])
    n = 40
    if chat:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "a prompt"}]}
        desc = router_pb2.RequestDescriptor(chat=router_pb2.ChatInput(
            messages=[router_pb2.ChatMessage(role=router_pb2.CHAT_ROLE_USER, content="a prompt")]))
    else:
        path, body = "/v1/completions", {"prompt": "a prompt"}
        desc = router_pb2.RequestDescriptor(completion=router_pb2.CompletionInput(prompt="a prompt"))
    status, _, events = await _events(r.http, path, {**body, "model": "noop", "max_tokens": n, "stream": True})
    assert status == 200
    texts = [chunk_text(e) for e in events if isinstance(e, dict) and e.get("choices")]
    assert "".join(texts) == expected_text(n) and sum(1 for t in texts if t) == n
    assert events[-1] == "[DONE]" and "greenserve" in events[-2]  # the router spliced its receipt in
    got = await generate(r.stub, router_pb2.GenerateRequest(request=desc, sampling=router_pb2.SamplingParams(
        max_tokens=n)), timeout_s=30)
    assert got.text == expected_text(n) and got.tokens == n and got.finish_reason == "length"
    assert got.receipt is not None and got.receipt.completion_tokens == n
    # not streamed
    async with aiohttp.ClientSession() as session, session.post(r.http + path, json={
            **body, "model": "noop", "max_tokens": 7}) as resp:
        obj = await resp.json()
    choice = obj["choices"][0]
    assert resp.status == 200 and (choice["message"]["content"] if chat else choice["text"]) == expected_text(7)
    assert obj["usage"]["completion_tokens"] == 7 and engine.requests == 3


async def test_one_tick_serves_every_open_stream_and_metrics_count_them(bench_engine) -> None:
    engine, url = await bench_engine(tpot_s=0.01)
    streams, tokens = 30, 60
    async with aiohttp.ClientSession() as session:
        async def one() -> str:
            async with session.post(url + "/v1/completions",
                                    json={"prompt": "p", "max_tokens": tokens, "stream": True}) as resp:
                return (await resp.read()).decode()

        tasks = [asyncio.create_task(one()) for _ in range(streams)]
        for _ in range(500):  # every stream started (a loaded machine may take a while to connect them)
            if engine.requests == streams:
                break
            await asyncio.sleep(0.005)
        async with session.get(url + "/metrics") as resp:
            mid = parse_metrics(await resp.text())
        bodies = await asyncio.gather(*tasks)
        async with session.get(url + "/metrics") as resp:
            end = parse_metrics(await resp.text())
    assert all(b.count('"finish_reason":null') == tokens - 1 and b.endswith("data: [DONE]\n\n") for b in bodies)
    assert mid.running == streams and mid.waiting == 0
    assert end.running == 0 and end.tpot_count == streams * (tokens - 1) and end.ttft_count == streams
    # one timer for all the streams: tokens - 1 ticks plus the spread of their starts, far below one tick
    # per stream and token (streams x (tokens - 1) = 1 770)
    assert tokens - 1 <= engine.ticks < streams * (tokens - 1) / 4
    assert engine.generation_tokens == streams * tokens


async def test_a_client_that_goes_away_leaves_no_stream(bench_engine) -> None:
    engine, url = await bench_engine(tpot_s=0.01)
    async with aiohttp.ClientSession() as session:
        resp = await session.post(url + "/v1/completions", json={"prompt": "p", "max_tokens": 10_000, "stream": True})
        await resp.content.readany()
        resp.close()
    for _ in range(100):
        if not engine.streams:
            break
        await asyncio.sleep(0.02)
    assert engine.streams == [] and engine._timer is None


async def test_tpot_zero_writes_the_whole_stream_at_once(bench_engine) -> None:
    engine, url = await bench_engine(tpot_s=0.0)
    _, _, events = await _events(url, "/v1/completions", {"prompt": "p", "max_tokens": 50, "stream": True})
    assert "".join(chunk_text(e) for e in events if isinstance(e, dict)) == expected_text(50)
    assert engine.ticks == 0 and engine.streams == []


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"prompt": "p", "max_tokens": "x"}, 400, "max_tokens"),
    ({"prompt": "p", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "p", "stream": "yes"}, 400, "stream"),
    ({"max_tokens": 3}, 400, "prompt"),
    ({"prompt": "p", "model": "other"}, 404, "model"),
])
async def test_bad_requests_name_the_field(bench_engine, body: dict[str, Any], status: int, param: str) -> None:
    engine, url = await bench_engine()
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/completions", json=body) as resp:
            obj = await resp.json()
            assert resp.status == status and obj["error"]["param"] == param
        async with session.post(url + "/v1/completions", data=b"{not json") as resp:
            assert resp.status == 400 and (await resp.json())["error"]["param"] == "body"
        # the connection and the engine still serve
        async with session.post(url + "/v1/completions", json={"prompt": "p", "max_tokens": 2}) as resp:
            assert resp.status == 200 and (await resp.json())["choices"][0]["text"] == expected_text(2)
    assert engine.requests == 1


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="tpot_s"):
        BenchEngine(tpot_s=-1)


@pytest.mark.parametrize(("main_of", "argv", "flag"), [
    ("router", ["--noop-tpot-s", "-1"], "--noop-tpot-s"),
    ("router", ["--engine", "vllm"], "--engine"),
    ("router_workers", ["--engine-tpot-s", "-0.5"], "--engine-tpot-s"),
    ("router_engine", ["serve", "--tpot-s", "-1"], "--tpot-s"),
    ("router_engine_cpu", ["--engines", "noop,other"], "--engines"),
])
def test_bench_flags_are_checked_naming_them(main_of: str, argv: list[str], flag: str, capsys: Any) -> None:
    import importlib

    main = importlib.import_module(f"greenserve.bench.{main_of}").main
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and flag in capsys.readouterr().err


def test_bench_router_starts_the_noop_engine_in_a_process(tmp_path) -> None:
    import argparse
    import urllib.request

    from greenserve.bench.router_launch import Procs, start_engine

    procs = Procs()
    try:
        url = start_engine(procs, argparse.Namespace(engine="noop", noop_tpot_s=0.005, model=None, time_scale=1.0,
                                                      max_num_seqs=8), None)
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
            assert json.loads(resp.read())["data"][0]["id"] == "noop"
        req = urllib.request.Request(url + "/v1/completions", data=json.dumps(
            {"prompt": "p", "max_tokens": 5, "stream": True}).encode(), headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read().decode()
        assert body.count('"finish_reason":null') == 4 and body.endswith("data: [DONE]\n\n")
    finally:
        procs.stop()
