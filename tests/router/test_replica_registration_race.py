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
