"""Drain and Undrain handle each named engine once (found by an adversarial audit of the admin RPCs): a request
naming one engine many times (200,000 times is a 1.4 MB message, well under the 16 MiB limit) took 88 s before,
each copy written to the database and scraped, while the replica's engine-write lock was held, so that its
registrations, drains and reads of the shared state waited as long. Now the ids are checked, then deduplicated in
their order."""

from __future__ import annotations

import time

import grpc
import pytest
from greenserve.v1 import common_pb2, router_pb2


async def test_an_engine_named_many_times_is_drained_once(router) -> None:
    r = await router([])
    for engine_id, port in (("e1", 9), ("e2", 10)):
        await r.stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
            id=engine_id, url=f"http://127.0.0.1:{port}", pool="p", model="m")))
    ids = ["e2", "e1"] * 25_000
    t0 = time.monotonic()
    reply = await r.stub.Drain(router_pb2.DrainRequest(engine_ids=ids), timeout=60)
    assert time.monotonic() - t0 < 5.0
    assert list(reply.idle_engine_ids) == ["e2", "e1"] and not reply.busy_engine_ids
    t0 = time.monotonic()
    await r.stub.Undrain(router_pb2.UndrainRequest(engine_ids=ids), timeout=60)
    assert time.monotonic() - t0 < 5.0
    assert not any(e.draining for e in r.core.registry.engines.values())
    # an unknown id is still named by its place in the request
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await r.stub.Drain(router_pb2.DrainRequest(engine_ids=["e1", "e1", "nope"]))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND and "engine_ids[2]" in info.value.details()
