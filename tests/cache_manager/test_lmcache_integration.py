"""The cache-manager against a real LMCache 0.5.6 server on CPU: register, read state, quotas, plans,
resizes by controlled restart, bad plans, and the index surviving a service restart."""

from __future__ import annotations

import grpc
import httpx
import pytest

from greenserve.cache_manager.lmcache_admin import GIB, LmcacheAdmin, entry_key, kv_rank
from greenserve.cache_manager.service import build
from greenserve.cache_manager.settings import CacheManagerSettings
from greenserve.v1 import cache_manager_pb2 as pb
from greenserve.v1 import cache_manager_pb2_grpc as pbg
from greenserve.v1 import common_pb2

pytestmark = pytest.mark.timeout(240)


def _key(obj: dict) -> str:
    return entry_key(obj["chunk_hash_hex"], obj["model_name"], obj["kv_rank"], obj["cache_salt"],
                     obj["object_group_id"])


def _l1_objects(lmcache_server) -> int:
    return int(lmcache_server.status()["storage_manager"]["l1_manager"]["total_object_count"])


async def _start(start_inprocess, tmp_path, lmcache_server, **kw):
    svc = await start_inprocess(CacheManagerSettings, build, data_dir=tmp_path / "cm", **kw)
    channel = grpc.aio.insecure_channel(svc.address)
    stub = pbg.CacheManagerServiceStub(channel)
    await stub.RegisterCacheServer(pb.RegisterCacheServerRequest(
        server=pb.CacheServer(id="s1", pool="p1", url=lmcache_server.http_url)))
    return svc, channel, stub


async def test_state_quota_and_bad_plans(start_inprocess, tmp_path, lmcache_server) -> None:
    objects = lmcache_server.populate(2, salt="tenant-a", seed=1)
    assert len(objects) == 4  # 2 sequences x 512 tokens / 256-token chunks
    svc, channel, stub = await _start(start_inprocess, tmp_path, lmcache_server)
    try:
        listed = (await stub.ListCacheServers(pb.ListCacheServersRequest(pool="p1"))).servers
        assert len(listed) == 1 and listed[0].reachable
        assert listed[0].dram_bytes == int(0.25 * GIB)
        assert listed[0].dram_used_bytes > 0  # the chunks stored through LMCache's own client

        await stub.SetQuota(pb.SetQuotaRequest(server_id="s1", salt="tenant-a", quota_bytes=64 * 1024 * 1024))
        users = httpx.get(lmcache_server.http_url + "/quota").json()["users"]
        assert users["tenant-a"]["limit_gb"] == pytest.approx(1 / 16)
        await stub.SetQuota(pb.SetQuotaRequest(server_id="s1", salt="tenant-a", quota_bytes=0))
        assert "tenant-a" not in httpx.get(lmcache_server.http_url + "/quota").json()["users"]

        before = lmcache_server.status()["storage_manager"]["l1_manager"]
        for req, field in [
            (pb.ApplyCachePlanRequest(plan_version=3, targets=[common_pb2.CacheTarget(pool="nope", dram_bytes=1)]),
             "targets[0].pool"),
            (pb.ApplyCachePlanRequest(plan_version=0, targets=[]), "plan_version"),
            (pb.ApplyCachePlanRequest(plan_version=3, targets=[common_pb2.CacheTarget(pool="p1", dram_bytes=2**63)]),
             "targets[0].dram_bytes"),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await stub.ApplyCachePlan(req)
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in exc.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.SetQuota(pb.SetQuotaRequest(server_id="s1", salt="a@b", quota_bytes=1))
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        after = lmcache_server.status()["storage_manager"]["l1_manager"]
        assert after["memory_total_bytes"] == before["memory_total_bytes"]
        assert after["total_object_count"] == before["total_object_count"]
    finally:
        await channel.close()


async def test_resize_without_restart_command_keeps_size(start_inprocess, tmp_path, lmcache_server) -> None:
    svc, channel, stub = await _start(start_inprocess, tmp_path, lmcache_server)
    try:
        size = lmcache_server.status()["storage_manager"]["l1_manager"]["memory_total_bytes"]
        resp = await stub.ResizeCache(pb.ResizeCacheRequest(server_id="s1", dram_bytes=size // 2))
        assert not resp.result.applied and "restart" in resp.result.detail
        assert resp.result.dram_bytes == size
        assert lmcache_server.status()["storage_manager"]["l1_manager"]["memory_total_bytes"] == size
        # Same size: nothing to do, applied, idempotent per plan version.
        plan = pb.ApplyCachePlanRequest(plan_version=7, targets=[common_pb2.CacheTarget(pool="p1", dram_bytes=size)])
        first = (await stub.ApplyCachePlan(plan)).results[0]
        second = (await stub.ApplyCachePlan(plan)).results[0]
        assert first.applied and second.applied and "already applied" in second.detail
        listed = (await stub.ListCacheServers(pb.ListCacheServersRequest())).servers[0]
        assert listed.applied_plan_version == 7
    finally:
        await channel.close()


@pytest.mark.slow
async def test_shrink_by_controlled_restart_evicts_lowest_lcs_first(start_inprocess, tmp_path, lmcache_server) -> None:
    objects = lmcache_server.populate(2, seed=3)
    # The LCS order (--eviction-policy lcs); the adaptive default's order is the leader's (test_live_policy.py).
    svc, channel, stub = await _start(start_inprocess, tmp_path, lmcache_server, eviction_policy="lcs",
                                      lmcache_restart_command=lmcache_server.restart_command())
    try:
        keys = [_key(o) for o in objects]
        size = lmcache_server.status()["storage_manager"]["l1_manager"]["memory_total_bytes"]
        target = size // 2
        entry_bytes = target // 2  # two entries fit in the target, four do not

        async def events():
            for k in keys:
                yield pb.ReportAccessesRequest(pool="p1", entry_key=k, kind=pb.ACCESS_KIND_STORE, tokens=256,
                                               size_bytes=entry_bytes)
            for k in keys[:2]:
                yield pb.ReportAccessesRequest(pool="p1", entry_key=k, kind=pb.ACCESS_KIND_HIT, hit_tokens=256)
        assert (await stub.ReportAccesses(events())).accepted_events == 6
        resp = await stub.ResizeCache(pb.ResizeCacheRequest(server_id="s1", dram_bytes=target))
        assert resp.result.applied, resp.result.detail
        assert resp.evicted_entries == 2
        assert "LMCache deleted 2 objects" in resp.result.detail  # real objects, by key, before the restart
        assert lmcache_server.status()["storage_manager"]["l1_manager"]["memory_total_bytes"] == target
        left = {e.entry_key for e in (await stub.ListEvictionCandidates(
            pb.ListEvictionCandidatesRequest(pool="p1", limit=10))).entries}
        assert left == set(keys[:2])  # the hit entries (higher LCS) were kept
        # Grow back to the original size the same way.
        resp = await stub.ResizeCache(pb.ResizeCacheRequest(server_id="s1", dram_bytes=size))
        assert resp.result.applied and "warm-up" in resp.result.detail
    finally:
        await channel.close()


async def test_index_survives_service_restart(start_inprocess, tmp_path, lmcache_server) -> None:
    svc, channel, stub = await _start(start_inprocess, tmp_path, lmcache_server)

    async def events():
        for i in range(5):
            yield pb.ReportAccessesRequest(pool="p1", entry_key=f"{i:064x}", kind=pb.ACCESS_KIND_STORE,
                                           tokens=256, size_bytes=1000 * (i + 1))
    await stub.ReportAccesses(events())
    first = (await stub.ListEvictionCandidates(pb.ListEvictionCandidatesRequest(pool="p1"))).entries
    await channel.close()
    await svc.server.stop(0)

    svc2 = await start_inprocess(CacheManagerSettings, build, data_dir=tmp_path / "cm")
    channel2 = grpc.aio.insecure_channel(svc2.address)
    try:
        stub2 = pbg.CacheManagerServiceStub(channel2)
        again = (await stub2.ListEvictionCandidates(pb.ListEvictionCandidatesRequest(pool="p1"))).entries
        assert [e.entry_key for e in again] == [e.entry_key for e in first]
        assert [e.size_bytes for e in again] == [e.size_bytes for e in first]

        async def bad():
            yield pb.ReportAccessesRequest(pool="p1", entry_key="zz", kind=pb.ACCESS_KIND_STORE, tokens=1,
                                           size_bytes=1)
            yield pb.ReportAccessesRequest(pool="p1", entry_key="yy", kind=pb.ACCESS_KIND_UNSPECIFIED)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub2.ReportAccesses(bad())
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "events[1].kind" in exc.value.details()
        again2 = (await stub2.ListEvictionCandidates(pb.ListEvictionCandidatesRequest(pool="p1"))).entries
        assert len(again2) == 5  # the bad stream changed nothing
    finally:
        await channel2.close()


async def test_group_ttls_and_read_or_recompute_rpcs(start_inprocess, tmp_path, lmcache_server) -> None:
    svc, channel, stub = await _start(start_inprocess, tmp_path, lmcache_server)
    try:
        from google.protobuf.timestamp_pb2 import Timestamp
        import time as _t

        async def events():
            now = _t.time() - 600
            for i in range(300):
                ts = Timestamp()
                ts.FromNanoseconds(int((now + i) * 1e9))
                key = f"{i % 20:064x}"
                kind = pb.ACCESS_KIND_STORE if i < 20 else pb.ACCESS_KIND_HIT
                yield pb.ReportAccessesRequest(pool="p1", entry_key=key, kind=kind, tokens=256, size_bytes=1000,
                                               hit_tokens=256, conversation_id=f"c{i % 20 % 3}", time=ts)
        await stub.ReportAccesses(events())
        resp = await stub.ComputeGroupTtls(pb.ComputeGroupTtlsRequest(pool="p1", budget_bytes=10_000, dry_run=True,
                                                                      top_k_groups=2))
        assert not resp.applied and len(resp.groups) == 3 and resp.groups[-1].group_id == "residual"
        assert all(g.ttl_s >= 0 for g in resp.groups)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.ComputeGroupTtls(pb.ComputeGroupTtlsRequest(pool="p1", budget_bytes=0))
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        chunks = [pb.CachedChunk(tier=common_pb2.CACHE_TIER_DISK, tokens=256, read_s=5.0, read_energy_j=0.1,
                                 recompute_s=1.0, recompute_energy_j=9.0),
                  pb.CachedChunk(tier=common_pb2.CACHE_TIER_DRAM, tokens=256, read_s=0.1, read_energy_j=0.1,
                                 recompute_s=1.0, recompute_energy_j=9.0)]
        d = await stub.DecideReadOrRecompute(pb.DecideReadOrRecomputeRequest(chunks=chunks, delay_budget_s=0.5))
        assert list(d.actions) == [pb.CHUNK_ACTION_RECOMPUTE, pb.CHUNK_ACTION_READ]
        assert d.energy_j == pytest.approx(9.1)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.DecideReadOrRecompute(pb.DecideReadOrRecomputeRequest(chunks=chunks, delay_budget_s=-1))
        assert "delay_budget_s" in exc.value.details()
    finally:
        await channel.close()


async def test_delete_by_key_removes_exactly_those_objects(lmcache_server) -> None:
    """Objects stored through LMCache's client are deleted by their entry keys: the count drops by exactly
    the number deleted. kv_rank must be LMCache's packed rank (16777472 for one worker), not 0."""
    admin = LmcacheAdmin(lmcache_server.http_url)
    try:
        await admin.clear_l1(force=True)
        objects = lmcache_server.populate(2, seed=11)
        assert len(objects) == 4 and {o["kv_rank"] for o in objects} == {kv_rank(1, 0)} == {16777472}
        assert _l1_objects(lmcache_server) == 4
        keys = [_key(o) for o in objects]
        # Wrong rank (the old encoding) or a router-style key: nothing matches, nothing is deleted.
        wrong = entry_key(objects[0]["chunk_hash_hex"], objects[0]["model_name"], 0)
        assert await admin.delete_objects([wrong, "00ff00ff00ff00ff"]) == (0, 0)
        assert _l1_objects(lmcache_server) == 4
        assert await admin.delete_objects(keys[:3]) == (3, 0)
        assert _l1_objects(lmcache_server) == 1
        assert await admin.delete_objects(keys[:3]) == (0, 0)  # idempotent
        await admin.clear_l1(force=True)
        assert (await admin.state()).l1_objects == 0
    finally:
        await admin.aclose()


async def test_scheduled_ttl_round_evicts_idle_entries_on_the_server(start_inprocess, tmp_path,
                                                                     lmcache_server) -> None:
    """--ttl-recompute-s: the loop recomputes group TTLs and deletes, by key on the real server, the entries
    idle past them (the group without reuse gets TTL 0); the reused group's entries stay."""
    from google.protobuf.timestamp_pb2 import Timestamp
    import asyncio
    import time as _t

    admin = LmcacheAdmin(lmcache_server.http_url)
    await admin.clear_l1(force=True)
    await admin.aclose()
    objects = lmcache_server.populate(2, seed=21)
    keys = [_key(o) for o in objects]
    assert _l1_objects(lmcache_server) == 4
    svc, channel, stub = await _start(start_inprocess, tmp_path, lmcache_server, ttl_recompute_s=0.3)
    try:
        def ts(at: float) -> Timestamp:
            t = Timestamp()
            t.FromNanoseconds(int(at * 1e9))
            return t

        now = _t.time()

        async def events():
            for i, k in enumerate(keys):
                yield pb.ReportAccessesRequest(pool="p1", entry_key=k, kind=pb.ACCESS_KIND_STORE, tokens=256,
                                               size_bytes=1 << 20, conversation_id="hot" if i < 2 else "cold",
                                               time=ts(now - 1000))
            for j in range(100):  # the "hot" conversation's entries are reused every 10 s up to now
                for k in keys[:2]:
                    yield pb.ReportAccessesRequest(pool="p1", entry_key=k, kind=pb.ACCESS_KIND_HIT, tokens=256,
                                                   hit_tokens=256, conversation_id="hot",
                                                   time=ts(now - 1000 + 10 * (j + 1) - 1))
        assert (await stub.ReportAccesses(events())).accepted_events == 4 + 200
        deadline = _t.monotonic() + 20
        while _l1_objects(lmcache_server) != 2 and _t.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert _l1_objects(lmcache_server) == 2
        left = {e.entry_key for e in (await stub.ListEvictionCandidates(
            pb.ListEvictionCandidatesRequest(pool="p1", limit=10))).entries}
        assert left == set(keys[:2])
    finally:
        await channel.close()
