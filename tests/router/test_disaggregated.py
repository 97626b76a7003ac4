"""DPD pairs behind the router (issue 19): one registered engine with a prefill URL; each request goes to the
prefiller with max_tokens 1, then streams from the decoder; a failing prefill step fails the request cleanly."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from greenserve.router.upstream.disaggregated import PrefillFailed, prefill_body
from greenserve.simulator.emulator.modes import ModeSettings
from greenserve.v1 import common_pb2, router_pb2


class FakePrefiller:
    """Records the bodies it gets; answers like vLLM (one token) or with the status it is told."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.status = 200
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        if self.status != 200:
            return web.json_response({"error": {"message": "no"}}, status=self.status)
        return web.json_response({"id": "p", "object": "text_completion", "model": "m",
                                  "choices": [{"index": 0, "text": "x", "finish_reason": "length"}]})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        app.router.add_post("/v1/chat/completions", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"


@pytest.fixture
async def prefiller() -> AsyncIterator[FakePrefiller]:
    fake = FakePrefiller()
    await fake.start()
    yield fake
    assert fake.runner is not None
    await fake.runner.cleanup()


def test_prefill_body_asks_one_token_not_streamed() -> None:
    body = json.dumps({"model": "m", "messages": [], "max_tokens": 50, "max_completion_tokens": 50,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    assert json.loads(prefill_body(body)) == {"model": "m", "messages": [], "max_tokens": 1,
                                              "max_completion_tokens": 1, "stream": False}
    with pytest.raises(PrefillFailed, match="not JSON"):
        prefill_body(b"{")
    spec = {"receiver_host": "10.0.0.9", "receiver_init_port": [7300], "receiver_alloc_port": [7400]}
    first, second = (json.loads(prefill_body(body, json.dumps({"disagg_spec": spec})))["kv_transfer_params"]
                     for _ in range(2))
    assert {k: v for k, v in first["disagg_spec"].items() if k != "req_id"} == spec
    assert first["disagg_spec"]["req_id"] != second["disagg_spec"]["req_id"], "one req_id per request"


async def _register(r: Any, engine_id: str, url: str, prefill_url: str, model: str, params: str = "") -> None:
    await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
        id=engine_id, url=url, prefill_url=prefill_url, pool="default", model=model,
        kind=common_pb2.ENGINE_KIND_SIMULATED, prefill_kv_transfer_params=params)))


async def _stream_text(s: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, str]:
    text = []
    async with s.post(url, json=body) as resp:
        if resp.status != 200:
            return resp.status, (await resp.read()).decode()
        async for line in resp.content:
            if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
                obj = json.loads(line[6:])
                text.append(obj["choices"][0].get("text", "") if obj.get("choices") else "")
    return 200, "".join(text)


async def test_a_request_prefills_on_the_prefiller_then_streams_from_the_decoder(emulators, router,
                                                                                 prefiller) -> None:
    (decoder,) = await emulators(1, serving_mode=ModeSettings("dpd", pd_role="decode"))
    r = await router()
    params = json.dumps({"disagg_spec": {"receiver_host": "127.0.0.1", "receiver_init_port": [7300],
                                         "receiver_alloc_port": [7400]}})
    await _register(r, "pair-1", decoder.url, prefiller.url, decoder.model, params)
    listed = await r.stub.ListEngines(router_pb2.ListEnginesRequest())
    assert [(e.engine.prefill_url, e.engine.prefill_kv_transfer_params) for e in listed.engines] == [
        (prefiller.url, params)]
    body = {"model": decoder.model, "prompt": "hello " * 30, "max_tokens": 12, "stream": True,
            "stream_options": {"include_usage": True}}
    async with aiohttp.ClientSession() as s:
        status, text = await _stream_text(s, r.http + "/v1/completions", body)
    assert status == 200, text
    assert text, "the decoder streamed the text"
    assert len(prefiller.bodies) == 1
    sent = prefiller.bodies[0]
    assert sent["max_tokens"] == 1 and sent["stream"] is False and "stream_options" not in sent
    assert sent["prompt"] == body["prompt"]
    assert sent["kv_transfer_params"]["disagg_spec"]["receiver_init_port"] == [7300]
    assert sent["kv_transfer_params"]["disagg_spec"]["req_id"]
    assert decoder.metrics.generation_tokens == 12, "the decoder generated the whole answer"


async def test_a_failing_prefill_step_fails_the_request_cleanly(emulators, router, prefiller) -> None:
    (decoder,) = await emulators(1, serving_mode=ModeSettings("dpd", pd_role="decode"))
    r = await router()
    await _register(r, "pair-1", decoder.url, prefiller.url, decoder.model)
    body = {"model": decoder.model, "prompt": "hi", "max_tokens": 4, "stream": True}
    async with aiohttp.ClientSession() as s:
        prefiller.status = 500  # the prefiller fails: the attempt fails, no engine left -> 503, not 500
        status, text = await _stream_text(s, r.http + "/v1/completions", body)
        assert status == 503 and "prefiller" in text, text
        prefiller.status = 400  # the request's own fault: the prefiller's answer goes back as is
        status, text = await _stream_text(s, r.http + "/v1/completions", body)
        assert status == 400, text
    assert decoder.metrics.generation_tokens == 0, "nothing reached the decoder"


async def test_register_engine_checks_the_prefill_url(emulators, router) -> None:
    (decoder,) = await emulators(1)
    r = await router()
    for bad in ("ftp://x:1", decoder.url):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _register(r, "pair-1", decoder.url, bad, decoder.model)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "engine.prefill_url" in (err.value.details() or "")
    for prefill_url, params in (("http://127.0.0.1:1", "[1]"), ("http://127.0.0.1:1", '{"disagg_spec": 3}'),
                                ("", "{}")):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _register(r, "pair-1", decoder.url, prefill_url, decoder.model, params)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "engine.prefill_kv_transfer_params" in (err.value.details() or "")
    assert not (await r.stub.ListEngines(router_pb2.ListEnginesRequest())).engines


def test_the_emulated_decoder_receives_the_kv_cache_instead_of_prefilling() -> None:
    """Modelled seconds (not wall clock): a 2,000-token prompt on the decoder of a pair costs its KV transfer over
    the link, not a prefill; its decode steps are the profile's."""
    from greenserve.simulator.emulator.modes import PdDecodeTimer, make_timer
    from greenserve.simulator.emulator.pacing import StepTimer
    from greenserve.simulator.engine_profile import load_profile
    from greenserve.simulator.perf_model import PerfModel

    model = PerfModel(load_profile("llama2-7b@V100"))
    settings = ModeSettings("dpd", pd_role="decode", link_bandwidth_bytes_per_s=2e9)
    decoder = make_timer(model, settings)
    assert isinstance(decoder, PdDecodeTimer)
    assert type(make_timer(model, ModeSettings("dpd", pd_role="prefill"))) is StepTimer
    received_s, _ = decoder.step([(2000, 0)], 0, 0)
    assert received_s == pytest.approx(model.kv_transfer_time_s(2000, 2e9))
    prefill_s, _ = StepTimer(model).step([(2000, 0)], 0, 0)
    assert received_s != pytest.approx(prefill_s)
    assert decoder.step([], 8, 8000) == StepTimer(model).step([], 8, 8000)
    with pytest.raises(ValueError, match="pd_role"):
        ModeSettings("standalone", pd_role="decode").validate()
    with pytest.raises(ValueError, match="pd_role"):
        ModeSettings("dpd", pd_role="both").validate()


async def test_the_emulated_prefiller_answers_one_token(emulators) -> None:
    (pre,) = await emulators(1, serving_mode=ModeSettings("dpd", pd_role="prefill"))
    async with aiohttp.ClientSession() as s, s.post(pre.url + "/v1/completions", json={
            "model": pre.model, "prompt": "hello " * 20, "max_tokens": 40}) as resp:
        answer = await resp.json()
    assert resp.status == 200 and answer["usage"]["completion_tokens"] == 1
