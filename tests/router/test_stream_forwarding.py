"""The byte-level forwarding of SSE streams (http_front's fast path) against an engine that cuts its
stream at arbitrary byte boundaries and uses CRLF line endings: every token arrives once, in order,
the final chunk carries the receipt, and [DONE] ends the stream. The emulator always writes whole
events, so a small real HTTP server plays the engine here."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web
from greenserve.router.front.http_front import _FINISH_KEY, _RUNNING, _USAGE_NULL

from tests.router.engine_conn_fakes import start_fake_engine

TOKENS = [f"tok{i} " for i in range(40)]


def _events(crlf: bool, include_usage: bool) -> bytes:
    nl = "\r\n\r\n" if crlf else "\n\n"
    usage_null = ',"usage":null' if include_usage else ""
    out = []
    for i, tok in enumerate(TOKENS):
        reason = '"length"' if i == len(TOKENS) - 1 else "null"
        out.append('data: {"id":"cmpl-1","object":"text_completion","created":0,"model":"m","choices":[{"index":0,'
                   f'"text":{json.dumps(tok)},"logprobs":null,"finish_reason":{reason},"stop_reason":null}}]'
                   f"{usage_null}}}{nl}")
    if include_usage:
        out.append('data: {"id":"cmpl-1","object":"text_completion","created":0,"model":"m","choices":[],'
                   f'"usage":{{"prompt_tokens":3,"total_tokens":{3 + len(TOKENS)},"completion_tokens":{len(TOKENS)}}}}}{nl}')
    out.append(f"data: [DONE]{nl}")
    return "".join(out).encode()


async def _start_engine(piece_bytes: int, crlf: bool) -> tuple[web.AppRunner, str]:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        data = _events(crlf, include_usage)
        for i in range(0, len(data), piece_bytes):
            await resp.write(data[i : i + piece_bytes])
            await asyncio.sleep(0)  # separate reads on the router's side, mostly
        await resp.write_eof()
        return resp

    return await start_fake_engine(completions)


@pytest.mark.parametrize(("piece_bytes", "crlf"), [(7, False), (113, True), (1 << 20, False)])
async def test_stream_cut_anywhere_is_forwarded_whole_with_receipt(router, piece_bytes: int, crlf: bool) -> None:
    runner, url = await _start_engine(piece_bytes, crlf)
    try:
        r = await router([url])
        for want_usage in (False, True):
            body = {"model": "m", "prompt": "hello", "max_tokens": len(TOKENS), "stream": True}
            if want_usage:
                body["stream_options"] = {"include_usage": True}
            async with aiohttp.ClientSession() as s, s.post(r.http + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                raw = await resp.read()
            events = [e for e in raw.replace(b"\r\n", b"\n").split(b"\n\n") if e]
            assert events[-1] == b"data: [DONE]"
            chunks = [json.loads(e[6:]) for e in events[:-1]]
            text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
            assert text == "".join(TOKENS)  # every token once, in order
            last = chunks[-1]
            assert last["greenserve"]["completion_tokens"] == len(TOKENS)
            assert ("usage" in last and not last["choices"]) if want_usage else \
                last["choices"][0]["finish_reason"] == "length"
            assert sum(1 for c in chunks if "greenserve" in c) == 1
    finally:
        await runner.cleanup()


def test_fast_path_markers_only_match_keys() -> None:
    """A token whose text spells a marker is JSON-escaped, so it cannot look like a key."""
    ev = b'data: {"choices":[{"text":' + json.dumps('"finish_reason":"stop" "usage":{}').encode() + \
        b',"finish_reason":null}],"usage":null}'
    assert ev.count(_FINISH_KEY) == ev.count(_RUNNING) == 1
    assert ev.count(b'"usage"') == ev.count(_USAGE_NULL) == 1
