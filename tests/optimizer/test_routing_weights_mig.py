"""Routing weights for MIG pools: a plan whose layout partitions a pool's GPUs weights each instance's engine by its
capacity at the pool's SLO (not the whole-GPU engines), names a reported instance by its engine id and a new one by
placement, and the router resolves and routes by those weights."""

from __future__ import annotations

import pytest
from greenserve.common.carbon_params import load_default_params
from greenserve.optimizer.capacity import Capability
from greenserve.optimizer.plan_builder import Planner
from greenserve.optimizer.planning import (
    KnobPlan,
    PlanningInputs,
    SeriesForecast,
)
from greenserve.optimizer.solvers import mig_patterns as mp
from greenserve.optimizer.solvers.baselines import EvenRouting, FixedCache
from greenserve.optimizer.solvers.keep_current import KeepCurrent
from greenserve.optimizer.solvers.routing_weights import (
    MinCarbonRouting,
    placement_engine_id,
)
from greenserve.router.routing.enforcer import ActivePlan, PlanWatcher
from greenserve.router.routing.engines import EngineRegistry, EngineState, HealthPolicy
from greenserve.router.routing.policy import PolicyConfig, RoutingPolicy
from greenserve.router.routing.prefix_index import PrefixIndex
from greenserve.router.routing.scorers import rendezvous
from greenserve.v1 import common_pb2

HOURS = 2


class FixedLayouts:
    """The mig_layouts knob as given (stands in for the clover-exact solver, whose layouts its own tests check)."""

    knob = "mig_layouts"
    name = "mig_layouts.fixed"

    def __init__(self, layouts: list[common_pb2.MigLayout]) -> None:
        self.layouts = layouts

    def solve(self, inputs: PlanningInputs) -> KnobPlan:
        return KnobPlan([list(self.layouts) for _ in range(inputs.horizon_hours)])


def _fleet() -> common_pb2.FleetInventory:
    """Pool chat: two MIG-capable A100-80GB, each listed with a whole-GPU engine; GPU-1 already reports one 7g
    instance running engine ``n1-7g`` (the gpu-partitioner's id)."""
    fleet = common_pb2.FleetInventory()
    pool = fleet.pools.add(name="chat", model="meta-llama/Meta-Llama-3-8B-Instruct", region="R",
                           slo=common_pb2.Slo(ttft_s=2.0, tpot_s=0.15, attainment_fraction=0.9),
                           mean_prompt_tokens=512, mean_output_tokens=256)
    pool.variants.extend(v.to_proto() for v in mp.family("llama3-8b-instruct")[:2])
    for i in range(2):
        pool.engines.add(id=f"chat-{i}", pool="chat", hardware="A100-80GB", gpu_uuid=f"GPU-{i}",
                         model_variant=pool.variants[0].name)
    fleet.gpus.add(uuid="GPU-0", model=common_pb2.GPU_MODEL_A100_80GB, pool="chat", mig_enabled=True,
                   reported_by="operator")
    gpu1 = fleet.gpus.add(uuid="GPU-1", model=common_pb2.GPU_MODEL_A100_80GB, pool="chat", mig_enabled=True,
                          reported_by="gpu-partitioner/n1")
    gpu1.instances.add(uuid="MIG-1", profile="7g.80gb", placement_start=0, placement_size=8, engine_id="n1-7g")
    return fleet


def _layouts(variants: list[str]) -> list[common_pb2.MigLayout]:
    return [
        common_pb2.MigLayout(gpu_uuid="GPU-0", placements=[
            common_pb2.MigPlacement(profile="4g.40gb", start=0, size=4, pool="chat", model_variant=variants[0]),
            common_pb2.MigPlacement(profile="3g.40gb", start=4, size=4, pool="chat", model_variant=variants[1])]),
        common_pb2.MigLayout(gpu_uuid="GPU-1", placements=[
            common_pb2.MigPlacement(profile="7g.80gb", start=0, size=8, pool="chat", model_variant=variants[0])]),
    ]


def _inputs(fleet: common_pb2.FleetInventory, load: float = 4.0) -> PlanningInputs:
    flat = SeriesForecast((load,) * HOURS, (load,) * HOURS, (load * 1.1,) * HOURS)
    ci = SeriesForecast((300.0,) * HOURS, (300.0,) * HOURS, (300.0,) * HOURS)
    caps = {"chat-0": Capability(9.0, 60.0, 150.0, "predicted", "x"),
            "chat-1": Capability(9.0, 60.0, 120.0, "predicted", "x")}
    return PlanningInputs(start_s=0.0, horizon_hours=HOURS, fleet=fleet, ci={"R": ci}, load={"chat": flat},
                          capabilities=caps, params=load_default_params(), gpu_platform={})


def _capacity(pool: common_pb2.Pool, profile: str, variant: common_pb2.ModelVariant) -> float:
    option = mp.predicted_option(pool, "A100-80GB", profile, variant, variant.simulator_model, "x")
    assert option is not None
    return option.capacity_requests_per_s


def _plan(routing, load: float = 4.0) -> common_pb2.Plan:
    fleet = _fleet()
    names = [v.name for v in fleet.pools[0].variants]
    planner = Planner([routing, FixedCache(full=True), FixedLayouts(_layouts(names)), KeepCurrent("serving_modes")])
    try:
        return planner.plan(_inputs(fleet, load), trigger="test", created_s=0.0).plan
    finally:
        planner.close()


NEW_4G, NEW_3G = placement_engine_id("GPU-0", "4g.40gb", 0), placement_engine_id("GPU-0", "3g.40gb", 4)


def _options() -> dict[str, mp.Option]:
    pool = _fleet().pools[0]
    return {engine_id: mp.predicted_option(pool, "A100-80GB", profile, variant, variant.simulator_model, "x")
            for engine_id, profile, variant in ((NEW_4G, "4g.40gb", pool.variants[0]),
                                                (NEW_3G, "3g.40gb", pool.variants[1]),
                                                ("n1-7g", "7g.80gb", pool.variants[0]))}


def test_a_mig_pool_plan_weights_each_instance_by_its_capacity() -> None:
    plan = _plan(EvenRouting())
    assert NEW_4G == "mig:GPU-0/4g.40gb@0"
    expected_cap = {k: o.capacity_requests_per_s for k, o in _options().items()}
    assert len(set(expected_cap.values())) == 3  # three different capacities: proportionality is checked
    for interval in plan.intervals:
        weights = {w.engine_id: w.weight for w in interval.routing_weights if w.pool == "chat"}
        # the whole-GPU engines no longer run: weight 0; the reported 7g instance by its engine id, new ones by placement
        assert weights["chat-0"] == 0.0 and weights["chat-1"] == 0.0
        assert set(weights) == {"chat-0", "chat-1", *expected_cap}
        total_w, total_cap = sum(weights[k] for k in expected_cap), sum(expected_cap.values())
        assert total_w == pytest.approx(2.0)  # even routing gave the two GPUs' engines weight 1 each
        for engine_id, cap in expected_cap.items():
            assert weights[engine_id] == pytest.approx(total_w * cap / total_cap, rel=1e-4)
    outcome = next(o for o in plan.solver_outcomes if o.knob == "routing_weights")
    assert outcome.solver == "routing_weights.even" and outcome.status == "ok"


def test_min_carbon_routing_fills_the_cheapest_instances_first() -> None:
    options = _options()
    order = sorted(options, key=lambda k: options[k].energy_per_request_j)
    light = {w.engine_id: w.weight for w in _plan(MinCarbonRouting(), load=4.0).intervals[0].routing_weights}
    # 4.4 req/s (the forecast's upper bound) fits within 90 % of the cheapest instance: it takes everything
    assert 4.4 < 0.9 * options[order[0]].capacity_requests_per_s
    assert light[order[0]] == 1.0 and light[order[1]] == 0.0 and light[order[2]] == 0.0
    assert light["chat-0"] == 0.0 and light["chat-1"] == 0.0
    heavy = {w.engine_id: w.weight for w in _plan(MinCarbonRouting(), load=20.0).intervals[0].routing_weights}
    upper = 22.0
    first, second = (0.9 * options[k].capacity_requests_per_s for k in order[:2])
    assert first + second < upper < sum(0.9 * o.capacity_requests_per_s for o in options.values())
    assert heavy[order[0]] == pytest.approx(first / upper, abs=1e-5)
    assert heavy[order[1]] == pytest.approx(second / upper, abs=1e-5)
    assert heavy[order[2]] == pytest.approx(1 - (first + second) / upper, abs=1e-5)


def test_pools_and_hours_without_a_layout_keep_the_solvers_weights() -> None:
    fleet = _fleet()
    planner = Planner([MinCarbonRouting(), FixedCache(full=True), FixedLayouts([]), KeepCurrent("serving_modes")])
    try:
        plan = planner.plan(_inputs(fleet), trigger="test", created_s=0.0).plan
    finally:
        planner.close()
    for interval in plan.intervals:
        assert {w.engine_id for w in interval.routing_weights} == {"chat-0", "chat-1"}
        # min-carbon: the cheaper engine (chat-1, 120 J per request) takes the load up to its headroom first
        weights = {w.engine_id: w.weight for w in interval.routing_weights}
        assert weights["chat-1"] > weights["chat-0"]


def _router(engines: list[tuple[str, str, str]]) -> tuple[RoutingPolicy, ActivePlan]:
    registry = EngineRegistry(HealthPolicy())
    for engine_id, gpu, mig in engines:
        registry.upsert(EngineState(id=engine_id, url=f"http://{engine_id}", pool="chat", model="m", gpu_uuid=gpu,
                                    mig_uuid=mig))
    index = PrefixIndex(1 << 20)
    for e in registry.engines:
        index.add_engine(e)
    plans = ActivePlan(None)
    return RoutingPolicy(registry, index, plans, PolicyConfig()), plans


def test_the_router_resolves_instance_weights_and_routes_by_them() -> None:
    fleet = _fleet()
    plan = _plan(EvenRouting())
    plan.version = 1
    planned = {w.engine_id: w.weight for w in plan.intervals[0].routing_weights}
    # The gpu-partitioner created GPU-0's two instances and registered their engines under its own ids.
    policy, plans = _router([("n0-4g", "GPU-0", "MIG-a"), ("n0-3g", "GPU-0", "MIG-b"), ("n1-7g", "GPU-1", "MIG-1"),
                             ("chat-0", "GPU-0", "")])
    assert plans.apply(plan)
    reported = common_pb2.FleetInventory()
    reported.CopyFrom(fleet)
    gpu0 = reported.gpus[0]
    gpu0.instances.add(uuid="MIG-a", profile="4g.40gb", placement_start=0, placement_size=4, engine_id="n0-4g")
    gpu0.instances.add(uuid="MIG-b", profile="3g.40gb", placement_start=4, placement_size=4, engine_id="n0-3g")
    plans.apply_fleet(reported)  # what the router learns from GetFleet
    weights, version = plans.weights_for("chat")
    assert version == 1
    assert weights["n0-4g"] == planned["mig:GPU-0/4g.40gb@0"] and weights["n0-3g"] == planned["mig:GPU-0/3g.40gb@4"]
    assert weights["n1-7g"] == planned["n1-7g"] and weights["chat-0"] == 0.0
    assert {"n0-4g", "n0-3g", "n1-7g"} <= plans.engine_ids()
    # the router's report on the plan counts the resolved engines, none of them unknown
    watcher = PlanWatcher(plans, None, known_engines=lambda: {"n0-4g", "n0-3g", "n1-7g", "chat-0", "chat-1"})
    assert watcher.describe(plan, plan.intervals[0]) == "plan v1: weights for 1 pool(s), 5 engine(s)"
    # Routing: the whole-GPU engine (weight 0) never gets a request; keyed traffic splits by the weights.
    engines = [e for e in policy.registry.engines.values() if e.id != "chat-0"]
    assert all(policy.choose("chat", "", []).engine.id != "chat-0" for _ in range(20))
    counts = dict.fromkeys((e.id for e in engines), 0)
    n = 6000
    for key in range(1, n + 1):
        counts[rendezvous(key * 2654435761 % (1 << 63) + 1, engines, weights).id] += 1
    total_w = sum(weights[e.id] for e in engines)
    for e in engines:
        assert counts[e.id] / n == pytest.approx(weights[e.id] / total_w, abs=0.03)


def test_min_carbon_never_prefers_an_instance_it_cannot_predict() -> None:
    """BF16 8B does not fit a 1g.10gb slice (no prediction: neither capacity nor energy known): min-carbon routing
    fills the engine it knows first, instead of taking the unknown instance for a free one."""
    fleet = _fleet()
    pool = fleet.pools[0]
    pool.engines.add(id="elsewhere", pool="chat", hardware="A100-80GB", gpu_uuid="GPU-other")
    inputs = _inputs(fleet, load=2.0)
    inputs.capabilities["elsewhere"] = Capability(6.0, 60.0, 100.0, "predicted", "x")
    tiny = [common_pb2.MigLayout(gpu_uuid="GPU-0", placements=[
        common_pb2.MigPlacement(profile="1g.10gb", start=0, size=1, pool="chat", model_variant=pool.variants[0].name)])]
    planner = Planner([MinCarbonRouting(), FixedCache(full=True), FixedLayouts(tiny), KeepCurrent("serving_modes")])
    try:
        plan = planner.plan(inputs, trigger="test", created_s=0.0).plan
    finally:
        planner.close()
    weights = {w.engine_id: w.weight for w in plan.intervals[0].routing_weights}
    assert weights[placement_engine_id("GPU-0", "1g.10gb", 0)] == 0.0
    assert weights["elsewhere"] == 1.0 and weights["chat-0"] == 0.0


def test_a_declared_layout_keeps_the_declared_engines_and_their_variant() -> None:
    """A fleet the operator declares (engines on MIG devices by ``mig_uuid``, the GPU's instances listed, no
    gpu-partitioner report yet): the kept layout names each instance's declared engine and runs its variant, so
    min-carbon routing sends the load to the cheap 8B instances, not to the costly 70B engine (before the fix the
    placements defaulted to the pool's first variant, the 70B, which fits no 3g.40gb slice, and got weight 0)."""
    fleet = common_pb2.FleetInventory()
    pool = fleet.pools.add(name="chat", model="meta-llama/Meta-Llama-3-70B-Instruct", region="R",
                           slo=common_pb2.Slo(ttft_s=2.0, tpot_s=0.15, attainment_fraction=0.9),
                           mean_prompt_tokens=512, mean_output_tokens=256)
    big, small = mp.family("llama3-70b-instruct")[0].to_proto(), mp.family("llama3-8b-instruct")[0].to_proto()
    pool.variants.extend([big, small])
    pool.engines.add(id="big-0", pool="chat", hardware="4xA100-80GB", model_variant=big.name)
    for i, start in enumerate((0, 4)):
        pool.engines.add(id=f"small-{i}", pool="chat", hardware="A100-80GB-MIG-3g.40gb", gpu_uuid="GPU-m",
                         mig_uuid=f"MIG-m-{start}", model_variant=small.name)
    gpu = fleet.gpus.add(uuid="GPU-m", model=common_pb2.GPU_MODEL_A100_80GB, pool="chat", mig_enabled=True,
                         reported_by="operator")
    for start in (0, 4):
        gpu.instances.add(uuid=f"MIG-m-{start}", profile="3g.40gb", placement_start=start, placement_size=4)
    flat = SeriesForecast((0.5,) * HOURS, (0.5,) * HOURS, (0.5,) * HOURS)
    ci = SeriesForecast((300.0,) * HOURS, (300.0,) * HOURS, (300.0,) * HOURS)
    caps = {"big-0": Capability(3.0, 220.0, 580.0, "predicted", "x"),
            "small-0": Capability(2.3, 21.0, 70.0, "predicted", "x"),
            "small-1": Capability(2.3, 21.0, 70.0, "predicted", "x")}
    inputs = PlanningInputs(start_s=0.0, horizon_hours=HOURS, fleet=fleet, ci={"R": ci}, load={"chat": flat},
                            capabilities=caps, params=load_default_params(), gpu_platform={},
                            declared=fleet)
    planner = Planner([MinCarbonRouting(), FixedCache(full=True), KeepCurrent("mig_layouts"),
                       KeepCurrent("serving_modes")])
    try:
        plan = planner.plan(inputs, trigger="test", created_s=0.0).plan
    finally:
        planner.close()
    for interval in plan.intervals:
        placements = [pl for layout in interval.mig_layouts for pl in layout.placements]
        assert [pl.model_variant for pl in placements] == [small.name, small.name]
        weights = {w.engine_id: w.weight for w in interval.routing_weights if w.pool == "chat"}
        assert set(weights) == {"big-0", "small-0", "small-1"}  # declared ids, no placement ids
        assert weights["big-0"] == 0.0 and weights["small-0"] + weights["small-1"] == pytest.approx(1.0)
