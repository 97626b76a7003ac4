"""Issue 21 on the router's HTTP front: the same credentials as gRPC (token, TLS, mTLS), limits against slow
or greedy clients (connections, header/body timeouts, keep-alive), size and admission before the body is
read, deeply nested JSON as a 400, and client disconnects logged at INFO."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import traceback

import aiohttp
import grpc
import pytest
from greenserve.router.front.http_guard import bearer_matches
from greenserve.v1 import router_pb2


async def _raw(port: int, data: bytes, *, read_timeout_s: float = 5.0) -> bytes:
    """Sends ``data`` on a fresh connection and returns the first response (head and body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()

        async def response() -> bytes:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            return head + await reader.readexactly(length)

        return await asyncio.wait_for(response(), read_timeout_s)
    finally:
        writer.close()


def test_bearer_matching_rules() -> None:
    assert bearer_matches("Bearer s3cret", "s3cret")
    assert bearer_matches("bearer s3cret", "s3cret") and bearer_matches("BEARER  s3cret ", "s3cret")
    assert not bearer_matches("Bearer s3cre", "s3cret")
    assert not bearer_matches("Basic s3cret", "s3cret")
    assert not bearer_matches("s3cret", "s3cret")
    assert not bearer_matches("", "s3cret") and not bearer_matches(None, "s3cret")
    # during a rotation both tokens are accepted
    assert bearer_matches("Bearer old", ["new", "old"]) and bearer_matches("Bearer new", ["new", "old"])
    assert not bearer_matches("Bearer other", ["new", "old"])


async def test_a_token_that_is_not_utf8_is_a_401(router) -> None:
    """aiohttp reads header bytes that are not UTF-8 as surrogates; the token check encoded them again with
    str.encode() and the UnicodeEncodeError made every such request a 500 (found by an adversarial audit)."""
    r = await router([], auth_token="s3cret")
    port = r.servicer.http.port
    for credentials in (b"\xff\xfe", b"s3cret\xe9", b"s3cret\xc3"):
        reply = await _raw(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + credentials
                           + b"\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 401 "), (credentials, reply[:80])
    assert not bearer_matches("Bearer s3cret\udce9", "s3cret")
    assert bearer_matches("Bearer s3cr\u00e9t", "s3cr\u00e9t")


async def test_http_front_requires_the_token_like_grpc(emulators, router) -> None:
    emus = await emulators(1)
    r = await router([emus[0].url], auth_token="s3cret")
    body = {"model": emus[0].model, "prompt": "x", "max_tokens": 2}
    async with aiohttp.ClientSession() as s:
        for path in ("/v1/models", "/metrics"):
            async with s.get(r.http + path) as resp:
                assert resp.status == 401, path
                err = (await resp.json())["error"]
                assert "missing bearer token" in err["message"] and err["code"] == "invalid_api_key"
                assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        for header in ("Bearer wrong", "Basic s3cret", "s3cret"):
            async with s.post(r.http + "/v1/completions", json=body, headers={"Authorization": header}) as resp:
                assert resp.status == 401, header
        async with s.post(r.http + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 401
        # health stays open for probes
        async with s.get(r.http + "/health") as resp:
            assert resp.status in (200, 503)
        # the OpenAI scheme in any case
        for header in ("Bearer s3cret", "bearer s3cret"):
            async with s.post(r.http + "/v1/completions", json=body, headers={"Authorization": header}) as resp:
                assert resp.status == 200, await resp.text()
        async with s.get(r.http + "/metrics", headers={"Authorization": "Bearer s3cret"}) as resp:
            assert resp.status == 200
    # and the gRPC side of the same router still refuses a caller without it
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await r.stub.ListEngines(router_pb2.ListEnginesRequest())
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_token_file_is_read_for_the_http_front(router, tmp_path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\nprevious\n")  # a rotation: both accepted
    r = await router([], auth_token="ignored", auth_token_file=str(token_file))
    async with aiohttp.ClientSession() as s:
        async with s.get(r.http + "/v1/models", headers={"Authorization": "Bearer ignored"}) as resp:
            assert resp.status == 401
        for token in ("from-file", "previous"):
            async with s.get(r.http + "/v1/models", headers={"Authorization": f"Bearer {token}"}) as resp:
                assert resp.status == 200


async def test_http_front_serves_tls_and_requires_client_certificates(router, tls_files) -> None:
    r = await router([], tls_cert=str(tls_files.server_cert), tls_key=str(tls_files.server_key),
                     tls_client_ca=str(tls_files.ca_cert))
    port = r.servicer.http.port
    url = f"https://127.0.0.1:{port}/v1/models"
    # plaintext is refused
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientError):
            async with s.get(f"http://127.0.0.1:{port}/v1/models") as resp:
                await resp.read()
    # TLS without a client certificate: the handshake fails (mTLS)
    no_cert = ssl.create_default_context(cafile=str(tls_files.ca_cert))
    async with aiohttp.ClientSession() as s:
        with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
            async with s.get(url, ssl=no_cert) as resp:
                await resp.read()
    # a certificate from the test CA is let in
    with_cert = ssl.create_default_context(cafile=str(tls_files.ca_cert))
    with_cert.load_cert_chain(str(tls_files.client_cert), str(tls_files.client_key))
    async with aiohttp.ClientSession() as s:
        async with s.get(url, ssl=with_cert) as resp:
            assert resp.status == 200
            assert (await resp.json())["object"] == "list"


async def test_slow_heads_are_cut_and_the_connection_cap_answers_503(router) -> None:
    r = await router([], http_header_timeout_s=0.5, http_max_connections=4)
    port = r.servicer.http.port
    # a slowloris: four connections that never finish their request head
    slow = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
    for _, writer in slow:
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        await writer.drain()
    await asyncio.sleep(0.1)
    # the cap: a fifth connection gets a 503 and is closed, nothing it sends is read
    refused = await _raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert refused.startswith(b"HTTP/1.1 503") and b"connection limit" in refused
    # the head timeout closes the slow ones (EOF), after which an honest client gets in
    for reader, writer in slow:
        assert await asyncio.wait_for(reader.read(), 5.0) == b""
        writer.close()
    async with aiohttp.ClientSession() as s:
        async with s.get(r.http + "/v1/models") as resp:
            assert resp.status == 200
    assert r.servicer.http.guard.head_timeouts >= 4 and r.servicer.http.guard.refused >= 1
    async with aiohttp.ClientSession() as s:
        async with s.get(r.http + "/metrics") as resp:
            metrics = await resp.text()
    assert "greenserve_router_http_connections_refused 1.0" in metrics
    assert "greenserve_router_http_head_timeouts 4.0" in metrics


async def test_keepalive_request_limit_and_body_timeout(router) -> None:
    r = await router([], http_max_requests_per_connection=2, http_body_timeout_s=0.5)
    async with aiohttp.ClientSession() as s:
        async with s.get(r.http + "/v1/models") as resp:
            await resp.read()
            assert resp.headers.get("Connection", "").lower() != "close"
        async with s.get(r.http + "/v1/models") as resp:
            await resp.read()
            assert resp.headers.get("Connection", "").lower() == "close"
    # a body that never arrives in full: 408 after the body timeout
    reply = await _raw(r.servicer.http.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                       b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":")
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]


async def test_body_size_and_admission_are_checked_before_the_body_is_read(router) -> None:
    r = await router([], http_max_body_bytes=4096, http_body_timeout_s=30)
    port = r.servicer.http.port
    # a declared size over the limit: 413 at once, without waiting for (or reading) the body
    reply = await _raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 173000000\r\n\r\n",
                       read_timeout_s=3.0)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"4096 bytes" in reply
    # a chunked body that passes the limit is cut off with 413 too
    async def chunks():
        for _ in range(10):
            yield b"x" * 1024

    async with aiohttp.ClientSession() as s:
        async with s.post(r.http + "/v1/completions", data=chunks()) as resp:
            assert resp.status == 413
            assert "4096 bytes" in (await resp.json())["error"]["message"]
    # at the in-flight limit the request is refused before its body is read: the 429 comes back
    # although the body was never sent
    r.core.in_flight = r.core.config.max_in_flight
    try:
        reply = await _raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                           b"Connection: close\r\n\r\n", read_timeout_s=3.0)
    finally:
        r.core.in_flight = 0
    assert reply.startswith(b"HTTP/1.1 429"), reply[:200]


async def test_body_bytes_in_flight_are_capped(router) -> None:
    r = await router([], http_max_body_bytes=4096, http_max_body_bytes_in_flight=6000, http_body_timeout_s=30)
    port = r.servicer.http.port
    # a request whose 3000-byte body is on its way holds 3000 bytes of the budget
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3000\r\n\r\n")
    await writer.drain()
    for _ in range(50):
        if r.servicer.http.body_bytes_in_flight:
            break
        await asyncio.sleep(0.02)
    assert r.servicer.http.body_bytes_in_flight == 3000
    try:
        reply = await _raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4000\r\n"
                           b"Connection: close\r\n\r\n" + b"x" * 4000)
        assert reply.startswith(b"HTTP/1.1 429") and b"6000 bytes" in reply, reply[:300]
        # one that fits the rest of the budget goes through (to a 400: it is not JSON)
        reply = await _raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n"
                           b"Connection: close\r\n\r\n" + b"x" * 2000)
        assert reply.startswith(b"HTTP/1.1 400"), reply[:300]
    finally:
        writer.close()
    for _ in range(100):
        if not r.servicer.http.body_bytes_in_flight:
            break
        await asyncio.sleep(0.02)
    assert r.servicer.http.body_bytes_in_flight == 0


async def test_grpc_generate_over_the_message_limit_is_resource_exhausted(router) -> None:
    r = await router([], max_message_bytes=64 * 1024)
    request = router_pb2.GenerateRequest(request=router_pb2.RequestDescriptor(
        completion=router_pb2.CompletionInput(prompt="x" * 100_000)))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in r.stub.Generate(request):
            pass
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(64 * 1024) in info.value.details()
    # at the in-flight limit: RESOURCE_EXHAUSTED naming the limit
    r.core.in_flight = r.core.config.max_in_flight
    try:
        small = router_pb2.GenerateRequest(request=router_pb2.RequestDescriptor(
            completion=router_pb2.CompletionInput(prompt="hi")))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in r.stub.Generate(small):
                pass
    finally:
        r.core.in_flight = 0
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(r.core.config.max_in_flight) in info.value.details()


def _nested(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("payload", [
    b"[" * 100_000 + b"]" * 100_000,  # past the parser's own recursion limit (was a 500)
    b'{"a":' * 70 + b"1" + b"}" * 70,  # 70 levels of objects
    json.dumps({"model": "m", "prompt": "x", "x": _nested(64)}).encode(),  # 65 levels inside a real request
])
async def test_deeply_nested_json_is_a_400(router, payload: bytes) -> None:
    r = await router([])
    async with aiohttp.ClientSession() as s:
        async with s.post(r.http + "/v1/completions", data=payload,
                          headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 400, await resp.text()
            assert "nested deeper than 64 levels" in (await resp.json())["error"]["message"]


async def test_client_disconnect_is_logged_at_info(emulators, router, caplog) -> None:
    # fast tokens, callers that leave at once or a little later: the router meets the closed connection
    # both while it waits (its handler is cancelled) and while it writes (ConnectionResetError)
    emus = await emulators(1, time_scale=50.0)
    r = await router([emus[0].url])
    caplog.set_level(logging.INFO)
    for i in range(12):
        async with aiohttp.ClientSession() as s:
            resp = await s.post(r.http + "/v1/completions", json={"model": emus[0].model, "prompt": "hello",
                                                                  "max_tokens": 5000, "stream": True})
            await resp.content.readline()
            await asyncio.sleep(0.02 * (i % 4))
            resp.close()
    # the same over gRPC: a caller cancelling its Generate stream
    for _ in range(4):
        call = r.stub.Generate(router_pb2.GenerateRequest(request=router_pb2.RequestDescriptor(
            model=emus[0].model, completion=router_pb2.CompletionInput(prompt="hello")),
            sampling=router_pb2.SamplingParams(max_tokens=5000)))
        await call.read()
        call.cancel()
    engine = next(iter(r.core.registry.engines.values()))
    for _ in range(100):
        if engine.in_flight == 0:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    assert engine.in_flight == 0

    def from_router(rec: logging.LogRecord) -> bool:  # the emulated engine logs through aiohttp.server too
        text = rec.exc_text or ("".join(traceback.format_exception(*rec.exc_info)) if rec.exc_info else "")
        return rec.name.startswith(("greenserve.router", "greenserve.server")) or "services/router/" in text

    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR and from_router(rec)]
    assert not errors, [(rec.name, rec.getMessage()) for rec in errors]
    infos = [rec for rec in caplog.records if rec.levelno == logging.INFO and rec.getMessage() == "client disconnected"]
    assert len(infos) == 12
