"""Prefix-cache contents carried from one replay to the next (replay(..., initial_contents=) and
ReplayResult.tier_contents): what the evaluation uses to carry cache state from hour to hour."""

from __future__ import annotations

import pytest

from greenserve.simulator.replay import replay
from greenserve.simulator.replay_fleet import EngineSpec, FleetConfig
from greenserve.simulator.tiers import PrefixTiers, TierSpec
from greenserve.simulator.workloads import multi_turn_workload


def _fleet(dram_tokens: int) -> FleetConfig:
    return FleetConfig(tuple(EngineSpec("llama3-8b@A100-80GB", dram_capacity_tokens=dram_tokens) for _ in range(2)),
                       policy="round_robin", seed=3)


def _hits(result) -> int:
    return int(result.hit_hbm_tokens.sum() + result.hit_dram_tokens.sum() + result.hit_disk_tokens.sum())


def test_carried_contents_are_hit_and_no_carry_is_unchanged() -> None:
    work = multi_turn_workload(40, 1.0, seed=5, mean_turns=3.0)
    cold = replay(work, _fleet(200_000))
    assert len(cold.tier_contents) == 2 and all(c["dram"] for c in cold.tier_contents)
    warm = replay(work, _fleet(200_000), initial_contents=cold.tier_contents)
    # the same prompts again, starting from where the first replay ended: every first turn finds its prompt
    assert _hits(warm) > _hits(cold)
    again = replay(work, _fleet(200_000))
    assert _hits(again) == _hits(cold)
    # an empty carry is the cold start
    empty = replay(work, _fleet(200_000), initial_contents=[{}, {}])
    assert _hits(empty) == _hits(cold)


def test_preload_keeps_what_the_capacity_holds_newest_first() -> None:
    tiers = PrefixTiers(16, TierSpec(3 * 16), TierSpec(0))
    tiers.preload({"hbm": (1, 2, 3, 4), "dram": (1, 2, 3, 4, 5), "disk": (9,)}, hbm_free_blocks=2)
    held = tiers.contents()
    assert held["hbm"] == (3, 4) and held["dram"] == (3, 4, 5) and held["disk"] == ()
    tiers.preload({"hbm": (7,)}, hbm_free_blocks=None)  # prefix caching off: HBM untouched
    assert tiers.contents()["hbm"] == (3, 4)


def test_bad_carry_refused_naming_the_argument() -> None:
    work = multi_turn_workload(4, 1.0, seed=1)
    with pytest.raises(ValueError, match="initial_contents"):
        replay(work, _fleet(1000), initial_contents=[{}])
    with pytest.raises(ValueError, match="contents: unknown tier 'l3'"):
        replay(work, _fleet(1000), initial_contents=[{"l3": (1,)}, {}])
