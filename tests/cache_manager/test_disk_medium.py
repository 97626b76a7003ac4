"""A plan's disk medium on the cache-manager (issue 18): the disk tier is sized only on a server with an L2 adapter in
the medium's folder; elsewhere the tier in force stays and the outcome says why; a bad medium is refused naming the
field. A fake LMCache admin client stands in for the server (LMCache cannot be given a second disk in a test)."""

from __future__ import annotations

import time

import pytest
from greenserve.cache_manager.disk_tier import resize_disk, why_not_on_medium
from greenserve.cache_manager.enforcer import CacheEnforcer
from greenserve.cache_manager.lmcache_admin import (
    GIB,
    DiskTierState,
    LmcacheAdmin,
    LmcacheState,
)
from greenserve.cache_manager.models import LmcacheServer
from greenserve.cache_manager.request_checks import check_targets
from greenserve.cache_manager.service import CacheManagerServicer
from greenserve.cache_manager.settings import CacheManagerSettings
from greenserve.common.app import ServiceContext
from greenserve.common.errors import InvalidArgument
from greenserve.common.orm_conventions import utcnow
from greenserve.common.persistence import Database
from greenserve.common.plan_follow import APPLIED, REFUSED
from greenserve.v1 import common_pb2

from tests.cache_manager.test_disk_tier import l2_server  # noqa: F401 - the real LMCache server fixture
from tests.plan_peer import interval

NVME_DIR = "/mnt/nvme/lmcache"


class FakeL2Admin:
    """One server with L1 1 GiB and one fs L2 adapter (IsolatedLRU) on the NVMe folder; quotas kept in ``quotas``."""

    def __init__(self, quotas: dict[str, int]) -> None:
        self.quotas = quotas

    async def state(self) -> LmcacheState:
        return LmcacheState(True, GIB, 0, 0, "LRU", 1)

    async def disk_state(self, salt: str = "") -> DiskTierState:
        quota = self.quotas.get(salt)
        return DiskTierState(1, ("IsolatedLRU",), (NVME_DIR,), quota, min(quota or 0, GIB), GIB)

    async def set_quota(self, salt: str, quota_bytes: int) -> None:
        self.quotas[salt] = quota_bytes

    async def delete_objects(self, keys, *, tier="all", force=False):
        return len(keys), 0

    async def aclose(self) -> None:
        pass


@pytest.fixture
def enforcer(tmp_path):
    settings = CacheManagerSettings.model_validate({"data_dir": tmp_path, "follow_plans": False,
                                                    "lmcache_max_dram_bytes": 8 * GIB})
    db = Database.open(f"sqlite:///{tmp_path / 'cm.db'}", "cache_manager")
    servicer = CacheManagerServicer(ServiceContext(settings=settings, db=db, telemetry=None))  # type: ignore[arg-type]
    quotas = {"": 2 * GIB}
    servicer._admin = lambda url: FakeL2Admin(quotas)  # type: ignore[method-assign]
    with db.session() as s:
        s.add(LmcacheServer(id="s1", pool="chat", url="http://s1:8000", registered_at=utcnow()))
        s.commit()
    yield CacheEnforcer(servicer, 8 * GIB), quotas
    db.close()


def _plan(target: common_pb2.CacheTarget) -> common_pb2.Plan:
    now = time.time()
    iv = interval(now - 60, now + 3600, cache_targets=[target], pools=[common_pb2.PoolInterval(pool="chat")])
    return common_pb2.Plan(version=4, intervals=[iv])


async def test_a_medium_the_server_has_no_adapter_on_leaves_the_disk_tier_and_says_why(enforcer) -> None:
    enf, quotas = enforcer
    target = common_pb2.CacheTarget(pool="chat", dram_bytes=GIB, disk_bytes=4 * GIB, disk_medium="hdd",
                                    disk_path="/mnt/hdd/lmcache")
    plan = _plan(target)
    out = await enf.reconcile(plan, plan.intervals[0])
    assert out.state == APPLIED, out.detail  # the DRAM part is in force; the disk part is reported, not applied
    assert ("pool chat: disk target 4.0 GiB on hdd not applied on s1: it has no disk tier on hdd: no L2 fs adapter "
            "in /mnt/hdd/lmcache (its L2 adapter folders: /mnt/nvme/lmcache)") in out.detail
    assert "its disk tier stays at 2.0 GiB" in out.detail
    assert quotas == {"": 2 * GIB}  # unchanged

    target.disk_medium, target.disk_path = "nvme", NVME_DIR + "/"  # the server's own folder: applied at run time
    plan = _plan(target)
    out = await enf.reconcile(plan, plan.intervals[0])
    assert out.state == APPLIED and "disk 2.0 GiB -> 4.0 GiB without restart (s1)" in out.detail, out.detail
    assert quotas == {"": 4 * GIB}


@pytest.mark.parametrize(("kw", "field"), [
    ({"disk_medium": "tape", "disk_path": "/mnt/t"}, "disk_medium"),
    ({"disk_medium": "hdd", "disk_path": "relative"}, "disk_path"),
    ({"disk_path": "/mnt/hdd/lmcache"}, "disk_path"),  # a folder without its medium
])
async def test_a_bad_medium_is_refused_naming_the_field(enforcer, kw, field) -> None:
    enf, quotas = enforcer
    plan = _plan(common_pb2.CacheTarget(pool="chat", dram_bytes=GIB, disk_bytes=4 * GIB, **kw))
    out = await enf.reconcile(plan, plan.intervals[0])
    assert out.state == REFUSED and f"plan.intervals[0].cache_targets[0].{field}" in out.detail
    assert quotas == {"": 2 * GIB}
    with pytest.raises(InvalidArgument, match=f"targets\\[0\\].{field}"):  # ApplyCachePlan's check
        check_targets(plan.intervals[0].cache_targets, {"chat"})


async def test_resize_disk_refuses_a_medium_without_an_adapter() -> None:
    quotas = {"": 2 * GIB}
    admin = FakeL2Admin(quotas)
    out = await resize_disk(admin, None, 4 * GIB, 0.0, disk_medium="sata-ssd", disk_path="/mnt/ssd", settle_s=0.0)
    assert not out.applied and out.disk_bytes == 2 * GIB and "no disk tier on sata-ssd" in out.detail
    assert "the disk tier in force (2147483648 bytes) stays" in out.detail and quotas == {"": 2 * GIB}
    out = await resize_disk(admin, None, 4 * GIB, 0.0, disk_medium="nvme", disk_path=NVME_DIR, settle_s=0.0)
    assert out.applied and quotas == {"": 4 * GIB}
    state = DiskTierState(1, ("IsolatedLRU",), (NVME_DIR,), None, 0, 0)
    assert why_not_on_medium(state, "", "") == "" and why_not_on_medium(state, "nvme", NVME_DIR) == ""


async def test_on_a_real_lmcache_server_only_its_adapters_folder_takes_the_medium(l2_server) -> None:  # noqa: F811
    """LMCache 0.5.6 with one fs L2 adapter (IsolatedLRU): a target naming another folder leaves its quota; its own
    folder (as the planner's disk_path, trailing slash and all) is sized at run time."""
    server, folder = l2_server
    admin = LmcacheAdmin(server.http_url)
    try:
        before = (await admin.disk_state()).quota_bytes
        out = await resize_disk(admin, None, 8 * (1 << 20), 0.0, disk_medium="hdd", disk_path="/mnt/hdd/lmcache",
                                settle_s=0.0)
        assert not out.applied and f"(its L2 adapter folders: {folder})" in out.detail, out.detail
        assert (await admin.disk_state()).quota_bytes == before
        out = await resize_disk(admin, None, 8 * (1 << 20), 0.0, disk_medium="nvme", disk_path=f"{folder}/",
                                settle_s=0.0)
        assert out.applied, out.detail
        assert (await admin.disk_state()).quota_bytes == 8 * (1 << 20)
    finally:
        await admin.aclose()
