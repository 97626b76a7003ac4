"""Concurrent RegisterEngine calls through two router replicas sharing one database (found by an adversarial
audit of the registry's replica sync, run against both backends).

- Two engines with one URL, registered at once through replicas A and B: one replica does not know the other's
  engine yet, so its own URL check passes. Before, on SQLite both callers were told OK and the engine written
  first was silently deleted (the row write dropped any other row with its URL); on PostgreSQL the second insert
  broke the URL's unique constraint (IntegrityError: INTERNAL) or both succeeded in the same silent way. Now the
  second is INVALID_ARGUMENT naming engine.url, as through one replica.
- One engine id registered at once through A and B (an update, as RegisterEngine of a known id is): on
  PostgreSQL both found no row and the second insert's primary-key violation answered INTERNAL.

Each round uses fresh ids and URLs; the replicas must agree with the database at the end.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from greenserve.router import models
from greenserve.v1 import common_pb2, router_pb2

from tests.persistence.conftest import postgres_server  # noqa: F401  (the PostgreSQL fixture, reused)
from tests.router.test_replicas import _replicas, shared_db  # noqa: F401  (both backends)

ROUNDS = 6


async def _register(stub, engine_id: str, url: str) -> tuple[str, str]:
    try:
        await stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
            id=engine_id, url=url, pool="p", model="m")), timeout=20)
        return "OK", ""
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details()


def _stored(core) -> list[tuple[str, str]]:
    with core.db.session() as s:
        return sorted((row.id, row.url) for row in s.query(models.Engine))


async def _agree(a, b) -> list[tuple[str, str]]:
    deadline = time.monotonic() + 10
    while True:
        stored = _stored(a.core)
        views = [sorted((e.id, e.url) for e in r.core.registry.engines.values()) for r in (a, b)]
        if views[0] == views[1] == stored:
            return stored
        assert time.monotonic() < deadline, (stored, views)
        await asyncio.sleep(0.05)


async def test_two_engines_with_one_url_through_two_replicas(router, shared_db) -> None:  # noqa: F811
    a, b = await _replicas(router, shared_db)
    for i in range(ROUNDS):
        url = f"http://10.0.0.{i + 1}:8000"
        results = await asyncio.gather(_register(a.stub, f"a{i}", url), _register(b.stub, f"b{i}", url))
        codes = sorted(code for code, _ in results)
        assert codes == ["INVALID_ARGUMENT", "OK"], results
        refused = next(details for code, details in results if code != "OK")
        assert "engine.url" in refused and "already registered" in refused, refused
        winner = f"a{i}" if results[0][0] == "OK" else f"b{i}"
        assert (winner, url) in await _agree(a, b)


async def test_one_engine_id_through_two_replicas_at_once(router, shared_db) -> None:  # noqa: F811
    a, b = await _replicas(router, shared_db)
    for i in range(ROUNDS):
        results = await asyncio.gather(_register(a.stub, f"e{i}", f"http://10.1.0.{i + 1}:8000"),
                                       _register(b.stub, f"e{i}", f"http://10.2.0.{i + 1}:8000"))
        assert [code for code, _ in results] == ["OK", "OK"], results
        stored = dict(await _agree(a, b))
        assert stored[f"e{i}"] in (f"http://10.1.0.{i + 1}:8000", f"http://10.2.0.{i + 1}:8000")


@pytest.mark.parametrize("rpc", ["Drain", "Undrain"])
async def test_a_drain_through_one_replica_does_not_bring_back_an_engine_deregistered_through_the_other(
        router, shared_db, rpc: str) -> None:  # noqa: F811
    """Drain and Undrain wrote the drain flag of every engine the replica knew, inserting the row when it was
    gone: an engine deregistered through B a moment before (A not yet knowing) was stored again and routed to
    by both replicas, though its caller had been told it was gone; on PostgreSQL the update of the row B had just
    deleted answered INTERNAL (StaleDataError). Now such a batch is NOT_FOUND naming the engine and writes
    nothing (all-or-nothing, as for an engine the replica does not know)."""
    a, b = await _replicas(router, shared_db)
    for i in range(ROUNDS):
        await _register(a.stub, "keep", "http://10.9.9.9:8000")
        await _register(a.stub, f"e{i}", f"http://10.3.0.{i + 1}:8000")
        await _agree(a, b)

        async def drain(i: int = i) -> str:
            await asyncio.sleep(0.01 * (i % 3))
            request = getattr(router_pb2, f"{rpc}Request")(engine_ids=["keep", f"e{i}"])
            try:
                await getattr(a.stub, rpc)(request, timeout=20)
                return "OK"
            except grpc.aio.AioRpcError as exc:
                assert "engine_ids[1]" in exc.details(), exc.details()
                return exc.code().name

        await b.stub.DeregisterEngine(router_pb2.DeregisterEngineRequest(engine_id=f"e{i}"))
        assert await drain() in ("OK", "NOT_FOUND")
        stored = dict(await _agree(a, b))
        assert f"e{i}" not in stored, stored
