"""A pool the router does not know is the caller's error, answered like vLLM answers an unknown model (HTTP 404,
an OpenAI-style error naming the header; gRPC NOT_FOUND naming request.pool), never 503 / UNAVAILABLE, which
clients and gateways retry forever. A known pool with no routable engine right now still gets 503 / UNAVAILABLE."""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
import pytest
from greenserve.common.errors import error_detail_from_rpc_error
from greenserve.v1 import common_pb2, router_pb2


def _generate(pool: str, model: str) -> router_pb2.GenerateRequest:
    return router_pb2.GenerateRequest(request=router_pb2.RequestDescriptor(
        pool=pool, model=model, completion=router_pb2.CompletionInput(prompt="hello")),
        sampling=router_pb2.SamplingParams(max_tokens=2))


async def test_http_unknown_pool_is_404_and_known_pool_without_engine_is_503(emulators, router) -> None:
    emus = await emulators(1)
    r = await router([emus[0].url])  # --engines: pool "default"
    body = {"model": emus[0].model, "prompt": "x", "max_tokens": 2}
    async with aiohttp.ClientSession() as s:
        async with s.post(r.http + "/v1/completions", json=body, headers={"x-greenserve-pool": "nope"}) as resp:
            assert resp.status == 404
            assert "Retry-After" not in resp.headers
            err = (await resp.json())["error"]
        assert err["type"] == "NotFoundError" and err["code"] == 404 and err["param"] == "x-greenserve-pool"
        assert "'nope'" in err["message"] and "does not exist" in err["message"]
        # a header value of kilobytes is not echoed whole
        async with s.post(r.http + "/v1/completions", json=body, headers={"x-greenserve-pool": "p" * 6000}) as resp:
            assert resp.status == 404
            assert len((await resp.json())["error"]["message"]) < 1200
        async with s.post(r.http + "/v1/completions", json=body, headers={"x-greenserve-pool": "default"}) as resp:
            assert resp.status == 200
        # a known pool whose only engine is draining: no routable engine right now, 503 with Retry-After
        engine = next(iter(r.core.registry.engines.values()))
        engine.draining = True
        async with s.post(r.http + "/v1/completions", json=body, headers={"x-greenserve-pool": "default"}) as resp:
            assert resp.status == 503 and resp.headers["Retry-After"] == "1"
        # a pool the fleet inventory names, with no engine registered yet: known, 503
        r.core.plans.apply_fleet(common_pb2.FleetInventory(pools=[common_pb2.Pool(name="planned", region="eu")]))
        async with s.post(r.http + "/v1/completions", json=body, headers={"x-greenserve-pool": "planned"}) as resp:
            assert resp.status == 503
        async with s.get(r.http + "/metrics") as resp:
            text = await resp.text()
    assert 'greenserve_router_requests_total{outcome="unknown_pool",protocol="http"} 2.0' in text


async def test_grpc_unknown_pool_is_not_found_and_known_pool_without_engine_is_unavailable(emulators, router) -> None:
    emus = await emulators(1)
    r = await router([emus[0].url])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [m async for m in r.stub.Generate(_generate("nope", emus[0].model))]
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_detail_from_rpc_error(err.value).field == "request.pool"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await r.stub.Route(router_pb2.RouteRequest(request=_generate("nope", emus[0].model).request))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_detail_from_rpc_error(err.value).field == "request.pool"
    msgs = [m async for m in r.stub.Generate(_generate("default", emus[0].model))]
    assert msgs[-1].finish_reason
    next(iter(r.core.registry.engines.values())).draining = True
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [m async for m in r.stub.Generate(_generate("default", emus[0].model))]
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await r.stub.Route(router_pb2.RouteRequest(request=_generate("default", emus[0].model).request))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_unknown_model_is_404_when_the_engines_serve_several_known_models(emulators, router) -> None:
    """No pool given, two engines of two models: a third model is the caller's error (404 naming `model`, gRPC
    NOT_FOUND naming request.model), as vLLM answers it; either known model is routed to its engine."""
    emus = [*(await emulators(1, model="model-a")), *(await emulators(1, model="model-b"))]
    r = await router([e.url for e in emus])
    for _ in range(100):  # the engines' models come from their /v1/models
        if sorted(r.core.registry.models()) == ["model-a", "model-b"]:
            break
        await asyncio.sleep(0.05)
    assert sorted(r.core.registry.models()) == ["model-a", "model-b"]
    async with aiohttp.ClientSession() as s:
        for model in ("model-a", "model-b"):
            async with s.post(r.http + "/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 2}) as resp:
                assert resp.status == 200, await resp.text()
        async with s.post(r.http + "/v1/completions", json={"model": "model-c", "prompt": "x", "max_tokens": 2}) as resp:
            assert resp.status == 404 and "Retry-After" not in resp.headers
            err = (await resp.json())["error"]
        assert err["type"] == "NotFoundError" and err["param"] == "model" and "'model-c'" in err["message"]
    with pytest.raises(grpc.aio.AioRpcError) as rpc_err:
        _ = [m async for m in r.stub.Generate(_generate("", "model-c"))]
    assert rpc_err.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_detail_from_rpc_error(rpc_err.value).field == "request.model"
    with pytest.raises(grpc.aio.AioRpcError) as rpc_err:
        await r.stub.Route(router_pb2.RouteRequest(request=_generate("", "model-c").request))
    assert rpc_err.value.code() == grpc.StatusCode.NOT_FOUND
    # a known model whose engine is draining: no engine up now, 503
    next(e for e in r.core.registry.engines.values() if e.model == "model-a").draining = True
    with pytest.raises(grpc.aio.AioRpcError) as rpc_err:
        _ = [m async for m in r.stub.Generate(_generate("", "model-a"))]
    assert rpc_err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_one_model_takes_any_model_name(emulators, router) -> None:
    """With one model registered the router does not judge the name: the engine answers for itself (vLLM's 404)."""
    emus = await emulators(1, model="model-a")
    r = await router([emus[0].url])
    async with aiohttp.ClientSession() as s:
        async with s.post(r.http + "/v1/completions", json={"model": "other", "prompt": "x", "max_tokens": 2}) as resp:
            assert resp.status == 404
    assert r.core.registry.model_unknown("other") is False
