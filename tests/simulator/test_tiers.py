"""LMCache tiers of the simulator (tiers.py): eviction by LRU / FIFO / LCS, elastic disk with group TTLs and
its block-seconds, disk bandwidth by medium, and bad tier settings refused naming the field."""

from __future__ import annotations

import pytest

from greenserve.simulator.replay import replay
from greenserve.simulator.replay_fleet import EngineSpec, FleetConfig
from greenserve.simulator.tiers import DISK_MEDIA, Tier, TierSpec
from greenserve.simulator.workloads import multi_turn_workload


def _tier(policy: str, cap_blocks: int = 3, **kw) -> Tier:
    return Tier(TierSpec(cap_blocks * 16, policy, **kw), 16)


@pytest.mark.parametrize("policy, kept", [("LRU", {2, 3, 4}), ("FIFO", {2, 3, 4}), ("LCS", {1, 3, 4})])
def test_eviction_policies(policy: str, kept: set[int]) -> None:
    tier = _tier(policy)
    for t in range(5):  # block 1 reused five times
        tier.put((1,), float(t))
    for t, b in ((5.0, 2), (6.0, 3), (7.0, 4)):
        tier.put((b,), t)
    # LRU and FIFO drop block 1 (oldest); LCS keeps it for its reuse and drops 2 (stored once, oldest of those).
    assert set(tier.blocks) == kept


def test_fifo_does_not_reorder_on_reuse() -> None:
    lru, fifo = _tier("LRU", 2), _tier("FIFO", 2)
    for tier in (lru, fifo):
        tier.put((1,), 0.0)
        tier.put((2,), 1.0)
        tier.put((1,), 2.0)
        tier.put((3,), 3.0)
    assert set(lru.blocks) == {1, 3} and set(fifo.blocks) == {2, 3}


def test_lcs_keeps_prefix_chains_leaves_first() -> None:
    tier = _tier("LCS", 3)
    tier.put((10, 11, 12), 0.0)
    tier.put((20,), 1.0)  # over capacity by one: a leaf goes, never the chain's parent before its child
    assert 10 in tier.blocks and len(tier) == 3


def test_elastic_tier_group_ttls_and_block_seconds() -> None:
    tier = Tier(TierSpec(0, "LRU", ttl_s=10.0, group_ttls_s={100: 50.0}), 16)
    tier.put((100, 101), 0.0)  # group 100: TTL 50 s
    tier.put((7, 8), 0.0)  # other groups: 10 s
    tier.expire(20.0)
    assert set(tier.blocks) == {100, 101}
    tier.expire(60.0)
    assert len(tier) == 0
    # 2 blocks for 10 s + 2 blocks for 50 s, whatever the times the expiry was looked at
    assert tier.block_seconds == pytest.approx(2 * 10 + 2 * 50)


def test_disk_medium_sets_bandwidth() -> None:
    hdd = EngineSpec(disk_capacity_tokens=1 << 20, disk_medium="hdd").resolved_profile()
    assert (hdd.disk_bandwidth_bytes_per_s, hdd.disk_latency_s) == DISK_MEDIA["hdd"]
    default = EngineSpec().resolved_profile()
    assert default.disk_bandwidth_bytes_per_s == DISK_MEDIA["nvme"][0]  # the profile's disk is that NVMe


@pytest.mark.parametrize("kw, field", [
    ({"disk_policy": "MRU"}, "policy"), ({"disk_policy": "FIFO", "disk_ttl_s": 60.0}, "policy"),
    ({"disk_ttl_s": -1.0}, "ttl_s"), ({"disk_medium": "tape"}, "disk_medium")])
def test_bad_tier_settings_refused_naming_the_field(kw: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        FleetConfig(engines=(EngineSpec(disk_capacity_tokens=1 << 16, **kw),))


def test_replay_with_lcs_dram_and_elastic_disk() -> None:
    w = multi_turn_workload(60, 0.5, seed=3)
    common = {"dram_capacity_tokens": 4096, "dram_policy": "LCS", "prefix_caching": False}
    fixed = replay(w, FleetConfig(engines=(EngineSpec(disk_capacity_tokens=1 << 16, **common),)))
    elastic = replay(w, FleetConfig(engines=(EngineSpec(disk_ttl_s=120.0, **common),)))
    for res in (fixed, elastic):
        assert res.completed.all()
        assert res.hit_dram_tokens.sum() + res.hit_disk_tokens.sum() > 0
        assert res.tier_block_seconds["disk"] > 0 and res.tier_block_seconds["dram"] > 0
    # The elastic tier holds blocks only while they are within their TTL: less than the unbounded content.
    assert elastic.tier_block_seconds["disk"] < fixed.tier_block_seconds["disk"]


def test_storage_embodied_carbon_of_allocated_tiers() -> None:
    from greenserve.common.carbon_params import CarbonParams

    w = multi_turn_workload(30, 0.5, seed=4)
    cap = 1 << 16
    res = replay(w, FleetConfig(engines=(EngineSpec(dram_capacity_tokens=cap, disk_capacity_tokens=4 * cap),)))
    kvb = EngineSpec().resolved_profile().kv_bytes_per_token
    # A fixed tier is charged its whole capacity for the whole replay (GreenCache Eq. 4: S_alloc x T).
    assert res.tier_allocated_byte_seconds["dram"] == pytest.approx(cap * kvb * res.makespan_s)
    assert res.tier_allocated_byte_seconds["disk"] == pytest.approx(4 * cap * kvb * res.makespan_s)
    params = CarbonParams.load()
    out = res.carbon(100.0, storage_params=params)
    want_disk = 4 * cap * kvb / 1e12 * res.makespan_s / params.ssd_lifetime_s * params.ssd_embodied_g_per_tb
    assert out["storage_embodied_g"]["disk"] == pytest.approx(want_disk)
    assert out["total_g"] == pytest.approx(res.carbon(100.0)["total_g"] + sum(out["storage_embodied_g"].values()))


def test_group_depth_names_the_group_by_a_deeper_block() -> None:
    # Every prompt shares block 0 (a system prompt); the group is the second block.
    tier = Tier(TierSpec(0, "LRU", ttl_s=10.0, group_ttls_s={5: 100.0}, group_depth=1), 16)
    tier.put((0, 5, 6), 0.0)
    tier.put((0, 7, 8), 0.0)
    tier.expire(50.0)
    # Group 5 keeps its blocks for 100 s (block 0 too: a block belongs to the group that stored it first);
    # group 7 lost its own after 10 s.
    assert set(tier.blocks) == {0, 5, 6}
    with pytest.raises(ValueError, match="group_depth"):
        TierSpec(0, "LRU", ttl_s=1.0, group_depth=-1)
