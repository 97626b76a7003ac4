"""Issue 35: `greenserve up`'s plans said attainment 0.900 in every hour, the pool's target: the routing solver set
the expected attainment to the target whenever the load fit the capacity, which is the constraint, not a forecast.
It is now what the capacity model predicts at each engine's planned rate (the simulator's replays behind the
engine's predicted capability)."""

from __future__ import annotations

from greenserve.common.carbon_params import load_default_params
from greenserve.optimizer import capacity
from greenserve.optimizer.plan_builder import Planner
from greenserve.optimizer.planning import PlanningInputs, SeriesForecast
from greenserve.optimizer.solvers.routing_weights import MinCarbonRouting
from greenserve.v1 import common_pb2

TARGET = 0.9


def _inputs(mean: tuple[float, ...]) -> PlanningInputs:
    fleet = common_pb2.FleetInventory()
    pool = fleet.pools.add(name="default", model="meta-llama/Meta-Llama-3-8B-Instruct", region="ES",
                           slo=common_pb2.Slo(ttft_s=2.0, tpot_s=0.2, attainment_fraction=TARGET),
                           mean_prompt_tokens=1024, mean_output_tokens=128)
    for i in range(2):
        pool.engines.add(id=f"e{i}", hardware="A100-80GB")
    # `greenserve up`'s engines: no stored profile, the simulator's prediction at the pool's SLO and request shape.
    cap = capacity.predict("llama3-8b@A100-80GB", 2.0, 0.2, TARGET, 1024, 128)
    ci = (100.0,) * len(mean)
    return PlanningInputs(start_s=0.0, horizon_hours=len(mean), fleet=fleet, ci={"ES": SeriesForecast(ci, ci, ci)},
                          load={"default": SeriesForecast(mean, mean, mean)}, params=load_default_params(),
                          gpu_platform={}, capabilities={"e0": cap, "e1": cap})


def test_expected_attainment_is_predicted_at_the_planned_rates() -> None:
    mean = (0.71, 7.0, 14.0, 20.0)  # light, one engine near its capacity, both near it, both overloaded
    inputs = _inputs(mean)
    cap = inputs.capabilities["e0"]
    planner = Planner([MinCarbonRouting()])
    try:
        plan = planner.plan(inputs, trigger="manual", created_s=0.0).plan
    finally:
        planner.close()
    got = [iv.pools[0].expected_slo_attainment_fraction for iv in plan.intervals]
    # Light load: the replays meet the SLO for every request, more than the target promised.
    assert got[0] == cap.attainment(0.71, TARGET) > TARGET
    # Each hour is the model at that hour's rates, weighted by requests (min-carbon routing fills e0 first).
    for h, interval in enumerate(plan.intervals):
        weights = {w.engine_id: w.weight for w in interval.routing_weights}
        total = sum(weights.values())
        rates = {eid: mean[h] * w / total for eid, w in weights.items()}
        predicted = sum(r * cap.attainment(r, TARGET) for r in rates.values() if r > 0) / mean[h]
        assert abs(got[h] - predicted) < 1e-9, (h, got[h], predicted)
    assert got[-1] < TARGET  # beyond the capacity the plan says the SLO will be missed
    assert len({round(a, 6) for a in got}) > 1, got
    assert plan.expected_slo_attainment_fraction != TARGET


def test_even_routing_predicts_its_attainment_too() -> None:
    from greenserve.optimizer.solvers.baselines import EvenRouting

    inputs = _inputs((0.71, 20.0))
    cap = inputs.capabilities["e0"]
    figures = EvenRouting().solve(inputs).pool_figures
    assert [f["default"].attainment_fraction for f in figures] == [cap.attainment(0.355, TARGET),
                                                                   cap.attainment(10.0, TARGET)]
    assert figures[0]["default"].attainment_fraction > TARGET > figures[1]["default"].attainment_fraction
