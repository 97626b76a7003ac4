"""The cache decision sees its effect on the fleet: a DRAM size whose prefix hits raise an engine's capacity enough
for min-carbon routing to unload an engine is weighed with the engines routing then loads, chosen by the joint plan,
and routing plans with the capacity at the chosen size (the planner runs the cache solver first)."""

from __future__ import annotations

import math

import pytest
from greenserve.common.carbon_params import load_default_params
from greenserve.optimizer import cache_profiles, capacity
from greenserve.optimizer.capacity import Capability
from greenserve.optimizer.plan_builder import Planner
from greenserve.optimizer.planning import PlanningInputs, SeriesForecast
from greenserve.optimizer.solvers.cache_greencache import GreenCacheIlp, engines_loaded
from greenserve.optimizer.solvers.keep_current import KeepCurrent
from greenserve.optimizer.solvers.routing_weights import MinCarbonRouting
from greenserve.v1 import common_pb2

from tests.optimizer.conftest import engine, pool

GIB = 1 << 30
IDLE_W = 100.0
HBM_CAPACITY = 2.0  # req/s per engine without a DRAM tier
DRAM_CAPACITY = 3.0  # with >= 32 GiB of DRAM: more prefix hits
LOAD_UPPER = 4.5  # 3 engines at 0.9 x 2.0, 2 engines at 0.9 x 3.0


def _power_w(rate: float) -> float:
    # Energy per request falls with the batch (concave in rate); the same at every cache size, so a DRAM tier
    # saves no energy on an engine at a given rate: it pays only through the engines it lets routing unload.
    return IDLE_W + 400.0 * math.sqrt(max(rate, 0.0))


@pytest.fixture
def fake_models(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    calls: list[tuple] = []

    def predict(profile, ttft_s, tpot_s, target, prompt, output, prefix_hit_fraction=0.0, dram_bytes=0):
        calls.append((prefix_hit_fraction, dram_bytes))
        cap = DRAM_CAPACITY if prefix_hit_fraction > 0 and dram_bytes >= 32 * GIB else HBM_CAPACITY
        return Capability(cap, IDLE_W, 400.0, "predicted", f"test {dram_bytes}")

    def grid(profile, tier, sizes, rates, ttft_s, tpot_s):
        ladder = (0.1, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0)
        row = tuple(_power_w(r) for r in ladder)
        ones = tuple(1.0 for _ in ladder)
        return cache_profiles.CacheGrid(tuple(sizes), ladder, tuple(ones for _ in sizes), tuple(ones for _ in sizes),
                                        tuple(row for _ in sizes), "test grid")

    monkeypatch.setattr(capacity, "predict", predict)
    monkeypatch.setattr(cache_profiles, "predict_grid", grid)
    return calls


def _inputs(hits: float) -> PlanningInputs:
    engines = [engine(f"e{i}") for i in range(3)]
    p = pool("chat", engines, max_cache_dram_bytes=64 * GIB, cache_step_bytes=32 * GIB)
    hours = 2
    cap = Capability(HBM_CAPACITY, IDLE_W, 400.0, "predicted", "test hbm")
    return PlanningInputs(
        start_s=1_656_460_800.0, horizon_hours=hours, fleet=common_pb2.FleetInventory(pools=[p]),
        ci={"FR": SeriesForecast((300.0,) * hours, (250.0,) * hours, (350.0,) * hours)},
        load={"chat": SeriesForecast((4.0,) * hours, (3.5,) * hours, (LOAD_UPPER,) * hours)},
        capabilities={e.id: cap for e in engines}, params=load_default_params(), gpu_platform={},
        prefix_hit_fraction={"chat": hits})


def _joint() -> Planner:
    return Planner([MinCarbonRouting(), GreenCacheIlp(), KeepCurrent("mig_layouts"), KeepCurrent("serving_modes")])


def test_engines_loaded_is_the_fewest_that_carry_the_load() -> None:
    assert engines_loaded(LOAD_UPPER, HBM_CAPACITY, 0.9, 3) == 3
    assert engines_loaded(LOAD_UPPER, DRAM_CAPACITY, 0.9, 3) == 2
    assert engines_loaded(5.4, 3.0, 0.9, 3) == 2  # exactly full: no extra engine
    assert engines_loaded(0.0, 3.0, 0.9, 3) == 1
    assert engines_loaded(100.0, 3.0, 0.9, 3) == 3
    assert engines_loaded(1.0, 0.0, 0.9, 3) == 3


def test_joint_plan_picks_the_dram_that_unloads_an_engine(fake_models: list[tuple]) -> None:
    planner = _joint()
    try:
        plan = planner.plan(_inputs(hits=0.5), trigger="test", created_s=1_656_460_800.0).plan
    finally:
        planner.close()
    for interval in plan.intervals:
        (target,) = [t for t in interval.cache_targets if t.pool == "chat"]
        assert target.dram_bytes >= 32 * GIB
        loaded = [w for w in interval.routing_weights if w.pool == "chat" and w.weight > 0]
        assert len(loaded) == 2  # routing planned with the capacity the chosen DRAM gives
        (figures,) = [p for p in interval.pools if p.pool == "chat"]
        assert figures.capacity_requests_per_s == pytest.approx(3 * DRAM_CAPACITY)
    assert (0.5, 32 * GIB) in fake_models
    # The solvers' outcomes stay in the planner's order, though the cache solver ran first.
    assert [o.knob for o in plan.solver_outcomes] == ["routing_weights", "cache_targets", "mig_layouts",
                                                      "serving_modes"]


def test_without_measured_reuse_the_dram_tier_buys_no_capacity(fake_models: list[tuple]) -> None:
    planner = _joint()
    try:
        plan = planner.plan(_inputs(hits=0.0), trigger="test", created_s=1_656_460_800.0).plan
    finally:
        planner.close()
    for interval in plan.intervals:
        (target,) = [t for t in interval.cache_targets if t.pool == "chat"]
        assert target.dram_bytes == 0  # same energy at every size: the DRAM's embodied carbon is not worth it
        assert len([w for w in interval.routing_weights if w.pool == "chat" and w.weight > 0]) == 3
    assert not fake_models  # no size-dependent capacity predicted


def test_evaluation_strategies_model_their_own_routing() -> None:
    from greenserve.evaluation import day

    def cache(strategy: str) -> GreenCacheIlp:
        return next(s for s in day.solvers_for(strategy) if isinstance(s, GreenCacheIlp))

    from greenserve.optimizer.solvers.coupled import CoupledSolver

    assert any(isinstance(s, CoupledSolver) for s in day.solvers_for("joint"))  # joint: one coupled decision
    assert not cache("greencache").routing_fills_fewest  # even routing: the load spread over every engine
