"""The disk (L2) tier sized at run time on a real LMCache 0.5.6 server (fs L2 adapter evicting by IsolatedLRU,
disk_tier.py): grow and shrink without a restart (same process, object count and usage from LMCache and the
adapter's folder), lowest-LCS entries deleted first, what an L1 restart loses, and targets LMCache cannot take."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest

from greenserve.cache_manager.disk_tier import why_not_sizable
from greenserve.cache_manager.lmcache_admin import DiskTierState, entry_key
from greenserve.cache_manager.service import build
from greenserve.cache_manager.settings import CacheManagerSettings
from greenserve.v1 import cache_manager_pb2 as pb
from greenserve.v1 import cache_manager_pb2_grpc as pbg
from greenserve.v1 import common_pb2

from tests.cache_manager.conftest import HERE, LMCACHE_ENV, LmcacheProc, _wait_healthy, lmcache_venv
from tests.conftest import free_port

pytestmark = pytest.mark.timeout(240)
OBJECT_BYTES = 256 * 1024  # one 256-token chunk of lmcache_populate.py's KV shape
MIB = 1 << 20


def _l2_spec(folder: Path) -> str:
    return json.dumps({"type": "fs", "base_path": str(folder),
                       "eviction": {"eviction_policy": "IsolatedLRU", "trigger_watermark": 1.0, "eviction_ratio": 0.1}})


@pytest.fixture(scope="module")
def l2_server(tmp_path_factory: pytest.TempPathFactory):
    venv = lmcache_venv()
    binary = venv / "bin" / "lmcache"
    if not binary.exists():
        pytest.skip(f"LMCache virtualenv not found at {venv}: run scripts/install-lmcache.sh")
    work = tmp_path_factory.mktemp("lmcache-l2")
    folder = work / "l2"
    folder.mkdir()
    http_port, rpc_port = free_port(), free_port()
    logfile, pidfile = work / "server.log", work / "server.pid"
    proc = subprocess.Popen(
        [str(binary), "server", "--l1-size-gb", "0.25", "--eviction-policy", "LRU", "--http-port", str(http_port),
         "--port", str(rpc_port), "--supported-transfer-mode", "auto", "--l2-adapter", _l2_spec(folder)],
        stdout=open(logfile, "wb"), stderr=subprocess.STDOUT, env=LMCACHE_ENV, start_new_session=True)
    pidfile.write_text(str(proc.pid))
    url = f"http://127.0.0.1:{http_port}"
    try:
        _wait_healthy(url, proc, logfile)
        yield LmcacheProc(url, f"tcp://127.0.0.1:{rpc_port}", http_port, rpc_port, pidfile, logfile, binary,
                          venv / "bin" / "python"), folder
    finally:
        pid = int(pidfile.read_text())
        for p in {pid, proc.pid}:
            try:
                os.kill(p, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def _restart_command(server: LmcacheProc, folder: Path) -> str:
    """The controlled restart of the tests, keeping the L2 adapter (literal braces doubled for the template)."""
    return (f"{sys.executable} {HERE / 'lmcache_restart.py'} {server.pidfile} {server.bin} {server.http_port} "
            f"{server.rpc_port} {server.logfile} {{l1_size_gb}} --l2-adapter "
            + shlex.quote(_l2_spec(folder)).replace("{", "{{").replace("}", "}}"))


def _bench_io(server: LmcacheProc, mode: str, sequences: int) -> dict:
    out = subprocess.run([str(server.python), str(HERE / "lmcache_bench_io.py"), mode, server.rpc_url, str(sequences)],
                         capture_output=True, text=True, timeout=120, env=LMCACHE_ENV, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _key(obj: dict) -> str:
    return entry_key(obj["chunk_hash_hex"], obj["model_name"], obj["kv_rank"], obj["cache_salt"],
                     obj["object_group_id"])


def _files(folder: Path) -> set[str]:
    """Chunk hashes of the objects on the fs adapter's disk (file name: model@rank@group@hash.data)."""
    return {p.name.rsplit("@", 1)[-1].removesuffix(".data") for p in folder.glob("*.data")}


def _quota(server: LmcacheProc) -> dict:
    return httpx.get(server.http_url + "/quota", timeout=5).json()["users"].get("_default", {})


def _l1_objects(server: LmcacheProc) -> int:
    return int(server.status()["storage_manager"]["l1_manager"]["total_object_count"])


def _wait(cond, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.2)


@pytest.mark.slow  # an LMCache start with an L2 adapter and a controlled restart
async def test_disk_tier_resized_without_restart_lowest_lcs_first_and_l1_restart_cost(
        start_inprocess, tmp_path, l2_server) -> None:
    server, folder = l2_server
    svc = await start_inprocess(CacheManagerSettings, build, data_dir=tmp_path / "cm",
                                lmcache_restart_command=_restart_command(server, folder))
    channel = grpc.aio.insecure_channel(svc.address)
    stub = pbg.CacheManagerServiceStub(channel)
    try:
        await stub.RegisterCacheServer(pb.RegisterCacheServerRequest(
            server=pb.CacheServer(id="s1", pool="p1", url=server.http_url)))
        dram = int(server.status()["storage_manager"]["l1_manager"]["memory_total_bytes"])
        pid = server.pidfile.read_text()
        # Grow the disk tier from none to 8 MiB: the quota of the default salt, no restart.
        resp = await stub.ResizeCache(pb.ResizeCacheRequest(server_id="s1", dram_bytes=dram, disk_bytes=8 * MIB))
        assert resp.result.applied and resp.result.disk_bytes == 8 * MIB, resp.result.detail
        assert "without a restart" in resp.result.detail
        assert _quota(server)["limit_gb"] == pytest.approx(8 * MIB / (1 << 30))

        objects = server.populate(8, seed=5)  # 8 sequences x 2 chunks: 16 objects, 4 MiB, written through to L2
        assert len(objects) == 16
        _wait(lambda: len(_files(folder)) == 16)
        _wait(lambda: _quota(server).get("current_usage_gb", 0) * (1 << 30) == pytest.approx(16 * OBJECT_BYTES))
        keys = [_key(o) for o in objects]

        async def events():
            for k in keys:
                yield pb.ReportAccessesRequest(pool="p1", entry_key=k, kind=pb.ACCESS_KIND_STORE, tokens=256,
                                               size_bytes=OBJECT_BYTES)
            for _ in range(3):
                for k in keys[:8]:
                    yield pb.ReportAccessesRequest(pool="p1", entry_key=k, kind=pb.ACCESS_KIND_HIT, hit_tokens=256)
        assert (await stub.ReportAccesses(events())).accepted_events == 16 + 24

        # Shrink to 2.25 MiB through a plan: the 8 entries never hit (lowest LCS) go, the 8 hit ones stay.
        target = 2 * MIB + MIB // 4
        resp = await stub.ApplyCachePlan(pb.ApplyCachePlanRequest(plan_version=1, targets=[
            common_pb2.CacheTarget(pool="p1", dram_bytes=dram, disk_bytes=target)]))
        (result,) = resp.results
        assert result.applied and result.disk_bytes == target, result.detail
        assert "8 lowest-LCS entries evicted first" in result.detail and "without a restart" in result.detail
        assert server.pidfile.read_text() == pid  # the same LMCache process: no restart
        assert _files(folder) == {o["chunk_hash_hex"] for o in objects[:8]}
        assert _quota(server)["current_usage_gb"] * (1 << 30) == pytest.approx(8 * OBJECT_BYTES)
        time.sleep(2.5)  # two passes of LMCache's eviction controller: under the quota, nothing more goes
        assert len(_files(folder)) == 8
        listed = (await stub.ListCacheServers(pb.ListCacheServersRequest())).servers
        assert listed[0].disk_bytes == target
        again = await stub.ResizeCache(pb.ResizeCacheRequest(server_id="s1", dram_bytes=dram, disk_bytes=target))
        assert again.result.applied and "already in force" in again.result.detail

        # Grow again (no restart) and store 4 more sequences with LMCache's bench client: 8 more chunks.
        resp = await stub.ResizeCache(pb.ResizeCacheRequest(server_id="s1", dram_bytes=dram, disk_bytes=8 * MIB))
        assert resp.result.applied and "grown" in resp.result.detail, resp.result.detail
        assert _bench_io(server, "store", 4) == {"stored": 4}
        _wait(lambda: len(_files(folder)) == 16 and _l1_objects(server) == 16)

        # What an L1 restart (a DRAM resize) loses: every L1 object; the L2 files stay, the quota the restart
        # forgot is put back, and a lookup re-warms L1 from L2.
        l1_before, l2_before = _l1_objects(server), len(_files(folder))
        resp = await stub.ResizeCache(pb.ResizeCacheRequest(server_id="s1", dram_bytes=dram * 2))
        assert resp.result.applied, resp.result.detail
        assert "re-applied 1 L2 quota(s)" in resp.result.detail
        assert server.pidfile.read_text() != pid
        l1_after, l2_after = _l1_objects(server), len(_files(folder))
        print(f"L1 restart: L1 objects {l1_before} -> {l1_after}, L2 files {l2_before} -> {l2_after}")
        assert l1_before == 16 and l1_after == 0
        assert l2_after == l2_before == 16
        assert _quota(server)["limit_gb"] * (1 << 30) == pytest.approx(8 * MIB, rel=1e-6)
        assert _bench_io(server, "lookup", 4)["results"] == [[2, 2]] * 4  # every chunk found on L2 ...
        _wait(lambda: _l1_objects(server) >= 8)  # ... and prefetched back into L1
    finally:
        await channel.close()


@pytest.mark.slow  # an LMCache start
async def test_disk_target_lmcache_cannot_take_leaves_state_and_says_why(start_inprocess, tmp_path,
                                                                        lmcache_server) -> None:
    svc = await start_inprocess(CacheManagerSettings, build, data_dir=tmp_path / "cm")
    channel = grpc.aio.insecure_channel(svc.address)
    stub = pbg.CacheManagerServiceStub(channel)
    try:
        await stub.RegisterCacheServer(pb.RegisterCacheServerRequest(
            server=pb.CacheServer(id="s1", pool="p1", url=lmcache_server.http_url)))
        dram = int(lmcache_server.status()["storage_manager"]["l1_manager"]["memory_total_bytes"])
        resp = await stub.ResizeCache(pb.ResizeCacheRequest(server_id="s1", dram_bytes=dram, disk_bytes=MIB))
        assert not resp.result.applied and "no L2 adapter" in resp.result.detail
        assert resp.result.disk_bytes == 0
        assert _quota(lmcache_server) == {}
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.ApplyCachePlan(pb.ApplyCachePlanRequest(plan_version=2, targets=[
                common_pb2.CacheTarget(pool="p1", dram_bytes=dram, disk_bytes=2**51)]))
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "targets[0].disk_bytes" in exc.value.details()
    finally:
        await channel.close()


def test_l2_without_quota_enforcement_is_not_sizable() -> None:
    lru = DiskTierState(adapters=1, eviction_policies=("LRU",), base_paths=(), quota_bytes=None, used_bytes=0,
                        total_used_bytes=0)
    assert "IsolatedLRU" in why_not_sizable(lru) and "max_capacity_bytes" in why_not_sizable(lru)
    none = DiskTierState(0, (), (), None, 0, 0)
    assert "no L2 adapter" in why_not_sizable(none)
    ok = DiskTierState(1, ("IsolatedLRU",), (), 5, 0, 0)
    assert why_not_sizable(ok) == ""


@pytest.mark.slow  # shares the module's LMCache server with an L2 adapter
async def test_plan_follower_applies_disk_targets_without_restart(tmp_path, l2_server) -> None:
    from greenserve.cache_manager.enforcer import CacheEnforcer
    from greenserve.cache_manager.models import LmcacheServer
    from greenserve.cache_manager.service import CacheManagerServicer
    from greenserve.common.app import ServiceContext
    from greenserve.common.orm_conventions import utcnow
    from greenserve.common.persistence import Database
    from greenserve.common.plan_follow import APPLIED

    from tests.plan_peer import interval

    server, _ = l2_server
    settings = CacheManagerSettings.model_validate({"data_dir": tmp_path, "follow_plans": False})
    db = Database.open(f"sqlite:///{tmp_path / 'cm.db'}", "cache_manager")
    try:
        ctx = ServiceContext(settings=settings, db=db, telemetry=None)  # type: ignore[arg-type]
        servicer = CacheManagerServicer(ctx)
        with db.session() as s:
            s.add(LmcacheServer(id="s1", pool="chat", url=server.http_url, registered_at=utcnow()))
            s.commit()
        enforcer = CacheEnforcer(servicer)
        dram = int(server.status()["storage_manager"]["l1_manager"]["memory_total_bytes"])
        pid = server.pidfile.read_text()

        async def apply(version: int, disk: int):
            now = time.time()
            iv = interval(now - 60, now + 3600, pools=[common_pb2.PoolInterval(pool="chat")],
                          cache_targets=[common_pb2.CacheTarget(pool="chat", dram_bytes=dram, disk_bytes=disk)])
            plan = common_pb2.Plan(version=version, intervals=[iv])
            return await enforcer.reconcile(plan, plan.intervals[0])

        out = await apply(1, 1 << 30)
        assert out.state == APPLIED and "-> 1.0 GiB without restart (s1)" in out.detail, out.detail
        out = await apply(2, 2 << 30)
        assert out.state == APPLIED and "disk 1.0 GiB -> 2.0 GiB without restart (s1)" in out.detail, out.detail
        out = await apply(3, 2 << 30)
        assert out.state == APPLIED and "disk 2.0 GiB already in force (s1)" in out.detail, out.detail
        assert _quota(server)["limit_gb"] == pytest.approx(2.0)
        assert server.pidfile.read_text() == pid
    finally:
        db.close()
