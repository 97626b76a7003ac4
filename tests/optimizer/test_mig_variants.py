"""Variants on MIG slices (issue 19 items 1-4): the exact solver against brute force, the SLA as a hard constraint
(CLOVER's Eq. 6 flaw), change costs, CLOVER's SA and random search, the solver in the planner, and fleet checks."""

from __future__ import annotations

import itertools
import math

import pytest
from greenserve.common.carbon_params import load_default_params
from greenserve.common.errors import InvalidArgument
from greenserve.common.mig_geometry import Placement, geometry
from greenserve.optimizer.capacity import Capability
from greenserve.optimizer.fleet import validate_fleet
from greenserve.optimizer.planning import PlanningInputs, SeriesForecast
from greenserve.optimizer.solvers import default_solvers
from greenserve.bench import mig_search
from greenserve.optimizer.solvers import mig_patterns as mp
from greenserve.optimizer.solvers import mig_milp as milp
from greenserve.optimizer.solvers import mig_problem as mpb
from greenserve.optimizer.solvers import mig_setup as ms
from greenserve.optimizer.solvers import mig_variants as mv
from greenserve.v1 import common_pb2

MODEL = "A100-40GB"


def _pool(variants: list[tuple[str, float]]) -> common_pb2.Pool:
    pool = common_pb2.Pool(name="chat", model="m", region="R",
                           slo=common_pb2.Slo(ttft_s=1.0, tpot_s=0.1, attainment_fraction=0.9))
    for name, quality in variants:
        pool.variants.add(name=name, model=f"m-{name}", quality_fraction=quality)
    return pool


def fake_option(gpu_model: str, profile: str, variant: common_pb2.ModelVariant | None) -> mp.Option | None:
    """Synthetic capabilities: "big" (quality 1) needs a 3g or larger; "small" (quality 0.9) fits any slice, serves
    more per SM and spends less energy per request. Idle power is the slice's share of the GPU's."""
    geo = geometry(gpu_model)
    cs = geo.profile(profile).compute_slices
    share = mpb.none_idle_w(gpu_model, profile)
    if variant.name == "big":
        if cs < 3:
            return None
        return mp.Option(1.0 * cs, share, 100.0, variant.quality_fraction, "test", "")
    return mp.Option(1.6 * cs ** 0.9, share, 60.0, variant.quality_fraction, "test", "")


def _setup(n: int, states: list[mpb.State] | None = None) -> ms.PoolSetup:
    pool = _pool([("big", 1.0), ("small", 0.9)])
    states = states or [()] * n
    return ms.make_setup(pool, [(f"GPU-{i}", MODEL, states[i]) for i in range(n)], fake_option)


def _brute_force(problem: mpb.Problem) -> float:
    """Best objective over every tuple of per-GPU patterns (each GPU chosen independently, with its own change;
    a GPU may also stay exactly as it runs)."""
    (group,) = problem.groups
    best = -math.inf
    if len(set(group.states)) == 1:  # GPUs alike: unordered choices cover every assignment
        keep = mp.keep_pattern(MODEL, group.states[0])
        choices = itertools.combinations_with_replacement(group.patterns + ([keep] if keep else []), len(group.uuids))
    else:
        choices = itertools.product(*[group.patterns + [k for k in (mp.keep_pattern(MODEL, st),) if k]
                                      for st in group.states])
    for choice in choices:
        counts: dict = {}
        change_g, restarted = 0.0, 0
        for state, p in zip(group.states, choice):
            counts[(0, p)] = counts.get((0, p), 0) + 1
            started = mp.restarts(state, p)[0]
            change_g += problem.change_g(started, MODEL)
            restarted += len(started) + mp.stopped(state, p)
        result = mpb.evaluate(problem, counts)
        if result is None:
            continue
        value = (result[0] - problem.weight * 100 * change_g / problem.base_carbon_g - mpb.TIE_BREAK * restarted)
        best = max(best, value)
    return best


def test_patterns_follow_the_partitioner_geometry() -> None:
    classes = mp.layout_classes(MODEL)
    assert ("7g.40gb",) in classes and ("1g.5gb",) * 7 in classes
    for layouts in classes.values():
        for layout in layouts:
            geometry(MODEL).validate(layout)
    setup = _setup(1)
    (group,) = setup.groups
    for p in group.patterns:  # "big" never lands on a 1g/2g slice
        assert all(v != "big" or geometry(MODEL).profile(prof).compute_slices >= 3 for prof, v in p.kinds)
    assert mp.ged({("3g", "a"): 2}, {("3g", "a"): 1, ("3g", "b"): 1}) == 2  # one variant swapped: GED 2


@pytest.mark.parametrize("weight,cap,load,gpus", [(0.2, None, 9.0, 2), (0.8, None, 12.0, 2), (0.8, 0.03, 3.0, 1)])
def test_exact_optimum_equals_brute_force(weight: float, cap: float | None, load: float, gpus: int) -> None:
    setup = _setup(gpus)
    if True:
        problem = ms.problem_for(setup, None, load, 400.0, 300.0, 1.5, weight, max_accuracy_loss=cap, change_s=0.0)
        solution = milp.solve_exact(problem)
        assert solution.status == "optimal"
        assert solution.objective == pytest.approx(_brute_force(problem), abs=1e-5)
        assert sum(solution.flows.values()) == pytest.approx(load)  # the SLA holds: all load within capacity
        if cap is not None:
            assert solution.d_accuracy >= -100 * cap - 1e-6


@pytest.mark.parametrize("change_s", [0.0, 600.0, 36000.0])
def test_exact_optimum_with_change_costs_equals_brute_force(change_s: float) -> None:
    """Two GPUs in different states (one whole "big", one 3g "small" + 3g "big"): the exact plan with its change
    costs equals the best of every per-GPU choice (staying as it runs included)."""
    whole = ((Placement(0, 8, "7g.40gb"), "big"),)
    split = ((Placement(0, 4, "3g.20gb"), "small"), (Placement(4, 4, "3g.20gb"), "big"))
    setup = _setup(2, [whole, split])
    for load, weight in ((6.0, 0.7), (11.0, 0.3)):
        problem = ms.problem_for(setup, None, load, 400.0, 300.0, 1.5, weight, change_s=change_s)
        solution = milp.solve_exact(problem)
        assert solution.objective == pytest.approx(_brute_force(problem), abs=1e-5)
        if change_s == 36000.0:
            assert solution.restarts == 0  # ten hours of idle carbon per restart: nothing is worth it


def test_pattern_aggregation_loses_nothing_on_one_gpu() -> None:
    """One GPU, every concrete layout x every variant per instance: the best equals the exact solver's."""
    setup = _setup(1)
    problem = ms.problem_for(setup, None, 4.0, 300.0, 300.0, 1.5, 0.6, change_s=0.0)
    by_kinds = {(p.profiles, p.kinds): p for p in setup.groups[0].patterns}
    best = -math.inf
    for cls, layouts in mp.layout_classes(MODEL).items():
        for layout in layouts[:1] if len(layouts) > 4 else layouts:
            options = [[v for v in ("big", "small") if (MODEL, p.profile, v) in setup.options] or [""] for p in layout]
            for combo in itertools.product(*options):
                kinds = tuple(sorted((p.profile, v) for p, v in zip(layout, combo)))
                result = mpb.evaluate(problem, {(0, by_kinds[(cls, kinds)]): 1})
                if result is not None:
                    best = max(best, result[0])
    assert milp.solve_exact(problem).f == pytest.approx(best, abs=1e-6)


def test_overload_is_planned_at_the_most_any_layout_serves() -> None:
    setup = _setup(2)
    problem = ms.problem_for(setup, None, 1000.0, 300.0, 300.0, 1.5, 0.5, change_s=0.0)
    solution = milp.solve_exact(problem)
    assert solution.served_rps == pytest.approx(mpb.max_servable(problem))
    assert any("exceeds" in n for n in problem.notes)


def test_sla_violation_never_scores_better_clover_eq6_would() -> None:
    # CLOVER's Eq. 6 with f < 0: the configuration that misses the tail-latency target by 2x scores better.
    feasible_f, violating_f = -10.0, -12.0
    assert mig_search.clover_energy(violating_f, latency_s=2.0, tail_s=1.0) < mig_search.clover_energy(
        feasible_f, latency_s=0.5, tail_s=1.0)
    # Here an SLA-violating configuration ranks below every feasible one.
    setup = _setup(2)
    problem = ms.problem_for(setup, None, 13.0, 300.0, 300.0, 1.5, 0.5, change_s=0.0)
    (group,) = problem.groups
    whole_big = next(p for p in group.patterns if p.kinds == (("7g.40gb", "big"),))
    weak = {(0, whole_big): 2}  # 2 x 6.3 req/s of SLO capacity for 13 req/s
    h_bad, f_bad = mig_search.energy(problem, weak)
    assert f_bad is None and h_bad >= mig_search.INFEASIBLE
    worst_feasible = max(mig_search.energy(problem, {(0, a): 1, (0, b): 1})[0]
                         for a, b in itertools.combinations_with_replacement(group.patterns, 2)
                         if mig_search.energy(problem, {(0, a): 1, (0, b): 1})[1] is not None)
    assert h_bad > worst_feasible


def test_change_cost_keeps_a_gpu_unless_the_saving_pays_for_it() -> None:
    big = (Placement(0, 8, "7g.40gb"), "big")
    # Low lambda: a near-tie between BF16-like "big" and the reshuffle; the change cost decides.
    setup = _setup(2, [(big,), (big,)])
    free = milp.solve_exact(ms.problem_for(setup, None, 2.0, 300.0, 300.0, 1.5, 0.9, change_s=0.0))
    assert free.restarts > 0  # without a change cost the optimum moves to the cheaper variant
    costly = milp.solve_exact(ms.problem_for(setup, None, 2.0, 300.0, 300.0, 1.5, 0.9, change_s=36000.0))
    assert costly.restarts == 0 and costly.change_g == 0.0
    # The saving of the free plan is below what its restarts would cost under the costly change time.
    problem = ms.problem_for(setup, None, 2.0, 300.0, 300.0, 1.5, 0.9, change_s=36000.0)
    assert free.f - costly.f < problem.weight * 100 * sum(
        problem.change_g([("7g.40gb", "small")], MODEL) for _ in range(free.restarts)) / problem.base_carbon_g
    # Equal objectives: the state in force is kept (tie-break), at any change cost.
    same = milp.solve_exact(ms.problem_for(setup, None, 0.0, 300.0, 300.0, 1.5, 0.0, change_s=1.0))
    assert same.restarts == 0


def test_graph_edit_distance_bound_between_hours() -> None:
    big = (Placement(0, 8, "7g.40gb"), "big")
    setup = _setup(3, [(big,)] * 3)
    first = ms.problem_for(setup, None, 2.0, 300.0, 300.0, 1.5, 0.9, change_s=0.0)
    previous = mpb.instances_of(first, {(0, next(p for p in first.groups[0].patterns
                                                 if p.kinds == (("7g.40gb", "big"),))): 3})
    free = milp.solve_exact(ms.problem_for(setup, None, 2.0, 300.0, 300.0, 1.5, 0.9, change_s=0.0,
                                         max_ged=None, previous_graph=previous))
    free_ged = mp.ged(ms.graph_of(first, free), previous)
    assert free_ged >= 2  # the free optimum moves load to the cheaper variant
    bounded_problem = ms.problem_for(setup, None, 2.0, 300.0, 300.0, 1.5, 0.9, change_s=0.0, max_ged=free_ged - 2,
                                     previous_graph=previous)
    bounded = milp.solve_exact(bounded_problem)
    assert mp.ged(ms.graph_of(bounded_problem, bounded), previous) <= free_ged - 2
    assert bounded.f < free.f


def test_annealing_and_random_search_never_beat_the_optimum() -> None:
    setup = _setup(3)
    problem = ms.problem_for(setup, None, 8.0, 400.0, 300.0, 1.5, 0.5, change_s=0.0)
    optimum = milp.solve_exact(problem).f
    for seed in range(3):
        sa = mig_search.anneal(problem, seed=seed)
        rnd = mig_search.random_search(problem, sa.evaluations, seed=seed)
        assert sa.evaluations >= 6  # at least the start and 5 evaluations without improvement
        for result in (sa, rnd):
            if result.f is not None:
                assert result.f <= optimum + 1e-9


# ----------------------------------------------------------------------------------------------------------------
# In the planner, and the fleet checks
# ----------------------------------------------------------------------------------------------------------------


def _inputs(fleet: common_pb2.FleetInventory, load: float, ci_values: tuple[float, ...] = (300.0, 500.0)
            ) -> PlanningInputs:
    hours = len(ci_values)
    flat = SeriesForecast((load,) * hours, (load,) * hours, (load,) * hours)
    ci = SeriesForecast(ci_values, ci_values, ci_values)
    return PlanningInputs(start_s=0.0, horizon_hours=hours, fleet=fleet, ci={"R": ci}, load={"chat": flat},
                          capabilities={}, params=load_default_params(), gpu_platform={},
                          carbon_weight_fraction=0.5)


def test_solver_plans_valid_layouts_with_variants_and_leaves_other_gpus() -> None:
    fleet = common_pb2.FleetInventory()
    pool = fleet.pools.add()
    pool.CopyFrom(_pool([]))
    pool.model = "meta-llama/Meta-Llama-3-8B-Instruct"
    pool.variants.extend(v.to_proto() for v in mp.family("llama3-8b-instruct")[:2])
    fleet.gpus.add(uuid="GPU-0", model=common_pb2.GPU_MODEL_A100_80GB, pool="chat", mig_enabled=True)
    fleet.gpus.add(uuid="GPU-1", model=common_pb2.GPU_MODEL_A100_80GB, pool="chat", mig_enabled=True)
    fleet.gpus.add(uuid="GPU-x", model=common_pb2.GPU_MODEL_OTHER, pool="chat")
    fleet.gpus.add(uuid="GPU-whole", model=common_pb2.GPU_MODEL_A100_80GB, pool="chat")  # MIG off: runs whole
    pool.engines.add(id="whole", hardware="A100-80GB", gpu_uuid="GPU-whole")
    validate_fleet(fleet)
    solver = next(s for s in default_solvers() if s.knob == "mig_layouts")
    assert solver.name == "mig_layouts.clover_exact"
    plan = solver.solve(_inputs(fleet, load=3.0))
    assert plan.status == "ok" and len(plan.per_interval) == 2
    names = {v.name for v in pool.variants}
    for hour in plan.per_interval:
        layouts = {m.gpu_uuid: m for m in hour}
        assert set(layouts) == {"GPU-0", "GPU-1"}  # neither the non-MIG GPU nor the one running whole
        engines = []
        for layout in layouts.values():
            geometry("A100-80GB").validate([Placement(p.start, p.size, p.profile) for p in layout.placements])
            engines += [p for p in layout.placements if p.pool]
        # 3 req/s needs engines; a GPU that no load needs may stay without (starting engines costs carbon).
        assert engines and all(p.pool == "chat" and p.model_variant in names for p in engines)
    assert any("pool chat, hour 0" in line for line in plan.explanation)
    assert "2 pool-hour(s) solved (each proven optimal)" in plan.detail
    # CI within 5 % of the last solve (CLOVER's trigger): the hour keeps the configuration, unsolved.
    steady = solver.solve(_inputs(fleet, load=3.0, ci_values=(300.0, 310.0, 400.0)))
    assert "2 pool-hour(s) solved" in steady.detail and "1 kept" in steady.detail
    assert list(steady.per_interval[1]) == list(steady.per_interval[0])


def test_variant_without_profile_or_simulator_model_is_refused_naming_the_field() -> None:
    pool = _pool([("mystery", 1.0)])
    with pytest.raises(mp.NoOption) as err:
        mp.predicted_option(pool, MODEL, "7g.40gb", pool.variants[0], None,
                            "fleet.pools[0].variants[0].simulator_model")
    assert err.value.field == "fleet.pools[0].variants[0].simulator_model"
    fleet = common_pb2.FleetInventory(pools=[pool])
    fleet.pools[0].variants[0].simulator_model = "gpt-17"
    with pytest.raises(InvalidArgument) as bad:
        validate_fleet(fleet)
    assert "fleet.pools[0].variants[0].simulator_model" in str(bad.value)


def test_layout_a_gpu_cannot_hold_is_refused_naming_the_field() -> None:
    fleet = common_pb2.FleetInventory(pools=[_pool([])])
    gpu = fleet.gpus.add(uuid="GPU-0", model=common_pb2.GPU_MODEL_A100_40GB, pool="chat", mig_enabled=True)
    gpu.instances.add(profile="4g.20gb", placement_start=0, placement_size=4)
    gpu.instances.add(profile="3g.20gb", placement_start=4, placement_size=4)
    validate_fleet(fleet)  # 4g + 3g is a valid layout
    gpu.instances.add(profile="1g.5gb", placement_start=6, placement_size=1)  # overlaps the 3g
    with pytest.raises(InvalidArgument) as err:
        validate_fleet(fleet)
    assert "fleet.gpus[0].instances[2]" in str(err.value)
    gpu.instances[2].profile = "1g.10gb+me"
    with pytest.raises(InvalidArgument) as err:
        validate_fleet(fleet)
    assert "fleet.gpus[0].instances[2].profile" in str(err.value)
    # A GPU declared without its model (the demo's: its gpu-partitioner reports it) is checked by the reported one.
    gpu.ClearField("model")
    validate_fleet(fleet)
    with pytest.raises(InvalidArgument) as err:
        validate_fleet(fleet, {"GPU-0"}, {"GPU-0": common_pb2.GPU_MODEL_A100_40GB})
    assert "fleet.gpus[0].instances[2].profile" in str(err.value)


def test_catalogue_cites_every_quality_figure() -> None:
    for v in mp.catalogue().values():
        assert 0 < v.quality_fraction <= 1 and v.source and v.baseline_score > 0
        assert v.to_proto().quality_source.startswith(v.source)
    assert mp.family("llama3-8b-instruct")[0].quality_fraction == 1.0


def test_a_gpu_is_kept_as_it_runs_when_nothing_needs_it_to_change() -> None:
    """The demo's GPU: two 3g.20gb engines of BF16 8B (which the memory check says do not fit), the pool's load
    carried by engines elsewhere: the plan keeps both engines where they are (no stop, no start)."""
    fleet = common_pb2.FleetInventory()
    pool = fleet.pools.add()
    pool.CopyFrom(_pool([]))
    pool.model = "meta-llama/Meta-Llama-3-8B-Instruct"
    pool.variants.add(name="8b-bf16", model=pool.model, quality_fraction=1.0, simulator_model="llama3-8b")
    pool.engines.add(id="elsewhere", hardware="A100-80GB", model_variant="8b-bf16")
    gpu = fleet.gpus.add(uuid="GPU-0", model=common_pb2.GPU_MODEL_A100_40GB, pool="chat", mig_enabled=True,
                         reported_by="operator")
    for start in (0, 4):
        gpu.instances.add(profile="3g.20gb", placement_start=start, placement_size=4)
    validate_fleet(fleet)
    inputs = _inputs(fleet, load=1.0)
    inputs.declared = fleet
    inputs.capabilities = {"elsewhere": Capability(6.0, 55.0, 70.0, "predicted", "x")}
    plan = mv.MigVariantsSolver().solve(inputs)
    for hour in plan.per_interval:
        (layout,) = hour
        assert [(p.profile, p.start, p.pool, p.model_variant) for p in layout.placements] == [
            ("3g.20gb", 0, "chat", "8b-bf16"), ("3g.20gb", 4, "chat", "8b-bf16")]
    assert "no engine restarted" in " ".join(plan.explanation)


def test_the_state_is_what_runs_on_a_reported_gpu() -> None:
    """A reported GPU's engines (not the layout declared in the fleet) are the state the change cost starts from."""
    fleet = common_pb2.FleetInventory()
    pool = fleet.pools.add()
    pool.CopyFrom(_pool([]))
    pool.model = "meta-llama/Meta-Llama-3-8B-Instruct"
    pool.variants.extend(v.to_proto() for v in mp.family("llama3-8b-instruct")[:2])
    gpu = fleet.gpus.add(uuid="GPU-0", model=common_pb2.GPU_MODEL_A100_80GB, pool="chat", mig_enabled=True,
                         reported_by="gpu-partitioner/n1")
    gpu.instances.add(uuid="MIG-a", profile="7g.80gb", placement_start=0, placement_size=8, engine_id="e7")
    pool.engines.add(id="e7", gpu_uuid="GPU-0", mig_uuid="MIG-a", model_variant=pool.variants[1].name)
    declared = common_pb2.FleetInventory()
    declared.CopyFrom(fleet)
    declared.gpus[0].ClearField("instances")
    declared.gpus[0].instances.add(profile="3g.40gb", placement_start=0, placement_size=4)
    inputs = _inputs(fleet, load=0.0)
    inputs.declared = declared
    from greenserve.optimizer.solvers.keep_current import _mig_layouts
    in_force = {m.gpu_uuid: m for m in _mig_layouts(inputs)[0][0]}
    setup = ms.setup_pool(inputs, pool, 0, 0.9, in_force)
    assert setup.groups[0].states == [((Placement(0, 8, "7g.80gb"), pool.variants[1].name),)]
