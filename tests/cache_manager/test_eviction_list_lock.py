"""ListEvictionCandidates against concurrent writers and a checkpoint (audit: it ignored the index lock).

Choosing the next victims changes a pool's index (``CacheIndex.lowest`` refreshes its candidate pool and, with
the online hit decay, its time constant ``tau_s``, which the checkpoint saves). Every other change of an index
happens under the servicer's lock, and a checkpoint writes an index from a worker thread while holding that
lock, relying on nothing changing it meanwhile (index_state.py, ``IndexSnapshot.save``). ListEvictionCandidates
now takes the lock too, so it waits for a checkpoint (or a resize) in progress instead of changing the index
under it.
"""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from greenserve.cache_manager.service import build
from greenserve.cache_manager.settings import CacheManagerSettings
from greenserve.cache_manager.snapshots import SnapshotStore
from greenserve.v1 import cache_manager_pb2 as pb
from greenserve.v1 import cache_manager_pb2_grpc as pbg

pytestmark = pytest.mark.timeout(120)
WRITERS = READERS = 16


def _stream(items):
    async def gen():
        for item in items:
            yield item
    return gen()


def _stores(prefix: str, n: int) -> list[pb.ReportAccessesRequest]:
    return [pb.ReportAccessesRequest(pool="p", entry_key=f"{prefix}{i}", kind=pb.ACCESS_KIND_STORE, tokens=16,
                                     size_bytes=4096 + i) for i in range(n)]


def _choice_state(index) -> tuple:
    """What choosing victims changes in an index (refreshes, uses of the candidate pool, tau, pool time)."""
    return index.refreshes, index._pool_uses, index.tau_s, index._pool_t0, index._dirty_n


async def test_eviction_candidates_wait_for_a_checkpoint_in_progress(start_inprocess, tmp_path, monkeypatch) -> None:
    """A checkpoint's save is held open (in its worker thread, under the lock) while 16 ReportAccesses and 16
    ListEvictionCandidates are sent at once: every call succeeds, and the index the checkpoint is writing does
    not change before its save ends. Before the fix the listings ran during the save (changing the candidate
    pool it was writing) and this failed."""
    entered, release = threading.Event(), threading.Event()
    during: list[tuple[tuple, tuple]] = []
    real_save = SnapshotStore.save

    def held_save(self: SnapshotStore, pool: str, index) -> None:
        before = _choice_state(index)
        entered.set()
        release.wait(30)
        during.append((before, _choice_state(index)))
        real_save(self, pool, index)

    svc = await start_inprocess(CacheManagerSettings, build, data_dir=tmp_path / "cm", follow_plans=False,
                                snapshot_every_events=600, snapshot_interval_s=86400)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = pbg.CacheManagerServiceStub(channel)
        await stub.ReportAccesses(_stream(_stores("a", 500)))  # below --snapshot-every-events: no checkpoint
        assert len((await stub.ListEvictionCandidates(pb.ListEvictionCandidatesRequest(pool="p", limit=50)))
                   .entries) == 50
        monkeypatch.setattr(SnapshotStore, "save", held_save)
        await stub.ReportAccesses(_stream(_stores("b", 200)))  # past it: a checkpoint starts
        assert await asyncio.to_thread(entered.wait, 30), "no checkpoint started"

        async def write(i: int) -> int:
            return (await stub.ReportAccesses(_stream(_stores(f"w{i}-", 20)))).accepted_events

        async def read(i: int) -> int:
            return len((await stub.ListEvictionCandidates(
                pb.ListEvictionCandidatesRequest(pool="p", limit=100 + i))).entries)

        calls = [asyncio.ensure_future(write(i)) for i in range(WRITERS)] + \
                [asyncio.ensure_future(read(i)) for i in range(READERS)]
        await asyncio.wait(calls, timeout=1.0)  # without the lock the listings finish here, during the save
        release.set()
        results = await asyncio.gather(*calls, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, [(r.code(), r.details()) if isinstance(r, grpc.aio.AioRpcError) else r for r in errors]
        assert results == [20] * WRITERS + [100 + i for i in range(READERS)]
        assert during and all(before == after for before, after in during), during
        entries = (await stub.ListEvictionCandidates(pb.ListEvictionCandidatesRequest(pool="p", limit=10000))).entries
        assert len(entries) == 700 + 20 * WRITERS
