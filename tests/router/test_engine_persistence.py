"""Issue 21, defect 3: a restarted router knows everything it knew about its engines (MIG and GPU UUIDs,
kind, power, drain), and a malformed engine is refused before anything is stored."""

from __future__ import annotations

import grpc
import pytest
from greenserve.router.core import RouterCore
from greenserve.router.settings import RouterSettings
from greenserve.v1 import common_pb2, router_pb2


def _facts(status: router_pb2.EngineStatus) -> tuple:
    e = status.engine
    return (e.id, e.url, e.pool, e.model, e.kind, e.gpu_uuid, e.mig_uuid, e.idle_power_w, e.busy_power_w)


async def test_restart_keeps_engine_facts_and_drain(router) -> None:
    r = await router([])
    mig = "MIG-4b1c8f4e-1d2a-5c6b-9e8f-0a1b2c3d4e5f"
    gpu = "GPU-0d6a2b1e-7f3c-4e5d-8a9b-1c2d3e4f5a6b"
    await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
        id="e-mig", url="http://10.0.0.5:8000", pool="chat", model="m-8b", kind=common_pb2.ENGINE_KIND_SIMULATED,
        gpu_uuid=gpu, mig_uuid=mig, idle_power_w=61.5, busy_power_w=212.25)))
    await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
        id="e-plain", url="http://10.0.0.6:8000", pool="chat", model="m-8b")))
    await r.stub.Drain(router_pb2.DrainRequest(engine_ids=["e-mig"]))
    before = (await r.stub.ListEngines(router_pb2.ListEnginesRequest())).engines
    assert _facts(before[0])[5:7] == (gpu, mig)
    await r.running.server.stop(0)

    again = await router([])  # same data directory, same database
    after = (await again.stub.ListEngines(router_pb2.ListEnginesRequest())).engines
    assert [_facts(s) for s in after] == [_facts(s) for s in before]
    states = {s.engine.id: s.engine.state for s in after}
    assert states["e-mig"] == common_pb2.ENGINE_STATE_DRAINED
    assert states["e-plain"] != common_pb2.ENGINE_STATE_DRAINED
    mine = again.core.registry.engines["e-mig"]
    assert (mine.idle_power_w, mine.busy_power_w, mine.kind) == (61.5, 212.25, common_pb2.ENGINE_KIND_SIMULATED)


@pytest.mark.parametrize("field,value", [("mig_uuid", "M" * 97), ("gpu_uuid", "G" * 97), ("pool", "p" * 129),
                                         ("model", "m" * 256), ("url", "http://h:1/" + "u" * 600), ("kind", 7),
                                         # the name rule (common/names.py): an id with a newline was stored and
                                         # every request routed to it then lost its connection (the id goes out
                                         # in the x-greenserve-engine response header; found by an adversarial
                                         # audit)
                                         ("id", "evil id\n"), ("id", "\U0001f642"), ("id", " e1"), ("id", "-e1"),
                                         ("pool", "p\n"), ("pool", "a/b"), ("model", "m\x00"),
                                         ("model", "m\r\nx: y"), ("gpu_uuid", "GPU-1\n"), ("mig_uuid", "MIG\t1")])
async def test_malformed_engine_is_refused_and_nothing_is_stored(router, field: str, value: object) -> None:
    r = await router([])
    engine = common_pb2.Engine(id="e1", url="http://10.0.0.5:8000", pool="p", model="m")
    setattr(engine, field, value)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=engine))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"engine.{field}" in info.value.details()
    assert not r.core.registry.engines
    assert not (await r.stub.ListEngines(router_pb2.ListEnginesRequest())).engines


async def test_a_failed_write_leaves_the_registry_unchanged(router, monkeypatch) -> None:
    """The database is written first: when it fails, the caller gets an error and the router does not
    route to an engine a restart would not know (nor forget one a restart would bring back)."""
    r = await router([])
    engine = common_pb2.Engine(id="e1", url="http://10.0.0.5:8000", pool="p", model="m")
    await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=engine))

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(RouterCore, "_persist_engine", broken)
    monkeypatch.setattr(RouterCore, "delete_engine_row", broken)
    monkeypatch.setattr(RouterCore, "_persist_draining", broken)
    other = common_pb2.Engine(id="e2", url="http://10.0.0.6:8000", pool="p", model="m")
    for call in (r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=other)),
                 r.stub.DeregisterEngine(router_pb2.DeregisterEngineRequest(engine_id="e1")),
                 r.stub.Drain(router_pb2.DrainRequest(engine_ids=["e1"]))):
        with pytest.raises(grpc.aio.AioRpcError):
            await call
    assert sorted(r.core.registry.engines) == ["e1"]
    assert not r.core.registry.engines["e1"].draining


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/ x", "http://127.0.0.1:9/\r\nX-Injected: 1", "http://127.0.0.1:9\t",
                                 "http://127.0.0.1:9/\x00", "http://:80", "http://127.0.0.1:9?x=1",
                                 "http://127.0.0.1:9/#f", "http://user:pw@127.0.0.1:9"])
async def test_an_engine_url_the_router_cannot_send_to_is_refused(router, url: str) -> None:
    """The request path's own rules (engine_pool._Origin: a host, no query or fragment) and no whitespace,
    control characters or credentials. Each of these was stored: urlsplit drops tabs and newlines and a space
    went into the request line (the engine answered 400 'Bad status line', passed on to every client as its
    own fault), a query or fragment failed every request with 503, credentials were dropped on the way and
    listed by ListEngines (found by an adversarial audit of RegisterEngine)."""
    r = await router([])
    engine = common_pb2.Engine(id="e1", url=url, pool="p", model="m")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=engine))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "engine.url" in info.value.details()
    assert not r.core.registry.engines
    engine = common_pb2.Engine(id="e1", url="http://127.0.0.1:9", pool="p", model="m", prefill_url=url)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=engine))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "engine.prefill_url" in info.value.details()
    assert not r.core.registry.engines


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/ x", "http://:80", "http://127.0.0.1:9?x=1",
                                 "http://user:pw@127.0.0.1:9"])
def test_an_engines_flag_url_the_router_cannot_send_to_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="engines"):
        RouterSettings(engines=f"http://127.0.0.1:8000,{url}")
