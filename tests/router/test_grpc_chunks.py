"""Generate messages that carry several tokens: the Python client reassembles exactly the text the HTTP
front streams for the same request, and the byte scan of running token events agrees with json.loads."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from greenserve.router.upstream.dispatcher import TEXT_KEY_CHAT, TEXT_KEY_COMPLETION, chunk_text, running_text
from greenserve.v1 import router_pb2
from greenserve_client.generation import generate


async def _http_stream_text(url: str, body: dict) -> tuple[str, int]:
    """Text and token events of a streamed completion/chat through the HTTP front."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    text, events = [], 0
    async with aiohttp.ClientSession() as session, session.post(url + path, json={**body, "stream": True}) as resp:
        assert resp.status == 200, await resp.text()
        raw = (await resp.read()).decode()
    for event in raw.split("\n\n"):
        if not event.startswith("data: ") or event == "data: [DONE]":
            continue
        obj = json.loads(event[6:])
        if obj.get("choices"):
            piece = chunk_text(obj)
            text.append(piece)
            events += bool(piece)
    return "".join(text), events


@pytest.mark.parametrize("chat", [False, True])
async def test_multi_token_chunks_reassemble_to_the_http_text(emulators, router, chat: bool) -> None:
    # time_scale 20: tokens every ~1 ms, so a 50 ms interval gathers many of them per message
    (emu,) = await emulators(1)
    r = await router([emu.url], grpc_stream_interval_s=0.05)
    prompt = "Explain carbon-aware routing in one paragraph."
    if chat:
        desc = router_pb2.RequestDescriptor(model=emu.model, chat=router_pb2.ChatInput(
            messages=[router_pb2.ChatMessage(role=router_pb2.CHAT_ROLE_USER, content=prompt)]))
        body = {"model": emu.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 96}
    else:
        desc = router_pb2.RequestDescriptor(model=emu.model, completion=router_pb2.CompletionInput(prompt=prompt))
        body = {"model": emu.model, "prompt": prompt, "max_tokens": 96}
    seen: list[str] = []
    got = await generate(r.stub, router_pb2.GenerateRequest(request=desc, sampling=router_pb2.SamplingParams(
        max_tokens=96), request_id="chunks-1"), timeout_s=60, on_text=seen.append)
    want, http_tokens = await _http_stream_text(r.http, body)
    assert want and got.text == want
    assert "".join(seen) == want
    assert got.request_id == "chunks-1" and got.engine_id in r.core.registry.engines
    assert got.finish_reason == "length" and got.receipt is not None
    assert got.receipt.completion_tokens == 96
    # several tokens per message: fewer messages than tokens, every token counted once
    assert got.tokens == http_tokens == 96
    assert got.messages < got.tokens
    assert max(len(d) for d in got.deltas) > len(want) / 96 * 1.5


async def test_interval_zero_sends_one_message_per_read(emulators, router) -> None:
    (emu,) = await emulators(1, time_scale=2.0)
    r = await router([emu.url], grpc_stream_interval_s=0.0)
    desc = router_pb2.RequestDescriptor(model=emu.model, completion=router_pb2.CompletionInput(prompt="hi"))
    got = await generate(r.stub, router_pb2.GenerateRequest(request=desc, sampling=router_pb2.SamplingParams(
        max_tokens=12)), timeout_s=60)
    want, _ = await _http_stream_text(r.http, {"model": emu.model, "prompt": "hi", "max_tokens": 12})
    assert got.text == want and got.tokens == 12
    # every text message carries what one read returned: at time scale 2 tokens come ~10 ms apart
    assert got.messages >= 6


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode()


@pytest.mark.parametrize("text", ["plain", "", "line\nbreak", 'quote " and \\ slash', "tab\t\u00e9\u4e2d\U0001f600",
                                  '{"text":"nested"}', '"content":"x"', "\u2028"])
def test_running_text_scan_agrees_with_json(text: str) -> None:
    completion = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": 'm"text":"odd',
                  "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}], "usage": None}
    chat = {"id": "c-1", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}]}
    for obj, key in ((completion, TEXT_KEY_COMPLETION), (chat, TEXT_KEY_CHAT)):
        for ensure_ascii in (True, False):
            ev = b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=ensure_ascii).encode()
            assert running_text(ev, key) == chunk_text(obj)


def test_running_text_declines_what_it_cannot_place() -> None:
    choice = {"index": 0, "text": "a", "logprobs": None, "finish_reason": None}
    base = {"id": "x", "object": "text_completion", "created": 0, "model": "m"}
    # final chunks, usage chunks, several choices, an error, [DONE], a chat chunk without content: decoded instead
    assert running_text(_event({**base, "choices": [{**choice, "finish_reason": "length"}]}), TEXT_KEY_COMPLETION) \
        is None
    assert running_text(_event({**base, "choices": [], "usage": {"completion_tokens": 1}}), TEXT_KEY_COMPLETION) is None
    assert running_text(_event({**base, "choices": [choice, {**choice, "index": 1}]}), TEXT_KEY_COMPLETION) is None
    assert running_text(_event({"error": {"message": "boom"}}), TEXT_KEY_COMPLETION) is None
    assert running_text(b"data: [DONE]", TEXT_KEY_COMPLETION) is None
    assert running_text(b": keep-alive", TEXT_KEY_COMPLETION) is None
    tool = {**base, "choices": [{"index": 0, "delta": {"tool_calls": []}, "finish_reason": None}]}
    assert running_text(_event(tool), TEXT_KEY_CHAT) is None
    # a multi-line data event is left to the full parser
    assert running_text(b'data: {"choices":[{"text":"a",\ndata: "finish_reason":null}]}', TEXT_KEY_COMPLETION) is None


async def test_http_token_chunks_are_forwarded_from_the_protocol_callback(emulators, router, monkeypatch) -> None:
    """Running token chunks go to the client from the engine connection's data_received (http_front._Forwarder,
    the response's raw_sink), and a client that starts reading only after the engine has sent most of a long
    stream still gets every event once, in order, with one receipt."""
    from greenserve.router.front import http_front

    forwarded = []
    original = http_front._Forwarder.__call__

    def counting(self: http_front._Forwarder, data: bytes, chunks: int) -> bool:
        done = original(self, data, chunks)
        if done:
            forwarded.append(len(data))
        return done

    monkeypatch.setattr(http_front._Forwarder, "__call__", counting)
    (emu,) = await emulators(1, time_scale=50.0)
    r = await router([emu.url])
    body = {"model": emu.model, "prompt": "hello", "max_tokens": 64}
    want, events = await _http_stream_text(r.http, body)
    assert events == 64 and forwarded, "no token chunk took the forwarding path"
    # a late reader: ~3000 tokens (~400 KB of SSE) pile up before it reads anything
    forwarded.clear()
    big = {**body, "max_tokens": 3000, "stream": True}
    async with aiohttp.ClientSession() as session, session.post(r.http + "/v1/completions", json=big) as resp:
        await asyncio.sleep(1.0)
        raw = (await resp.read()).decode()
    chunks = [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]
    texts = [chunk_text(c) for c in chunks if c.get("choices")]
    assert len([t for t in texts if t]) == 3000
    assert raw.rstrip().endswith("data: [DONE]") and raw.count("data: [DONE]") == 1
    direct, _ = await _http_stream_text(emu.url, {**body, "max_tokens": 3000})
    assert "".join(texts) == direct
    receipts = [c["greenserve"] for c in chunks if "greenserve" in c]
    assert len(receipts) == 1 and receipts[0]["completion_tokens"] == 3000
