"""Deregistering a cache server while a plan is being applied to it (audit: concurrency is safe)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from aiohttp import web

from greenserve.cache_manager.service import build
from greenserve.cache_manager.settings import CacheManagerSettings
from greenserve.v1 import cache_manager_pb2 as pb
from greenserve.v1 import cache_manager_pb2_grpc as pbg
from greenserve.v1 import common_pb2

pytestmark = pytest.mark.timeout(60)
SLOW_S = 1.0


async def _slow_lmcache() -> tuple[web.AppRunner, str]:
    """An LMCache admin API that takes SLOW_S to answer /status, then fails (the resize reports it)."""
    async def status(request: web.Request) -> web.Response:
        await asyncio.sleep(SLOW_S)
        return web.Response(status=503, text="busy")

    app = web.Application()
    app.router.add_get("/status", status)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def test_deregister_during_an_apply_is_not_internal(start_inprocess, tmp_path) -> None:
    """ApplyCachePlan records each server's outcome after its resize's calls to LMCache; a DeregisterCacheServer
    of that server in between (it did not take the servicer's lock) deleted the row, the record then broke the
    foreign key and ApplyCachePlan answered INTERNAL. Now deregistration waits for the apply in progress."""
    runner, url = await _slow_lmcache()
    svc = await start_inprocess(CacheManagerSettings, build, data_dir=tmp_path / "cm", follow_plans=False,
                                lmcache_timeout_s=5.0)
    try:
        async with grpc.aio.insecure_channel(svc.address) as channel:
            stub = pbg.CacheManagerServiceStub(channel)
            await stub.RegisterCacheServer(pb.RegisterCacheServerRequest(
                server=pb.CacheServer(id="s1", pool="p", url=url)))
            apply = asyncio.ensure_future(stub.ApplyCachePlan(pb.ApplyCachePlanRequest(
                plan_version=1, targets=[common_pb2.CacheTarget(pool="p", dram_bytes=1 << 30)])))
            await asyncio.sleep(SLOW_S / 3)  # the apply is waiting for the server's /status
            await stub.DeregisterCacheServer(pb.DeregisterCacheServerRequest(server_id="s1"))
            reply = await apply
            assert [(r.server_id, r.applied) for r in reply.results] == [("s1", False)]
            assert (await stub.ListCacheServers(pb.ListCacheServersRequest())).servers == []
    finally:
        await runner.cleanup()
