"""The cache-manager following plans (enforcer.py): apply, idempotence, refusal, roll-back, and one apply on a real
LMCache server through the service's own PlanFollower and an in-test optimizer.

The unit tests use a fake LMCache admin client (its L1 size is a file per server) and a fake restart command that
writes that file, or fails for the servers a test names: the real LMCache cannot be made to fail midway.
"""

from __future__ import annotations

import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import pytest

from greenserve.cache_manager.enforcer import PLAN_FILE, CacheEnforcer, gib
from greenserve.cache_manager.lmcache_admin import GIB, LmcacheError, LmcacheState
from greenserve.cache_manager.models import CacheApplication, LmcacheServer
from greenserve.cache_manager.service import CacheManagerServicer, build
from greenserve.cache_manager.settings import CacheManagerSettings
from greenserve.common.app import ServiceContext
from greenserve.common.config import load_settings
from greenserve.common.orm_conventions import utcnow
from greenserve.common.persistence import Database
from greenserve.common.plan_follow import APPLIED, FAILED, REFUSED, ROLLED_BACK, PlanFollower
from greenserve.v1 import cache_manager_pb2 as pb
from greenserve.v1 import cache_manager_pb2_grpc as pbg
from greenserve.v1 import common_pb2, optimizer_pb2

from tests.plan_peer import PlanPeer, interval, serve

RESTART_SCRIPT = """
import pathlib, sys
state, server_id, size = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
with open(state / "runs", "a") as fh:
    fh.write(f"{server_id}:{size}\\n")
fail = (state / "fail").read_text().split() if (state / "fail").exists() else []
if server_id in fail or f"{server_id}:{size}" in fail:
    sys.exit(1)
(state / server_id).write_text(size)
"""


class FakeAdmin:
    """LmcacheAdmin's surface the resize uses; the server's L1 size is the file named after the URL's host."""

    def __init__(self, url: str, state: Path) -> None:
        self.url = url
        self.path = state / (urlsplit(url).hostname or "")

    async def state(self) -> LmcacheState:
        if not self.path.exists():
            raise LmcacheError(f"GET {self.url}/status: ConnectError")
        return LmcacheState(True, int(self.path.read_text()), 0, 0, "LRU", 0)

    async def delete_objects(self, keys, *, tier="all", force=False):
        return len(keys), 0

    async def aclose(self) -> None:
        pass


@dataclass
class Fleet:
    servicer: CacheManagerServicer
    enforcer: CacheEnforcer
    state: Path
    db: Database

    def size(self, server_id: str) -> int:
        return int((self.state / server_id).read_text())

    def runs(self) -> list[str]:
        runs = self.state / "runs"
        return runs.read_text().split() if runs.exists() else []

    def fail(self, *which: str) -> None:
        (self.state / "fail").write_text(" ".join(which))


@pytest.fixture
def fleet(tmp_path):
    """Servers s1, s2 (pool chat) and s3 (pool rag) at 1 GiB; pool batch has none."""
    state = tmp_path / "state"
    state.mkdir()
    script = tmp_path / "restart.py"
    script.write_text(RESTART_SCRIPT)
    settings = CacheManagerSettings.model_validate({
        "data_dir": tmp_path, "follow_plans": False, "lmcache_max_dram_bytes": 8 * GIB,
        "lmcache_restart_command": f"{sys.executable} {script} {state} {{server_id}} {{l1_size_bytes}}"})
    db = Database.open(f"sqlite:///{tmp_path / 'cm.db'}", "cache_manager")
    servicer = CacheManagerServicer(ServiceContext(settings=settings, db=db, telemetry=None))  # type: ignore[arg-type]
    servicer._admin = lambda url: FakeAdmin(url, state)  # type: ignore[method-assign]
    with db.session() as s:
        for server_id, pool in (("s1", "chat"), ("s2", "chat"), ("s3", "rag")):
            s.add(LmcacheServer(id=server_id, pool=pool, url=f"http://{server_id}:8000", registered_at=utcnow()))
            (state / server_id).write_text(str(GIB))
        s.commit()
    yield Fleet(servicer, CacheEnforcer(servicer, settings.lmcache_max_dram_bytes), state, db)
    db.close()


def _plan(version: int, *targets: common_pb2.CacheTarget, pools: tuple[str, ...] = ("chat", "rag", "batch")
          ) -> common_pb2.Plan:
    now = time.time()
    iv = interval(now - 60, now + 3600, cache_targets=list(targets),
                  pools=[common_pb2.PoolInterval(pool=p) for p in pools])
    return common_pb2.Plan(version=version, intervals=[iv])


def _target(pool: str, dram_gib: float, **kw) -> common_pb2.CacheTarget:
    return common_pb2.CacheTarget(pool=pool, dram_bytes=int(dram_gib * GIB), **kw)


async def _reconcile(fleet: Fleet, plan: common_pb2.Plan):
    return await fleet.enforcer.reconcile(plan, plan.intervals[0])


async def test_apply_sizes_every_server_of_each_pool_and_is_idempotent(fleet) -> None:
    plan = _plan(3, _target("chat", 2, ttl_s=60), _target("rag", 1, disk_bytes=100 * GIB), _target("batch", 4))
    out = await _reconcile(fleet, plan)
    assert out.state == APPLIED, out.detail
    assert "pool chat: dram 1.0 GiB -> 2.0 GiB (s1, s2), TTL 60 s" in out.detail
    assert "pool rag: dram 1.0 GiB already in force (s3)" in out.detail
    assert "pool rag: disk target 100.0 GiB not applied" in out.detail
    assert "pool batch: no LMCache server registered, target dram 4.0 GiB not applied" in out.detail
    assert fleet.size("s1") == fleet.size("s2") == 2 * GIB and fleet.size("s3") == GIB
    assert sorted(fleet.runs()) == [f"s1:{2 * GIB}", f"s2:{2 * GIB}"]
    assert fleet.servicer.ttls["chat"]["*"] == 60
    assert fleet.servicer._last_plan("s1") == 3 and fleet.servicer._last_plan("s3") == 3

    again = await _reconcile(fleet, plan)  # idempotent: nothing restarted
    assert again.state == APPLIED and "pool chat: dram 2.0 GiB already in force (s1, s2)" in again.detail
    assert len(fleet.runs()) == 2

    nothing = await fleet.enforcer.reconcile(plan, common_pb2.PlanInterval())
    assert nothing.state == APPLIED and "no cache targets" in nothing.detail


@pytest.mark.parametrize(("targets", "field"), [
    ((_target("chat", 2), _target("nope", 1)), "plan.intervals[0].cache_targets[1].pool"),
    ((_target("chat", 2), _target("chat", 3)), "plan.intervals[0].cache_targets[1].pool"),
    ((_target("rag", 1), _target("chat", 9)), "plan.intervals[0].cache_targets[1].dram_bytes"),
    ((common_pb2.CacheTarget(pool="chat", dram_bytes=2**63),), "plan.intervals[0].cache_targets[0].dram_bytes"),
    ((_target("chat", 2, ttl_s=float("nan")),), "plan.intervals[0].cache_targets[0].ttl_s"),
])
async def test_a_plan_the_cache_manager_cannot_apply_is_refused_and_changes_nothing(fleet, targets, field) -> None:
    out = await _reconcile(fleet, _plan(4, *targets))
    assert out.state == REFUSED
    assert out.detail.startswith(field + ":") and out.detail.endswith("nothing changed")
    assert fleet.runs() == [] and fleet.size("s1") == GIB
    with fleet.db.session() as s:
        assert s.query(CacheApplication).count() == 0


async def test_too_large_names_the_server_and_its_limit(fleet) -> None:
    out = await _reconcile(fleet, _plan(4, _target("rag", 16)))
    assert out.state == REFUSED and "16.0 GiB is more than server s3 of pool rag can take (8.0 GiB)" in out.detail


async def test_apply_cache_plan_past_the_dram_limit_is_refused_and_changes_nothing(fleet) -> None:
    """ApplyCachePlan used to ignore --lmcache-max-dram-bytes (only the plan follower checked it): a direct call
    resized s3 to 16 GiB on an 8 GiB limit. Now the follower's check refuses it, naming the target, before any
    server is resized: the chat target within the limit is not applied either (all or nothing)."""
    from greenserve.common.errors import InvalidArgument

    request = pb.ApplyCachePlanRequest(plan_version=4, targets=[_target("chat", 2), _target("rag", 16)])
    with pytest.raises(InvalidArgument) as exc:
        await fleet.servicer.ApplyCachePlan(request, None)
    assert exc.value.field == "targets[1].dram_bytes"
    assert "16.0 GiB is more than server s3 of pool rag can take (8.0 GiB)" in exc.value.message
    assert "--lmcache-max-dram-bytes" in exc.value.message
    assert fleet.runs() == [] and fleet.size("s1") == fleet.size("s2") == fleet.size("s3") == GIB
    with fleet.db.session() as s:
        assert s.query(CacheApplication).count() == 0


async def test_resize_cache_past_the_dram_limit_is_refused_and_changes_nothing(fleet) -> None:
    """ResizeCache used to ignore --lmcache-max-dram-bytes as well."""
    from greenserve.common.errors import InvalidArgument

    with pytest.raises(InvalidArgument) as exc:
        await fleet.servicer.ResizeCache(pb.ResizeCacheRequest(server_id="s3", dram_bytes=8 * GIB + 1), None)
    assert exc.value.field == "dram_bytes" and "server s3 of pool rag can take (8.0 GiB)" in exc.value.message
    assert fleet.runs() == [] and fleet.size("s3") == GIB
    reply = await fleet.servicer.ResizeCache(pb.ResizeCacheRequest(server_id="s3", dram_bytes=4 * GIB), None)
    assert reply.result.applied and fleet.size("s3") == 4 * GIB


async def test_rpcs_past_the_dram_limit_answer_invalid_argument(start_inprocess, tmp_path) -> None:
    """The same refusals through gRPC: INVALID_ARGUMENT naming the field (the plan follower reports the same
    check as REFUSED: the request asks for a size outside what this cache-manager is configured to give)."""
    from tests.conftest import free_port

    svc = await start_inprocess(CacheManagerSettings, build, data_dir=tmp_path / "cm", follow_plans=False,
                                lmcache_max_dram_bytes=GIB, lmcache_timeout_s=1.0)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = pbg.CacheManagerServiceStub(channel)
        for server_id, pool in (("s1", "p1"), ("s2", "p2")):  # closed ports: unreachable, which is enough here
            await stub.RegisterCacheServer(pb.RegisterCacheServerRequest(
                server=pb.CacheServer(id=server_id, pool=pool, url=f"http://127.0.0.1:{free_port()}")))
        for call, field in (
            (stub.ResizeCache(pb.ResizeCacheRequest(server_id="s1", dram_bytes=2 * GIB)), "dram_bytes"),
            (stub.ApplyCachePlan(pb.ApplyCachePlanRequest(plan_version=1, targets=[
                _target("p1", 0.5), _target("p2", 2)])), "targets[1].dram_bytes"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await call
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.value.details()
            assert exc.value.details().startswith(field + ":") and "can take (1.0 GiB)" in exc.value.details()
        # Within the limit (the limit itself included): tried, and the unreachable server says so.
        reply = await stub.ResizeCache(pb.ResizeCacheRequest(server_id="s1", dram_bytes=GIB))
        assert not reply.result.applied and "state" in reply.result.detail
        reply = await stub.ApplyCachePlan(pb.ApplyCachePlanRequest(plan_version=1, targets=[
            _target("p1", 0.5), _target("p2", 1)]))
        assert [(r.server_id, r.applied) for r in reply.results] == [("s1", False), ("s2", False)]


def test_what_a_server_can_take_defaults_to_this_hosts_memory_for_local_servers(fleet) -> None:
    from greenserve.cache_manager.enforcer import host_memory_bytes

    def row(url: str) -> LmcacheServer:
        return LmcacheServer(id="x", pool="p", url=url)

    assert fleet.enforcer.dram_limit_bytes(row("http://10.0.0.9:8000")) == 8 * GIB  # the flag wins
    default = CacheEnforcer(fleet.servicer)
    memory = host_memory_bytes()
    assert memory > GIB
    for url in ("http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000"):
        assert default.dram_limit_bytes(row(url)) == memory
    assert default.dram_limit_bytes(row("http://lmcache-0.cache:8000")) is None  # another host: unknown


async def test_failure_on_the_second_server_rolls_the_first_back(fleet) -> None:
    fleet.fail("s2")
    out = await _reconcile(fleet, _plan(5, _target("chat", 2)))
    assert out.state == ROLLED_BACK, out.detail
    assert "resizing server s2 from 1.0 GiB to 2.0 GiB failed: restart command exited 1" in out.detail
    assert out.detail.endswith("rolled back s1 to 1.0 GiB")
    assert fleet.runs() == [f"s1:{2 * GIB}", f"s2:{2 * GIB}", f"s1:{GIB}"]
    assert fleet.size("s1") == fleet.size("s2") == GIB
    assert fleet.servicer._last_plan("s1") == 0  # recorded as failed, not applied


async def test_first_failure_or_an_unreachable_server_is_failed_with_nothing_changed(fleet) -> None:
    fleet.fail("s1")
    out = await _reconcile(fleet, _plan(6, _target("chat", 2)))
    assert out.state == FAILED and out.detail.endswith("nothing changed") and "server s1" in out.detail
    assert fleet.size("s1") == fleet.size("s2") == GIB

    fleet.fail()
    (fleet.state / "s3").unlink()  # s3 does not answer: nothing of the plan is applied, chat included
    out = await _reconcile(fleet, _plan(7, _target("chat", 2), _target("rag", 2)))
    assert out.state == FAILED and "pool rag: server s3 unreachable" in out.detail
    assert fleet.size("s1") == GIB and fleet.runs() == [f"s1:{2 * GIB}"]


async def test_a_roll_back_that_fails_is_failed_and_names_the_server_left_resized(fleet) -> None:
    fleet.fail("s2", f"s1:{GIB}")
    out = await _reconcile(fleet, _plan(8, _target("chat", 2)))
    assert out.state == FAILED
    assert "roll-back incomplete: s1 stays at 2.0 GiB" in out.detail


async def test_follower_reconciles_an_offered_plan_and_keeps_it_on_disk(fleet, tmp_path) -> None:
    from greenserve.common.plan_follow import plan_file_store

    save, load = plan_file_store(tmp_path / PLAN_FILE)
    follower = PlanFollower(component="cache-manager", instance="t", channel=None,
                            reconcile=fleet.enforcer.reconcile, save=save, load=load)
    await follower.start()
    try:
        await follower.offer(_plan(9, _target("chat", 0.5)))
        assert follower.last_outcome.state == APPLIED
        assert "pool chat: dram 1.0 GiB -> 0.5 GiB (s1, s2)" in follower.last_outcome.detail
        assert (await load()).version == 9
    finally:
        await follower.stop()


def test_flags(capsys) -> None:
    default = load_settings(CacheManagerSettings, [])
    assert default.follow_plans and default.instance == socket.gethostname() and default.lmcache_max_dram_bytes == 0
    off = load_settings(CacheManagerSettings, ["--no-follow-plans", "--instance", "cm-a"])
    assert not off.follow_plans and off.instance == "cm-a"
    with pytest.raises(SystemExit) as exc:
        load_settings(CacheManagerSettings, ["--instance", ""])
    assert exc.value.code == 2 and "--instance" in capsys.readouterr().err


def test_gib_formats_sizes_for_details() -> None:
    assert [gib(GIB), gib(GIB // 4), gib(5 * GIB // 2), gib(GIB // 8)] == ["1.0 GiB", "0.25 GiB", "2.5 GiB",
                                                                           "0.125 GiB"]


@pytest.mark.timeout(240)
async def test_service_follows_a_plan_onto_a_real_lmcache_server(start_inprocess, tmp_path, lmcache_server) -> None:
    peer = PlanPeer()
    server, address = await serve(peer)
    try:
        svc = await start_inprocess(CacheManagerSettings, build, data_dir=tmp_path / "cm", optimizer_addr=address,
                                    instance="cm-test", lmcache_restart_command=lmcache_server.restart_command())
        async with grpc.aio.insecure_channel(svc.address) as channel:
            stub = pbg.CacheManagerServiceStub(channel)
            await stub.RegisterCacheServer(pb.RegisterCacheServerRequest(
                server=pb.CacheServer(id="lm1", pool="chat", url=lmcache_server.http_url)))
            before = lmcache_server.status()["storage_manager"]["l1_manager"]["memory_total_bytes"]
            target = before * 2
            await peer.publish(_plan(11, common_pb2.CacheTarget(pool="chat", dram_bytes=target)))
            report = await peer.wait_report(lambda r: r.plan_version == 11 and r.state != optimizer_pb2.ENFORCEMENT_STATE_APPLYING,
                                            timeout_s=180)
            assert (report.component, report.instance) == ("cache-manager", "cm-test")
            assert report.state == APPLIED, report.detail
            assert f"pool chat: dram {gib(before)} -> {gib(target)} (lm1)" in report.detail
            assert lmcache_server.status()["storage_manager"]["l1_manager"]["memory_total_bytes"] == target
            listed = (await stub.ListCacheServers(pb.ListCacheServersRequest(pool="chat"))).servers
            assert listed[0].dram_bytes == target and listed[0].applied_plan_version == 11
            assert (tmp_path / "cm" / PLAN_FILE).exists()  # the plan in force survives a restart
    finally:
        await server.stop(0)
