"""The planner's capacity per engine counts prefix reuse as it really happens: the pool's measured hit fraction sets
the conversations' shape (how much of a prompt an earlier turn left), and the replay of those conversations on the
engine's own KV memory decides how much it hits: a large engine hits about that fraction and serves more, a small
one (or one loaded with more conversations than it can keep) evicts them, hits less and serves less. Without a
measured rate nothing changes."""

from __future__ import annotations

import dataclasses
import math

import pytest
from greenserve.optimizer import capacity
from greenserve.optimizer import inputs as inputs_module
from greenserve.optimizer.solvers import mig_patterns as mp
from greenserve.simulator.engine_profile import EngineProfile, load_profile
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


def _with_kv_tokens(kv_tokens: int) -> EngineProfile:
    """The evaluation's engine with HBM for ``kv_tokens`` tokens of KV (same compute)."""
    p = load_profile(PROFILE)
    fixed = p.n_params * p.weight_bytes_per_param + p.non_kv_reserve_bytes_per_gpu
    return dataclasses.replace(p, name=f"{PROFILE}-kv{kv_tokens}",
                               memory_bytes=(fixed + kv_tokens * p.kv_bytes_per_token) / p.gpu_memory_utilization)


def test_prefix_hits_raise_a_large_engines_capacity_and_cut_energy_per_request() -> None:
    none = capacity.predict(PROFILE, *SLO, PROMPT, OUTPUT)
    assert none == capacity.predict(PROFILE, *SLO, PROMPT, OUTPUT, 0.0)  # the default is no reuse
    assert none.predicted_hit_fraction == 0.0
    hits = capacity.predict(PROFILE, *SLO, PROMPT, OUTPUT, 0.6)
    # over the 600 s window (cache pressure shows) reuse still buys a large engine more than a tenth of capacity
    assert hits.capacity_requests_per_s > 1.1 * none.capacity_requests_per_s
    assert 0 < hits.energy_per_request_j < none.energy_per_request_j
    assert hits.idle_power_w == none.idle_power_w
    assert 0.45 <= hits.predicted_hit_fraction <= 0.7  # 442k tokens of KV keep about the pool's reuse
    assert "60% of prompts reusable" in hits.detail and "hit in its KV memory" in hits.detail


def test_a_small_memory_engine_hits_less_and_serves_less_at_the_same_rate_and_shape() -> None:
    large, small = load_profile(PROFILE), _with_kv_tokens(40_000)
    shape = capacity.conversation_shape(0.6, PROMPT, OUTPUT)
    _, _, hit_large = capacity._replay_conversations(large, 2.0, SLO[:2], OUTPUT, shape, 0)
    _, _, hit_small = capacity._replay_conversations(small, 2.0, SLO[:2], OUTPUT, shape, 0)
    assert hit_large > 0.5 and hit_small < 0.5 * hit_large  # the same 2 req/s of the same conversations
    cap_large = capacity.predict(large, *SLO, PROMPT, OUTPUT, 0.6)
    cap_small = capacity.predict(small, *SLO, PROMPT, OUTPUT, 0.6)
    assert cap_small.predicted_hit_fraction < 0.5 * cap_large.predicted_hit_fraction
    assert cap_small.capacity_requests_per_s < 0.5 * cap_large.capacity_requests_per_s
    # the old shared-prefix model raised the small engine's capacity too; its conversations' own prefixes do not fit
    assert cap_small.capacity_requests_per_s <= capacity.predict(small, *SLO, PROMPT, OUTPUT).capacity_requests_per_s


def test_a_dram_tier_gives_a_small_engine_back_some_hits() -> None:
    small = _with_kv_tokens(40_000)
    shape = capacity.conversation_shape(0.6, PROMPT, OUTPUT)
    _, _, hbm_only = capacity._replay_conversations(small, 2.0, SLO[:2], OUTPUT, shape, 0)
    _, _, with_dram = capacity._replay_conversations(small, 2.0, SLO[:2], OUTPUT, shape, 16 << 30)
    assert with_dram > hbm_only + 0.2
    with pytest.raises(ValueError, match="dram_bytes"):
        capacity.predict(small, *SLO, PROMPT, OUTPUT, 0.6, -1)


@pytest.mark.parametrize("fraction", [0.3, 0.6])
def test_the_conversation_shape_has_the_pools_prompt_length_and_measured_reuse(fraction: float) -> None:
    turns, user_tokens = capacity.conversation_shape(fraction, PROMPT, OUTPUT)
    work = capacity._conversations(1.0, (turns, user_tokens), OUTPUT, 0, 300)
    assert capacity.reusable_fraction(work) == pytest.approx(fraction, abs=0.06)
    assert sum(work.prompt_tokens) / len(work) == pytest.approx(PROMPT, rel=capacity.SHAPE_PROMPT_TOLERANCE)
    # each conversation keeps its own prefix: no two conversations share a block (the old model shared one)
    owners: dict[int, int] = {}
    for blocks, conv in zip(work.block_hashes, work.session_ids):
        for b in (b for b in blocks if b > 0):  # (a shared system prompt's blocks are negative)
            assert owners.setdefault(b, conv) == conv


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
    # The whole GPU's KV memory keeps the reuse and carries more; the slice's half is predicted on the pool's
    # conversations too, and over a 600 s window its smaller memory keeps too little of them to gain capacity.
    assert after["whole"].capacity_requests_per_s > before["whole"].capacity_requests_per_s
    assert "50% of prompts reusable" in after["slice"].detail and after["slice"] != before["slice"]
    for engine_id in ("whole", "slice"):
        assert other[engine_id] == before[engine_id]  # another pool's rate is not this one's
    pool = fleet.pools[0]
    slice_option = mp.predicted_option(pool, "A100-80GB", "4g.40gb", pool.variants[0],
                                       pool.variants[0].simulator_model, "x", 0.5)
    # a running instance and a planned one still agree (one capability source), hits included
    assert after["slice"].capacity_requests_per_s == pytest.approx(slice_option.capacity_requests_per_s)
    assert after["slice"].energy_per_request_j == pytest.approx(slice_option.energy_per_request_j)


def test_conversation_predictions_are_cached_so_the_planner_pays_once() -> None:
    small = _with_kv_tokens(40_000)
    first = capacity.predict(small, *SLO, PROMPT, OUTPUT, 0.6)
    hits_before = capacity.predict.cache_info().hits
    assert capacity.predict(small, *SLO, PROMPT, OUTPUT, 0.6) is first
    assert capacity.predict.cache_info().hits == hits_before + 1
    assert capacity.conversation_shape(0.6, PROMPT, OUTPUT) == capacity.conversation_shape(0.6, PROMPT, OUTPUT)
