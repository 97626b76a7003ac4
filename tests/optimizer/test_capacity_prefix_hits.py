"""The planner's capacity per engine counts the pool's measured prefix-cache hit fraction: the prefill the cache saves
raises the SLO capacity and lowers the energy per request; without a measured rate nothing changes."""

from __future__ import annotations

import math

import pytest
from greenserve.optimizer import capacity
from greenserve.optimizer import inputs as inputs_module
from greenserve.optimizer.solvers import mig_patterns as mp
from greenserve.v1 import common_pb2

PROFILE = "llama3-8b@A100-80GB"
SLO = (2.0, 0.15, 0.9)
PROMPT, OUTPUT = 1909, 256  # the evaluation's workload means


def test_hit_fraction_step_rounds_down_within_bounds() -> None:
    assert capacity.hit_fraction_step(0.0) == 0.0
    assert capacity.hit_fraction_step(math.nan) == 0.0
    assert capacity.hit_fraction_step(-0.2) == 0.0
    assert capacity.hit_fraction_step(0.049) == 0.0
    assert capacity.hit_fraction_step(0.05) == 0.05
    assert capacity.hit_fraction_step(0.599) == 0.55
    assert capacity.hit_fraction_step(0.66) == 0.65
    assert capacity.hit_fraction_step(0.99) == capacity.MAX_HIT_FRACTION


def test_prefix_hits_raise_capacity_and_cut_energy_per_request() -> None:
    none = capacity.predict(PROFILE, *SLO, PROMPT, OUTPUT)
    assert none == capacity.predict(PROFILE, *SLO, PROMPT, OUTPUT, 0.0)  # the default is no reuse
    half = capacity.predict(PROFILE, *SLO, PROMPT, OUTPUT, 0.5)
    most = capacity.predict(PROFILE, *SLO, PROMPT, OUTPUT, 0.8)
    assert none.capacity_requests_per_s < half.capacity_requests_per_s < most.capacity_requests_per_s
    assert none.energy_per_request_j > half.energy_per_request_j > most.energy_per_request_j > 0
    assert half.idle_power_w == none.idle_power_w
    assert "50% of each prompt prefix-cached" in half.detail


def test_the_replayed_requests_find_that_fraction_cached() -> None:
    workload = capacity._poisson(1.0, PROMPT, OUTPUT, seed=7, prefix_hit_fraction=0.5)
    assert workload.hash_block_tokens == capacity.PREFIX_BLOCK_TOKENS
    shared = len(workload.block_hashes[0]) * capacity.PREFIX_BLOCK_TOKENS
    assert 0.5 * PROMPT - capacity.PREFIX_BLOCK_TOKENS < shared <= 0.5 * PROMPT
    assert all(h == workload.block_hashes[0] for h in workload.block_hashes)
    assert capacity._poisson(1.0, PROMPT, OUTPUT, seed=7).block_hashes == []


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5])
def test_an_impossible_hit_fraction_is_refused_naming_it(bad: float) -> None:
    with pytest.raises(ValueError, match="prefix_hit_fraction"):
        capacity.predict(PROFILE, *SLO, PROMPT, OUTPUT, bad)


def _fleet() -> common_pb2.FleetInventory:
    fleet = common_pb2.FleetInventory()
    pool = fleet.pools.add(name="chat", model="meta-llama/Meta-Llama-3-8B-Instruct", region="R",
                           slo=common_pb2.Slo(ttft_s=SLO[0], tpot_s=SLO[1], attainment_fraction=SLO[2]),
                           mean_prompt_tokens=PROMPT, mean_output_tokens=OUTPUT)
    pool.variants.extend(v.to_proto() for v in mp.family("llama3-8b-instruct")[:1])
    pool.engines.add(id="whole", pool="chat", hardware="A100-80GB", gpu_uuid="GPU-1")
    pool.engines.add(id="slice", pool="chat", gpu_uuid="GPU-0", mig_uuid="MIG-a",
                     hardware="A100-80GB-MIG-4g.40gb")
    gpu = fleet.gpus.add(uuid="GPU-0", model=common_pb2.GPU_MODEL_A100_80GB, pool="chat", mig_enabled=True)
    gpu.instances.add(uuid="MIG-a", profile="4g.40gb", placement_start=0, placement_size=4, engine_id="slice")
    return fleet


def test_engine_capabilities_count_the_pools_hit_fraction() -> None:
    fleet = _fleet()
    before = inputs_module.capabilities(fleet, [], [])
    after = inputs_module.capabilities(fleet, [], [], {"chat": 0.5})
    other = inputs_module.capabilities(fleet, [], [], {"another-pool": 0.5})
    for engine_id in ("whole", "slice"):
        assert after[engine_id].capacity_requests_per_s > before[engine_id].capacity_requests_per_s
        assert other[engine_id] == before[engine_id]  # another pool's rate is not this one's
    pool = fleet.pools[0]
    slice_option = mp.predicted_option(pool, "A100-80GB", "4g.40gb", pool.variants[0],
                                       pool.variants[0].simulator_model, "x", 0.5)
    # a running instance and a planned one still agree (one capability source), hits included
    assert after["slice"].capacity_requests_per_s == pytest.approx(slice_option.capacity_requests_per_s)
    assert after["slice"].energy_per_request_j == pytest.approx(slice_option.energy_per_request_j)
