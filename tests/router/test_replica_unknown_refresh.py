"""A replica asked for a pool it does not know reads the shared state again before it answers 404 / NOT_FOUND:
another replica may have registered the pool since its last poll, and a 404 is not retried by clients (the
unknown-pool answer of cc631ab). Reads for pools that do not exist are shared and spaced, so they cost the
database no more than the poll does."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import grpc
import pytest
from greenserve.router.core import UNKNOWN_REFRESH_MIN_INTERVAL_S

from tests.persistence.conftest import postgres_server  # noqa: F401  (the PostgreSQL fixture, reused)
from tests.router.test_replicas import _register, _route, shared_db  # noqa: F401  (the fixture, reused)

SLOW_POLL = {"state_poll_interval_s": 1.0}  # B reads the shared state only once a second on its own


async def test_a_pool_registered_through_a_is_found_by_b_before_its_next_poll(router, emulators, shared_db) -> None:  # noqa: F811 - the imported fixture
    emus = await emulators(2, model="m")
    extra = {"db_url": shared_db} if shared_db else {}
    a = await router([], replica_id="a", **extra)
    b = await router([], replica_id="b", **extra, **SLOW_POLL)
    await asyncio.sleep(0.05)
    for emu, pool, ask in ((emus[0], "fresh-grpc", "route"), (emus[1], "fresh-http", "http")):
        await _register(a.stub, f"e-{pool}", emu.url, pool=pool)
        if ask == "route":  # at once: B has not polled since
            reply = await b.stub.Route(_route(pool))
            assert reply.engine.id == f"e-{pool}"
        else:
            async with aiohttp.ClientSession() as s, s.post(
                    b.http + "/v1/completions", headers={"x-greenserve-pool": pool},
                    json={"model": "m", "prompt": "hi", "max_tokens": 2}) as resp:
                assert resp.status == 200, await resp.text()
        await asyncio.sleep(UNKNOWN_REFRESH_MIN_INTERVAL_S)  # the next read may start
    with pytest.raises(grpc.aio.AioRpcError) as err:  # a pool registered nowhere is still unknown
        await b.stub.Route(_route("nowhere"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_requests_for_unknown_pools_share_and_space_their_reads(router, shared_db, monkeypatch) -> None:  # noqa: F811 - the imported fixture
    extra = {"db_url": shared_db} if shared_db else {}
    b = await router([], replica_id="b", **extra, **SLOW_POLL)
    reads = 0
    read_version = b.core.shared.version

    def counted() -> int:
        nonlocal reads
        reads += 1
        return read_version()

    monkeypatch.setattr(b.core.shared, "version", counted)
    await asyncio.sleep(1.1)  # past B's own poll
    reads = 0
    t0 = time.monotonic()
    results = await asyncio.gather(*(b.stub.Route(_route(f"nope-{i}")) for i in range(100)), return_exceptions=True)
    elapsed_s = time.monotonic() - t0
    assert {r.code() for r in results} == {grpc.StatusCode.NOT_FOUND}
    # 100 at once share the reads: one, or one per spacing interval the burst took on a loaded host (+ B's poll)
    assert 1 <= reads <= elapsed_s / UNKNOWN_REFRESH_MIN_INTERVAL_S + 2 and reads < 20, (reads, elapsed_s)
    reads = 0
    t0 = time.monotonic()
    for i in range(100):  # one after another: a read at most every UNKNOWN_REFRESH_MIN_INTERVAL_S
        with pytest.raises(grpc.aio.AioRpcError):
            await b.stub.Route(_route(f"nope-{i}"))
    elapsed_s = time.monotonic() - t0
    assert reads <= elapsed_s / UNKNOWN_REFRESH_MIN_INTERVAL_S + 3 and reads < 100, (reads, elapsed_s)
