"""RouterService over gRPC: Generate (chat and completion), Route, engine management, Drain/Undrain."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from greenserve.common.errors import error_detail_from_rpc_error
from greenserve.v1 import common_pb2, router_pb2


def _chat(text: str, model: str = "", session: str = "") -> router_pb2.RequestDescriptor:
    return router_pb2.RequestDescriptor(model=model, session_key=session, chat=router_pb2.ChatInput(
        messages=[router_pb2.ChatMessage(role=router_pb2.CHAT_ROLE_USER, content=text)]))


async def test_generate_chat_and_completion_stream_with_receipt(emulators, router) -> None:
    emus = await emulators(2)
    r = await router([e.url for e in emus])
    req = router_pb2.GenerateRequest(request=_chat("hello " * 50, emus[0].model),
                                     sampling=router_pb2.SamplingParams(max_tokens=10, temperature=0.5),
                                     request_id="req-1")
    msgs = [m async for m in r.stub.Generate(req)]
    assert msgs[0].engine_id and all(m.request_id == "req-1" for m in msgs)
    assert "".join(m.text_delta for m in msgs)
    last = msgs[-1]
    assert last.finish_reason == "length"
    assert last.receipt.completion_tokens == 10
    assert last.receipt.engine_id == msgs[0].engine_id
    assert last.receipt.carbon.total_g == pytest.approx(last.receipt.carbon.operational_g
                                                        + last.receipt.carbon.embodied_compute_g)
    assert last.receipt.energy_kwh > 0 and last.receipt.ttft_s > 0
    comp = router_pb2.GenerateRequest(request=router_pb2.RequestDescriptor(
        completion=router_pb2.CompletionInput(prompt="once upon a time")), sampling=router_pb2.SamplingParams(max_tokens=3))
    msgs = [m async for m in r.stub.Generate(comp)]
    assert msgs[-1].receipt.completion_tokens == 3 and msgs[-1].request_id


async def test_generate_invalid_and_unavailable(emulators, router) -> None:
    r = await router([])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [m async for m in r.stub.Generate(router_pb2.GenerateRequest())]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_detail_from_rpc_error(err.value).field == "request.input"
    bad_temp = router_pb2.GenerateRequest(request=_chat("x"), sampling=router_pb2.SamplingParams(temperature=float("nan")))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [m async for m in r.stub.Generate(bad_temp)]
    assert error_detail_from_rpc_error(err.value).field == "sampling.temperature"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [m async for m in r.stub.Generate(router_pb2.GenerateRequest(request=_chat("x")))]
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_generate_resource_exhausted_at_limit(emulators, router) -> None:
    emus = await emulators(1, time_scale=1.0)
    r = await router([emus[0].url], max_in_flight=1)
    long = router_pb2.GenerateRequest(request=_chat("x", emus[0].model), sampling=router_pb2.SamplingParams(max_tokens=500))
    call = r.stub.Generate(long)
    await call.read()  # first message: the request is in flight
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [m async for m in r.stub.Generate(long)]
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    call.cancel()
    for _ in range(100):
        if r.core.in_flight == 0 and all(e.in_flight == 0 for e in r.core.registry.engines.values()):
            break
        await asyncio.sleep(0.02)
    assert r.core.in_flight == 0, "cancelling the gRPC call must release the request"


async def test_register_list_route_deregister(emulators, router, tmp_path) -> None:
    emus = await emulators(2)
    r = await router([])
    for i, emu in enumerate(emus):
        reply = await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
            id=f"e{i}", url=emu.url, pool="chat", model=emu.model, busy_power_w=300.0)))
        assert reply.created
    again = await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
        id="e0", url=emus[0].url, pool="chat", model=emus[0].model)))
    assert not again.created
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
            id="e9", url="ftp://x", pool="p", model="m")))
    assert error_detail_from_rpc_error(err.value).field == "engine.url"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(id="e9", url=emus[0].url,
                                                                                              pool="p", model="m")))
    assert error_detail_from_rpc_error(err.value).field == "engine.url"  # same URL, other id
    await asyncio.sleep(0.3)  # a scrape and a probe
    listed = await r.stub.ListEngines(router_pb2.ListEnginesRequest(pool="chat"))
    assert [s.engine.id for s in listed.engines] == ["e0", "e1"]
    assert all(s.engine.state == common_pb2.ENGINE_STATE_HEALTHY for s in listed.engines)
    assert listed.engines[0].metrics_scraped_at.seconds > 0
    route = await r.stub.Route(router_pb2.RouteRequest(request=router_pb2.RequestDescriptor(
        pool="chat", completion=router_pb2.CompletionInput(prompt="p" * 2000))))
    assert route.engine.id in {"e0", "e1"} and "score" in route.reason
    again = await r.stub.Route(router_pb2.RouteRequest(request=router_pb2.RequestDescriptor(
        pool="chat", completion=router_pb2.CompletionInput(prompt="p" * 2000 + "more"))))
    assert again.engine.id == route.engine.id and again.expected_cached_prompt_tokens > 0
    await r.stub.DeregisterEngine(router_pb2.DeregisterEngineRequest(engine_id="e0"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await r.stub.DeregisterEngine(router_pb2.DeregisterEngineRequest(engine_id="e0"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    # registrations survive a restart (stored), the deregistered one does not
    r2 = await router([], data_dir=r.running.server.settings.data_dir)
    assert sorted(r2.core.registry.engines) == ["e1"]


async def test_drain_waits_until_idle_and_undrain(emulators, router) -> None:
    emus = await emulators(2, time_scale=5.0)
    # Load spreads the identical requests (prefix affinity would keep them all on one engine: test_affinity.py).
    r = await router([e.url for e in emus], affinity_weight=0.0)
    a, b = sorted(r.core.registry.engines)
    req = router_pb2.GenerateRequest(request=_chat("x", emus[0].model), sampling=router_pb2.SamplingParams(max_tokens=40))
    calls = [r.stub.Generate(req) for _ in range(6)]
    firsts = [await c.read() for c in calls]
    on_a = sum(1 for f in firsts if f.engine_id == a)
    assert on_a > 0
    drain = await r.stub.Drain(router_pb2.DrainRequest(engine_ids=[a], wait=False))
    assert list(drain.busy_engine_ids) == [a]
    # new work avoids the draining engine
    for _ in range(4):
        msgs = [m async for m in r.stub.Generate(req)]
        assert msgs[0].engine_id == b
    waited = await r.stub.Drain(router_pb2.DrainRequest(engine_ids=[a], wait=True, timeout_s=30))
    assert list(waited.idle_engine_ids) == [a] and not waited.busy_engine_ids
    for c in calls:  # in-flight requests on the draining engine finished normally
        last = None
        while (m := await c.read()) is not grpc.aio.EOF:
            last = m
        assert last is not None and last.receipt.completion_tokens == 40
    listed = await r.stub.ListEngines(router_pb2.ListEnginesRequest())
    assert {s.engine.id: s.engine.state for s in listed.engines}[a] == common_pb2.ENGINE_STATE_DRAINED
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await r.stub.Drain(router_pb2.DrainRequest(engine_ids=["nope"]))
    assert error_detail_from_rpc_error(err.value).field == "engine_ids[0]"
    await r.stub.Undrain(router_pb2.UndrainRequest(engine_ids=[a]))
    seen = set()
    for _ in range(6):
        msgs = [m async for m in r.stub.Generate(req)]
        seen.add(msgs[0].engine_id)
    assert a in seen
