"""The coupled decision (``solvers/coupled.py``): each pool-hour's engines, DRAM size, SM clock and sleeping engines
come from one model, so no hour pairs too few engines with a cache (or a clock) too small for its load; the plan
carries the load forecast's upper bound and the learned margin; DRAM restarts stay within the day's budget; idle
engines sleep only when that saves more than waking them costs. The capacities are the simulator's real
predictions for the default scenario's engine (Llama-3 8B on A100-80GB), so the coupling is checked against the
same model the evaluation replays."""

from __future__ import annotations

import pytest
from greenserve.common.carbon_params import load_default_params
from greenserve.evaluation.scenario import Scenario
from greenserve.optimizer import capacity
from greenserve.optimizer.plan_builder import Planner
from greenserve.optimizer.planning import PlanningInputs, SeriesForecast
from greenserve.optimizer.solvers.coupled import CoupledSolver, affinity_imbalance
from greenserve.optimizer.solvers.keep_current import KeepCurrent
from greenserve.simulator.clocks import clocked_profile
from greenserve.simulator.engine_profile import load_profile
from greenserve.v1 import common_pb2

GIB = 1 << 30
HITS = 0.55
CLOCKS = (1.0, 0.7)  # two clocks keep the predictions few (each ~2 s, cached for the module)


def _inputs(mean: list[float], upper: list[float], ci: list[float], *, margin: float | None = None,
            current: common_pb2.Plan | None = None, restarts: int = 0,
            cache_dram: int | None = None) -> PlanningInputs:
    fleet = Scenario().fleet("ES")
    pool = fleet.pools[0]
    cap = capacity.predict("llama3-8b@A100-80GB", pool.slo.ttft_s, pool.slo.tpot_s, pool.slo.attainment_fraction,
                           pool.mean_prompt_tokens, pool.mean_output_tokens, HITS, 0)
    hours = len(mean)
    return PlanningInputs(
        start_s=1_656_460_800.0, horizon_hours=hours, fleet=fleet,
        ci={"ES": SeriesForecast(tuple(ci), tuple(ci), tuple(ci))},
        load={pool.name: SeriesForecast(tuple(mean), tuple(mean), tuple(upper))},
        capabilities={e.id: cap for e in pool.engines}, params=load_default_params(), gpu_platform={},
        current=current, prefix_hit_fraction={pool.name: HITS},
        load_margin={} if margin is None else {pool.name: margin},
        dram_restarts_last_day={pool.name: restarts},
        cache_sizes={} if cache_dram is None else {pool.name: (cache_dram, 0)})


def _solver(**kw) -> CoupledSolver:
    return CoupledSolver(clocks=CLOCKS, **kw)


def _chosen(answers, hour: int) -> tuple[int, int, float]:
    """(engines weighted, DRAM bytes, SM clock fraction) of hour ``hour``."""
    weights = answers["routing_weights"].per_interval[hour]
    (cache,) = answers["cache_targets"].per_interval[hour]
    (power,) = answers["gpu_power"].per_interval[hour]
    return sum(1 for w in weights if w.weight > 0), cache.dram_bytes, power.sm_clock_fraction


def _capacity(dram: int, clock: float) -> float:
    """One engine's capacity at the floor, predicted independently of the solver."""
    pool = Scenario().fleet("ES").pools[0]
    profile = clocked_profile(load_profile("llama3-8b@A100-80GB"), clock)
    return capacity.predict(profile, pool.slo.ttft_s, pool.slo.tpot_s, 0.95, pool.mean_prompt_tokens,
                            pool.mean_output_tokens, HITS, dram).capacity_requests_per_s


def test_every_hour_carries_its_planning_load_with_its_own_cache_and_clock() -> None:
    """The failure the coupling removes: one engine paired with a cache too small for its load. Whatever the
    solver picks, the engines it loads, at the capacity of the DRAM size and clock it picks for the same hour,
    carry the hour's upper load (no margin learned) with the headroom, the busiest one included."""
    mean = [2.0, 6.0, 9.0, 12.0, 4.0, 1.0]
    upper = [m * 1.2 for m in mean]
    answers = _solver().solve_knobs(_inputs(mean, upper, [300.0] * 6))
    for h in range(6):
        engines, dram, clock = _chosen(answers, h)
        busiest = upper[h] / engines * affinity_imbalance(engines, upper[h])
        assert busiest <= 0.9 * _capacity(dram, clock) + 1e-9, (h, engines, dram, clock)
    # a heavier hour never runs on fewer engines x capacity than a lighter one needs
    assert _chosen(answers, 3)[0] >= _chosen(answers, 5)[0]


def test_the_busiest_engine_carries_more_than_its_share_under_affinity() -> None:
    assert affinity_imbalance(1, 10.0) == 1.0
    assert affinity_imbalance(4, 0.0) == 1.0
    assert 1.0 < affinity_imbalance(2, 10.0) < affinity_imbalance(4, 10.0)  # more engines, a larger spread
    assert affinity_imbalance(4, 20.0) < affinity_imbalance(4, 5.0)  # more conversations, a smaller spread


def test_the_learned_margin_is_a_chance_constraint_on_the_mean() -> None:
    """With a margin learned from backtests the plan carries mean x margin (the quantile of actual / forecast),
    not the interval's upper bound: a wide interval no longer buys capacity a calibrated margin says is idle."""
    mean = [6.0] * 3
    plain = _solver().solve_knobs(_inputs(mean, [9.0] * 3, [300.0] * 3, margin=1.0))
    robust = _solver().solve_knobs(_inputs(mean, [9.0] * 3, [300.0] * 3, margin=1.5))
    for h in range(3):
        engines, dram, clock = _chosen(robust, h)
        busiest = 1.5 * mean[h] / engines * affinity_imbalance(engines, 1.5 * mean[h])
        assert busiest <= 0.9 * _capacity(dram, clock) + 1e-9
    cap_plain = sum(f.capacity_requests_per_s for f in (plain["routing_weights"].pool_figures[0].values()))
    cap_robust = sum(f.capacity_requests_per_s for f in (robust["routing_weights"].pool_figures[0].values()))
    assert cap_robust > cap_plain
    upper = _solver().solve_knobs(_inputs(mean, [9.0] * 3, [300.0] * 3))  # no margin: the upper bound
    for h in range(3):
        engines, dram, clock = _chosen(upper, h)
        assert 9.0 / engines * affinity_imbalance(engines, 9.0) <= 0.9 * _capacity(dram, clock) + 1e-9


def test_an_hour_no_option_carries_takes_the_most_capacity_and_says_so() -> None:
    answers = _solver().solve_knobs(_inputs([200.0], [200.0], [300.0]))
    assert len(answers["routing_weights"].per_interval) == 1
    engines, dram, clock = _chosen(answers, 0)
    assert engines == 4 and clock == 1.0 and dram == 64 * GIB
    assert any("SLO is at risk" in line for line in answers["routing_weights"].explanation)


def test_dram_restarts_stay_within_the_day_budget_when_ci_swings() -> None:
    """CI swinging every hour would make a per-hour optimum resize the DRAM tier back and forth; the day's budget
    (4, minus those already made) bounds the restarts, and none when the budget is spent."""
    hours = 24
    ci = [50.0 if h % 2 else 900.0 for h in range(hours)]
    mean = [3.0 if h % 2 else 9.0 for h in range(hours)]

    def restarts(answers) -> int:
        sizes = [_chosen(answers, h)[1] for h in range(hours)]
        return sum(1 for a, b in zip(sizes, sizes[1:]) if a != b)

    assert restarts(_solver().solve_knobs(_inputs(mean, mean, ci))) <= 4
    assert restarts(_solver().solve_knobs(_inputs(mean, mean, ci, restarts=4, cache_dram=64 * GIB))) == 0


def test_engines_sleep_only_when_it_saves_more_than_waking_costs() -> None:
    mean = [1.0, 1.0]
    awake = _solver().solve_knobs(_inputs(mean, mean, [300.0, 300.0]))
    assert awake["engine_runs"].per_interval == [[], []]  # the profile's idle is the GPU's bare idle: no saving
    asleep = _solver(asleep_power_w=5.0).solve_knobs(_inputs(mean, mean, [300.0, 300.0]))
    for h in range(2):
        runs = asleep["engine_runs"].per_interval[h]
        weights = {w.engine_id: w.weight for w in asleep["routing_weights"].per_interval[h]}
        assert {r.engine_id for r in runs} == set(weights)
        for r in runs:  # an engine sleeps exactly when it carries no traffic
            assert (r.state == common_pb2.ENGINE_RUN_STATE_SLEEPING) == (weights[r.engine_id] == 0)
        assert any(r.state == common_pb2.ENGINE_RUN_STATE_SLEEPING for r in runs)


def test_a_locked_clock_names_its_mhz_and_the_plan_carries_every_knob() -> None:
    planner = Planner([CoupledSolver(clocks=CLOCKS), KeepCurrent("mig_layouts"), KeepCurrent("serving_modes")])
    try:
        plan = planner.plan(_inputs([3.0] * 4, [3.6] * 4, [400.0] * 4), trigger="test", created_s=0.0).plan
    finally:
        planner.close()
    assert {o.knob for o in plan.solver_outcomes} >= {"routing_weights", "cache_targets", "engine_runs",
                                                      "gpu_power"}
    assert all(o.status == "ok" for o in plan.solver_outcomes if o.solver == "coupled.milp")
    for interval in plan.intervals:
        (power,) = interval.gpu_power
        assert power.max_sm_clock_mhz == (0 if power.sm_clock_fraction == 1.0 else
                                          round(1410 * power.sm_clock_fraction))
        (pool,) = interval.pools
        assert pool.HasField("expected_slo_attainment_at_upper_fraction")
        assert pool.expected_slo_attainment_at_upper_fraction >= 0.95  # the upper load is within the floor


class _Broken:
    knob = "routing_weights"
    knobs = ("routing_weights", "cache_targets", "engine_runs", "gpu_power")
    name = "broken.joint"

    def solve_knobs(self, inputs):
        raise RuntimeError("no solver today")


def test_a_failing_joint_solver_keeps_every_knob_it_owns() -> None:
    current = common_pb2.Plan(version=3)
    iv = current.intervals.add()
    iv.start.FromSeconds(1_656_460_800)
    iv.end.FromSeconds(1_656_460_800 + 3600)
    iv.cache_targets.add(pool="chat", dram_bytes=32 * GIB)
    iv.gpu_power.add(pool="chat", sm_clock_fraction=0.85, max_sm_clock_mhz=1198)
    planner = Planner([_Broken(), KeepCurrent("mig_layouts"), KeepCurrent("serving_modes")])
    try:
        plan = planner.plan(_inputs([3.0], [3.0], [300.0], current=current), trigger="test", created_s=0.0).plan
    finally:
        planner.close()
    failed = {o.knob: o for o in plan.solver_outcomes if o.solver == "broken.joint"}
    assert set(failed) == set(_Broken.knobs)
    assert all(o.status == "failed" and "no solver today" in o.detail for o in failed.values())
    assert plan.intervals[0].cache_targets[0].dram_bytes == 32 * GIB
    assert plan.intervals[0].gpu_power[0].max_sm_clock_mhz == 1198


def test_bad_parameters_are_refused_naming_them() -> None:
    for kw, name in (({"attainment_floor_fraction": 1.0}, "attainment_floor_fraction"),
                     ({"headroom_fraction": 0.0}, "headroom_fraction"), ({"clocks": ()}, "clocks"),
                     ({"max_restarts_per_day": -1}, "max_restarts_per_day"),
                     ({"asleep_power_w": float("nan")}, "asleep_power_w")):
        with pytest.raises(ValueError, match=name):
            CoupledSolver(**kw)
