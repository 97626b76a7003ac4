"""A disk-tier shrink deletes in the adaptive policy's order (shrink_order.py): the leader of an LRU and an LCS
shadow of the target size over the pool's recent accesses; lowest LCS first while LCS leads, least recently used
first while LRU does."""

from __future__ import annotations

import asyncio

from greenserve.cache_manager.disk_tier import resize_disk
from greenserve.common.cache_index.index import CacheIndex
from greenserve.cache_manager.journal import Event
from greenserve.cache_manager.lmcache_admin import DiskTierState
from greenserve.cache_manager.shrink_order import (
    Leader,
    choose_leader,
    lru_victims_to_fit,
)
from greenserve.v1 import cache_manager_pb2 as pb

SIZE = 100


def _store(key: str, t: float) -> Event:
    return Event("p", key, pb.ACCESS_KIND_STORE, tokens=256, size_bytes=SIZE, time_s=t)


def _hit(key: str, t: float) -> Event:
    return Event("p", key, pb.ACCESS_KIND_HIT, tokens=256, hit_tokens=256, time_s=t)


def _hot_and_scans() -> list[Event]:
    """Four hot entries, each read 3 times in a burst after every scan of 4 one-off entries: a cache of 6 keeps
    them through the scans only by LCS (their hits), LRU drops them for the scans."""
    events, t = [], 0.0
    for h in range(4):
        events.append(_store(f"hot{h}", t))
        t += 1
    for round_ in range(30):
        for s in range(4):
            events.append(_store(f"scan{round_}_{s}", t))
            t += 1
        for h in range(4):
            for _ in range(3):
                events.append(_hit(f"hot{h}", t))
                t += 0.01
    return events


def _stale_hot() -> list[Event]:
    """Hot entries hit many times and never again, then a working set of 6 cycled (LRU keeps it, LCS keeps the
    stale hot entries for a while)."""
    events, t = [], 0.0
    for h in range(4):
        events.append(_store(f"old{h}", t))
        for _ in range(40):
            t += 0.1
            events.append(_hit(f"old{h}", t))
    for s in range(6):
        t += 1
        events.append(_store(f"ws{s}", t))
    for _ in range(20):
        for s in range(6):
            t += 1
            events.append(_hit(f"ws{s}", t))
    return events


def test_lcs_leads_where_reuse_is_skewed() -> None:
    leader = choose_leader(_hot_and_scans(), 6 * SIZE)
    assert leader.policy == "LCS" and leader.lcs_hit_tokens > leader.lru_hit_tokens * 1.05
    assert leader.events == len(_hot_and_scans()) and "LCS led" in leader.text()


def test_lru_leads_where_lcs_would_keep_stale_entries_and_without_evidence() -> None:
    leader = choose_leader(_stale_hot(), 6 * SIZE)
    assert leader.policy == "LRU" and leader.lru_hit_tokens >= leader.lcs_hit_tokens
    assert choose_leader([], 6 * SIZE).policy == "LRU"  # the burden of proof is on LCS, as in the replay


def test_lru_victims_are_the_oldest_leaves_children_before_parents() -> None:
    index = CacheIndex()
    index.store("a0", tokens=256, size_bytes=SIZE, now_s=0.0)
    index.store("a1", tokens=256, size_bytes=SIZE, now_s=1.0, parent_key="a0")
    index.store("b", tokens=256, size_bytes=SIZE, now_s=2.0)
    index.store("c", tokens=256, size_bytes=SIZE, now_s=3.0)
    index.hit("a0", hit_tokens=256, now_s=10.0)  # a0 is recent, but its child a1 is older and must go first
    assert lru_victims_to_fit(index, 3 * SIZE) == ["a1"]
    assert lru_victims_to_fit(index, SIZE) == ["a1", "b", "c"]
    assert lru_victims_to_fit(index, 4 * SIZE) == []


class _FakeAdmin:
    def __init__(self, used: int) -> None:
        self.used = used
        self.quota: int | None = 10 * SIZE
        self.deleted: list[str] = []

    async def disk_state(self, salt: str = "") -> DiskTierState:
        return DiskTierState(1, ("IsolatedLRU",), (), self.quota, self.used, self.used)

    async def delete_objects(self, keys: list[str], *, tier: str = "all", force: bool = False) -> tuple[int, int]:
        self.deleted += keys
        self.used -= SIZE * len(keys)
        return len(keys), 0

    async def set_quota(self, salt: str, quota_bytes: int) -> None:
        self.quota = quota_bytes


def _index() -> CacheIndex:
    """Old entries hit often (high LCS) and recent entries never hit (low LCS): the two orders disagree."""
    index = CacheIndex(hit_decay="none")
    for k in range(3):
        index.store(f"old{k}", tokens=256, size_bytes=SIZE, now_s=0.0)
        for i in range(20):
            index.hit(f"old{k}", hit_tokens=256, now_s=1.0 + i * 0.01 + k)
    for k in range(3):
        index.store(f"new{k}", tokens=256, size_bytes=SIZE, now_s=50.0 + k)
    return index


def test_shrink_follows_the_leader() -> None:
    async def run(policy: str | None) -> tuple[list[str], str]:
        admin = _FakeAdmin(6 * SIZE)

        async def order(target: int) -> Leader:
            assert target == 3 * SIZE
            return Leader(policy or "LCS", 1.0, 2.0, 7)

        outcome = await resize_disk(admin, _index(), 3 * SIZE, 60.0, settle_s=0.0,  # type: ignore[arg-type]
                                    choose_order=order if policy else None)
        assert outcome.applied and admin.quota == 3 * SIZE
        return admin.deleted, outcome.detail

    # Strictly under the target (IsolatedLRU evicts at the quota): 4 of the 6 go, in the leader's order.
    lcs, detail = asyncio.run(run("LCS"))
    assert set(lcs[:3]) == {"new0", "new1", "new2"} and len(lcs) == 4
    assert "4 lowest-LCS entries evicted first" in detail and "adaptive order: LCS led" in detail
    lru, detail = asyncio.run(run("LRU"))
    assert lru == ["old0", "old1", "old2", "new0"]
    assert "4 least recently used entries evicted first" in detail and "adaptive order: LRU led" in detail
    plain, detail = asyncio.run(run(None))
    assert plain == lcs and "4 lowest-LCS entries evicted first" in detail and "adaptive" not in detail
