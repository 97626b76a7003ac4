"""Bad input and concurrent writers against the cache-manager (issue 21): every refusal is INVALID_ARGUMENT
naming the field and changes nothing; concurrent access streams never collide; an unreadable snapshot at
start is moved aside and the index rebuilt from the journal. No LMCache server needed: registered servers
point at a closed port (reported unreachable)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import func, select

from greenserve.cache_manager.models import AccessEvent, LmcacheServer
from greenserve.cache_manager.service import build
from greenserve.cache_manager.settings import CacheManagerSettings
from greenserve.common.orm_conventions import utcnow
from greenserve.common.persistence import Database
from greenserve.v1 import cache_manager_pb2 as pb
from greenserve.v1 import cache_manager_pb2_grpc as pbg
from greenserve.v1 import common_pb2
from tests.conftest import free_port

pytestmark = pytest.mark.timeout(120)


async def _start(start_inprocess, tmp_path, **kw):
    kw.setdefault("follow_plans", False)
    svc = await start_inprocess(CacheManagerSettings, build, data_dir=tmp_path / "cm", **kw)
    channel = grpc.aio.insecure_channel(svc.address)
    return svc, channel, pbg.CacheManagerServiceStub(channel)


async def _refused(call, field: str, code=grpc.StatusCode.INVALID_ARGUMENT) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    assert exc.value.code() == code, exc.value.details()
    assert field in exc.value.details()


def _stream(items):
    async def gen():
        for item in items:
            yield item
    return gen()


def _store(pool: str, key: str, **kw) -> pb.ReportAccessesRequest:
    return pb.ReportAccessesRequest(pool=pool, entry_key=key, kind=pb.ACCESS_KIND_STORE, tokens=kw.pop("tokens", 16),
                                    size_bytes=kw.pop("size_bytes", 4096), **kw)


async def _keys(stub, pool: str) -> set[str]:
    entries = (await stub.ListEvictionCandidates(pb.ListEvictionCandidatesRequest(pool=pool, limit=10000))).entries
    return {e.entry_key for e in entries}


def _journal_rows(tmp_path) -> int:
    db = Database.open(f"sqlite:///{tmp_path / 'cm' / 'cache_manager.db'}", "cache_manager")
    try:
        with db.session(readonly=True) as s:
            return int(s.scalar(select(func.count()).select_from(AccessEvent)))
    finally:
        db.close()


# ----- defect 7: malformed server URLs ---------------------------------------------------------------
@pytest.mark.parametrize("url", [
    "http://[::1", "http://h:99999", "http://h:0", "http://h:", "http://h:8a", "ftp://h:1", "http://", "h:8300",
    "http://u:p@h:1", "http://h:1/?q", "http://h:1/#f", "http://h :1", "http://h:1\n", "http://-h:1",
    "http://h:1/a b", "http://" + "a" * 600,
])
async def test_register_refuses_malformed_urls(start_inprocess, tmp_path, url) -> None:
    svc, channel, stub = await _start(start_inprocess, tmp_path)
    try:
        await _refused(stub.RegisterCacheServer(pb.RegisterCacheServerRequest(
            server=pb.CacheServer(id="s1", pool="p1", url=url))), "server.url")
        assert list((await stub.ListCacheServers(pb.ListCacheServersRequest())).servers) == []
    finally:
        await channel.close()


async def test_a_stored_malformed_url_does_not_break_listing_or_plans(start_inprocess, tmp_path) -> None:
    """A row written before URLs were checked (or by hand) is reported unreachable, never INTERNAL."""
    svc, channel, stub = await _start(start_inprocess, tmp_path)
    try:
        good = f"http://127.0.0.1:{free_port()}"
        await stub.RegisterCacheServer(pb.RegisterCacheServerRequest(server=pb.CacheServer(id="ok", pool="p1",
                                                                                           url=good)))
        db = Database.open(f"sqlite:///{tmp_path / 'cm' / 'cache_manager.db'}", "cache_manager")
        with db.session() as s:
            s.add(LmcacheServer(id="legacy", pool="p1", url="http://[::1", registered_at=utcnow()))
            s.commit()
        db.close()
        listed = (await stub.ListCacheServers(pb.ListCacheServersRequest())).servers
        assert {(x.id, x.reachable) for x in listed} == {("ok", False), ("legacy", False)}
        plan = pb.ApplyCachePlanRequest(plan_version=1, targets=[common_pb2.CacheTarget(pool="p1", dram_bytes=1)])
        results = (await stub.ApplyCachePlan(plan)).results
        assert {r.server_id for r in results} == {"ok", "legacy"} and not any(r.applied for r in results)
    finally:
        await channel.close()


async def test_register_normalises_a_good_url(start_inprocess, tmp_path) -> None:
    svc, channel, stub = await _start(start_inprocess, tmp_path)
    try:
        port = free_port()
        got = (await stub.RegisterCacheServer(pb.RegisterCacheServerRequest(
            server=pb.CacheServer(id="s1", pool="p1", url=f"http://127.0.0.1:{port}/")))).server
        assert got.url == f"http://127.0.0.1:{port}" and not got.reachable
    finally:
        await channel.close()


# ----- defect 16: one name pattern ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["nl\n", "", "a/b", ".hidden", "..", "-x", "a b", "x" * 129, "é"])
async def test_names_are_checked_with_one_pattern(start_inprocess, tmp_path, name) -> None:
    svc, channel, stub = await _start(start_inprocess, tmp_path)
    try:
        url = f"http://127.0.0.1:{free_port()}"
        await _refused(stub.RegisterCacheServer(pb.RegisterCacheServerRequest(
            server=pb.CacheServer(id="s1", pool=name, url=url))), "server.pool")
        await _refused(stub.RegisterCacheServer(pb.RegisterCacheServerRequest(
            server=pb.CacheServer(id=name, pool="p1", url=url))), "server.id")
        await _refused(stub.ReportAccesses(_stream([_store(name, "ab")])), "events[0].pool")
        await _refused(stub.ComputeGroupTtls(pb.ComputeGroupTtlsRequest(pool=name, budget_bytes=1)), "pool")
        await _refused(stub.ListEvictionCandidates(pb.ListEvictionCandidatesRequest(pool=name)), "pool")
        index_dir = tmp_path / "cm" / "cache_index"
        assert not index_dir.exists() or not any(index_dir.iterdir())
    finally:
        await channel.close()


# ----- defect 10: ReportAccesses all or nothing --------------------------------------------------------
def _bad_events() -> list[tuple[pb.ReportAccessesRequest, str]]:
    far = Timestamp(seconds=2**40)
    return [
        (_store("p1", "k2", time=far), "events[1].time"),
        (_store("p1", "k2", time=Timestamp(seconds=int(time.time()) + 86400)), "events[1].time"),
        (_store("p1", "k2", time=Timestamp(seconds=-5)), "events[1].time"),
        (_store("p1", "k2", tokens=2**31), "events[1].tokens"),
        (_store("p1", "k2", size_bytes=2**63), "events[1].size_bytes"),
        (_store("p1", "k2", turn=2**31), "events[1].turn"),
        (_store("p1", "k 2"), "events[1].entry_key"),
        (_store("p1", "k" * 513), "events[1].entry_key"),
        (_store("p1", "k2", tier=77), "events[1].tier"),
        (_store("p1", "k2", conversation_id="c\x00"), "events[1].conversation_id"),
        (pb.ReportAccessesRequest(pool="p1", entry_key="k2", kind=99), "events[1].kind"),
        (pb.ReportAccessesRequest(pool="p1", entry_key="k2", kind=pb.ACCESS_KIND_STORE, tokens=1), "events[1].tokens"),
    ]


@pytest.mark.parametrize("bad,field", _bad_events(), ids=lambda v: v if isinstance(v, str) else "")
async def test_report_accesses_is_all_or_nothing(start_inprocess, tmp_path, bad, field) -> None:
    svc, channel, stub = await _start(start_inprocess, tmp_path)
    try:
        await stub.ReportAccesses(_stream([_store("p0", "k0")]))
        await _refused(stub.ReportAccesses(_stream([_store("p1", "k1"), bad, _store("p1", "k3")])), field)
        # Nothing of the refused stream was applied (p1 never got an index) nor journaled.
        await _refused(stub.ListEvictionCandidates(pb.ListEvictionCandidatesRequest(pool="p1")), "p1",
                       grpc.StatusCode.NOT_FOUND)
        assert await _keys(stub, "p0") == {"k0"}
        assert _journal_rows(tmp_path) == 1
    finally:
        await channel.close()


# ----- defect 12: numeric ranges -----------------------------------------------------------------------
def _chunk(**kw) -> pb.CachedChunk:
    values = dict(tier=common_pb2.CACHE_TIER_DRAM, tokens=256, read_s=0.1, read_energy_j=1.0, recompute_s=0.2,
                  recompute_energy_j=2.0)
    values.update(kw)
    return pb.CachedChunk(**values)


@pytest.mark.parametrize("request_,field", [
    (pb.DecideReadOrRecomputeRequest(chunks=[_chunk(read_s=1e308)] * 3), "chunks[0].read_s"),
    (pb.DecideReadOrRecomputeRequest(chunks=[_chunk(recompute_energy_j=1e308)] * 3), "chunks[0].recompute_energy_j"),
    (pb.DecideReadOrRecomputeRequest(chunks=[_chunk(read_energy_j=float("nan"))]), "chunks[0].read_energy_j"),
    (pb.DecideReadOrRecomputeRequest(chunks=[_chunk()], delay_budget_s=1e308), "delay_budget_s"),
    (pb.DecideReadOrRecomputeRequest(chunks=[_chunk()], queue_wait_s=float("inf")), "queue_wait_s"),
    (pb.DecideReadOrRecomputeRequest(chunks=[_chunk(tier=42)]), "chunks[0].tier"),
])
async def test_read_or_recompute_ranges(start_inprocess, tmp_path, request_, field) -> None:
    svc, channel, stub = await _start(start_inprocess, tmp_path)
    try:
        await _refused(stub.DecideReadOrRecompute(request_), field)
    finally:
        await channel.close()


async def test_read_or_recompute_at_its_limits_is_finite(start_inprocess, tmp_path) -> None:
    svc, channel, stub = await _start(start_inprocess, tmp_path)
    try:
        top = _chunk(read_s=3600.0, read_energy_j=1e7, recompute_s=3600.0, recompute_energy_j=1e7)
        d = await stub.DecideReadOrRecompute(pb.DecideReadOrRecomputeRequest(
            chunks=[top] * 4096, delay_budget_s=3600.0, queue_wait_s=3600.0))
        assert len(d.actions) == 4096
        assert 0 <= d.energy_j < float("inf") and 0 <= d.time_s < float("inf")
    finally:
        await channel.close()


async def test_group_ttl_ranges_and_out_of_order_events(start_inprocess, tmp_path) -> None:
    svc, channel, stub = await _start(start_inprocess, tmp_path)
    try:
        now = int(time.time())
        # Two reporters' events interleaved: times go back and forth.
        items = [_store("p1", f"{i % 5:02x}", conversation_id=f"c{i % 3}",
                        time=Timestamp(seconds=now - 100 + i * 37 % 90)) for i in range(40)]
        items += [_store("p1", "aa", conversation_id="d", time=Timestamp(seconds=t))
                  for t in (now - 10, now - 3000, now - 20, now - 3100)]
        await stub.ReportAccesses(_stream(items))
        for req, field in [
            (pb.ComputeGroupTtlsRequest(pool="p1", window_s=1e308, budget_bytes=1000), "window_s"),
            (pb.ComputeGroupTtlsRequest(pool="p1", window_s=1e-300, budget_bytes=1000), "window_s"),
            (pb.ComputeGroupTtlsRequest(pool="p1", window_s=-1, budget_bytes=1000), "window_s"),
            (pb.ComputeGroupTtlsRequest(pool="p1", window_s=float("nan"), budget_bytes=1000), "window_s"),
            (pb.ComputeGroupTtlsRequest(pool="p1", budget_bytes=2**64 - 1), "budget_bytes"),
            (pb.ComputeGroupTtlsRequest(pool="p1", budget_bytes=0), "budget_bytes"),
            (pb.ComputeGroupTtlsRequest(pool="p1", budget_bytes=1, top_k_groups=5000), "top_k_groups"),
        ]:
            await _refused(stub.ComputeGroupTtls(req), field)
        for window_s, budget in [(0, 1000), (1.0, 1), (30 * 86400.0, 2**53), (3600.0, 10**9)]:
            resp = await stub.ComputeGroupTtls(pb.ComputeGroupTtlsRequest(
                pool="p1", window_s=window_s, budget_bytes=budget, dry_run=True, top_k_groups=4))
            for g in resp.groups:
                assert 0 <= g.ttl_s <= (window_s or 3600.0)
                assert 0 <= g.expected_hit_fraction <= 1, g
                assert 0 <= g.expected_bytes <= 2**53
    finally:
        await channel.close()


async def test_plan_and_resize_ranges(start_inprocess, tmp_path) -> None:
    svc, channel, stub = await _start(start_inprocess, tmp_path)
    try:
        await stub.RegisterCacheServer(pb.RegisterCacheServerRequest(
            server=pb.CacheServer(id="s1", pool="p1", url=f"http://127.0.0.1:{free_port()}")))
        for target, field in [
            (common_pb2.CacheTarget(pool="p1", ttl_s=1e308), "targets[0].ttl_s"),
            (common_pb2.CacheTarget(pool="p1", disk_bytes=2**62), "targets[0].disk_bytes"),
            (common_pb2.CacheTarget(pool="p1", dram_bytes=2**62), "targets[0].dram_bytes"),
            (common_pb2.CacheTarget(pool="p1\n"), "targets[0].pool"),
        ]:
            await _refused(stub.ApplyCachePlan(pb.ApplyCachePlanRequest(plan_version=1, targets=[target])), field)
        await _refused(stub.ResizeCache(pb.ResizeCacheRequest(server_id="s1", dram_bytes=1, disk_bytes=2**63)),
                       "disk_bytes")
    finally:
        await channel.close()


# ----- defect 4: concurrent writers and snapshots ------------------------------------------------------
async def test_concurrent_access_streams_never_collide(start_inprocess, tmp_path) -> None:
    """8 clients x 12 streams at once, with checkpoints between them: no error, every event applied (the
    old code saved every pool to one shared `.npz.tmp` outside the lock: 94/400 streams failed)."""
    svc, channel, stub = await _start(start_inprocess, tmp_path, snapshot_every_events=50)

    async def client(c: int) -> None:
        for n in range(12):
            await stub.ReportAccesses(_stream([_store(f"p{c % 2}", f"{c:02x}{n:02x}{j:02x}") for j in range(20)]))

    try:
        await asyncio.gather(*(client(c) for c in range(8)))
        assert len(await _keys(stub, "p0")) == len(await _keys(stub, "p1")) == 4 * 12 * 20
    finally:
        await channel.close()


async def test_corrupt_snapshot_at_start_is_moved_aside_and_rebuilt(start_inprocess, tmp_path) -> None:
    svc, channel, stub = await _start(start_inprocess, tmp_path, snapshot_every_events=10_000_000)
    await stub.ReportAccesses(_stream([_store("p1", f"{i:04x}") for i in range(30)]))
    await channel.close()
    await svc.server.stop(0)  # checkpoint on stop: cache_index/p1.npz
    svc2, channel2, stub2 = await _start(start_inprocess, tmp_path)
    await stub2.ReportAccesses(_stream([_store("p1", f"{i:04x}") for i in range(30, 40)]))
    await channel2.close()
    await svc2.server.stop(0)  # second checkpoint: the first becomes previous/p1.npz
    index_dir = tmp_path / "cm" / "cache_index"
    (index_dir / "p1.npz").write_bytes(b"PK\x03\x04 this is not a snapshot" * 10)

    svc3, channel3, stub3 = await _start(start_inprocess, tmp_path)
    try:
        assert await _keys(stub3, "p1") == {f"{i:04x}" for i in range(40)}
        moved = list((index_dir / "corrupt").iterdir())
        assert len(moved) == 1 and b"not a snapshot" in moved[0].read_bytes()
        # It keeps serving and writing.
        await stub3.ReportAccesses(_stream([_store("p1", "ffff")]))
        assert "ffff" in await _keys(stub3, "p1")
    finally:
        await channel3.close()


async def test_both_snapshots_unreadable_rebuilds_from_the_journal(start_inprocess, tmp_path) -> None:
    svc, channel, stub = await _start(start_inprocess, tmp_path)
    await stub.ReportAccesses(_stream([_store("p1", f"{i:04x}") for i in range(25)]))
    await channel.close()
    await svc.server.stop(0)
    index_dir = tmp_path / "cm" / "cache_index"
    (index_dir / "p1.npz").write_bytes(b"garbage")
    (index_dir / "previous").mkdir(exist_ok=True)
    (index_dir / "previous" / "p1.npz").write_bytes(b"more garbage")
    svc2, channel2, stub2 = await _start(start_inprocess, tmp_path)
    try:
        assert await _keys(stub2, "p1") == {f"{i:04x}" for i in range(25)}
        assert len(list((index_dir / "corrupt").iterdir())) == 2
    finally:
        await channel2.close()


async def test_index_memory_cap_forgets_lowest_scores(start_inprocess, tmp_path) -> None:
    svc, channel, stub = await _start(start_inprocess, tmp_path, index_max_entries=50, index_max_pools=2)
    try:
        now = int(time.time())
        await stub.ReportAccesses(_stream([_store("p1", f"{i:04x}", time=Timestamp(seconds=now - 1000 + i))
                                           for i in range(80)]))
        keys = await _keys(stub, "p1")
        assert keys == {f"{i:04x}" for i in range(30, 80)}  # the oldest (lowest LCS) were forgotten
        await stub.ReportAccesses(_stream([_store("p2", "aa")]))
        await _refused(stub.ReportAccesses(_stream([_store("p3", "aa")])), "index-max-pools",
                       grpc.StatusCode.RESOURCE_EXHAUSTED)
    finally:
        await channel.close()



async def test_a_stream_past_the_limit_is_refused_without_reading_further() -> None:
    from greenserve.cache_manager.journal import MAX_EVENTS_PER_STREAM, read_stream
    from greenserve.common.errors import InvalidArgument

    sent = 0

    async def endless():
        nonlocal sent
        while True:
            sent += 1
            yield pb.ReportAccessesRequest()

    with pytest.raises(InvalidArgument) as exc:
        await read_stream(endless())
    assert exc.value.field == "events" and sent == MAX_EVENTS_PER_STREAM + 1


async def test_a_pool_without_checkpoint_is_replayed_whole(start_inprocess, tmp_path) -> None:
    """A pool with no checkpoint file (created while a checkpoint round was writing the others) gets every
    journaled event back, also those older than another pool's checkpoint."""
    svc, channel, stub = await _start(start_inprocess, tmp_path)
    await stub.ReportAccesses(_stream([_store("young", f"{i:04x}") for i in range(5)]))  # journal ids 1-5
    await stub.ReportAccesses(_stream([_store("old", f"{i:04x}") for i in range(5)]))  # ids 6-10
    await channel.close()
    await svc.server.stop(0)
    index_dir = tmp_path / "cm" / "cache_index"
    (index_dir / "young.npz").unlink()  # as if its first checkpoint had not been written yet
    svc2, channel2, stub2 = await _start(start_inprocess, tmp_path)
    try:
        assert await _keys(stub2, "young") == {f"{i:04x}" for i in range(5)}
        assert await _keys(stub2, "old") == {f"{i:04x}" for i in range(5)}
    finally:
        await channel2.close()
