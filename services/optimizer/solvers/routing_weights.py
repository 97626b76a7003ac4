"""Routing weights: send each pool's load where the carbon per request is lowest, every engine within its SLO
capacity.

Per pool and hour this is the linear program

    minimise   sum_e c_e x_e      subject to   sum_e x_e = L,   0 <= x_e <= h x cap_e

with ``x_e`` the requests per second sent to engine ``e``, ``c_e`` its marginal carbon per request (dynamic energy
per request x PUE x CI of the pool's region: the idle power and the embodied carbon are paid whichever engine
serves), ``cap_e`` its SLO capacity from the profiles (``capacity.py``), ``h`` a headroom fraction and ``L`` the
forecast load (the upper bound of the prediction interval by default, so that a load within the interval still
meets the SLO). One equality and box constraints: filling the engines in increasing ``c_e`` is the exact optimum
(the LP's dual is one price; this is the fractional-knapsack argument), so no LP solver is needed here.

When ``L`` exceeds the pool's headroom capacity, the engines are filled to full capacity; beyond that the load is
spread in proportion to capacity and the expected attainment falls as capacity / load (the plan says so).
Weights are the shares ``x_e / L``; an engine with weight 0 gets no requests while the plan is in force.
"""

from __future__ import annotations

from greenserve.optimizer.planning import KnobPlan, PlanningInputs, PoolFigures
from greenserve.v1 import common_pb2


def fill(load: float, engines: list[tuple[str, float, float]], headroom: float) -> dict[str, float]:
    """Rates per engine for ``load`` over ``(id, cost, capacity)``: cheapest first up to headroom, then to
    capacity, then in proportion to capacity."""
    order = sorted(engines, key=lambda e: (e[1], e[0]))
    rates = {e[0]: 0.0 for e in order}
    left = load
    for fraction in (headroom, 1.0):
        for engine_id, _, cap in order:
            room = fraction * cap - rates[engine_id]
            take = min(max(room, 0.0), left)
            rates[engine_id] += take
            left -= take
            if left <= 1e-12:
                return rates
    total_cap = sum(cap for _, _, cap in order)
    if total_cap > 0:
        for engine_id, _, cap in order:
            rates[engine_id] += left * cap / total_cap
    elif order:
        for engine_id, _, _ in order:
            rates[engine_id] += left / len(order)
    return rates


class MinCarbonRouting:
    knob = "routing_weights"
    name = "routing_weights.min_carbon"

    def __init__(self, headroom_fraction: float = 0.9, load_bound: str = "upper") -> None:
        if not 0 < headroom_fraction <= 1:
            raise ValueError("headroom_fraction: must be in (0, 1]")
        if load_bound not in ("upper", "mean"):
            raise ValueError("load_bound: must be 'upper' or 'mean'")
        self.headroom = headroom_fraction
        self.load_bound = load_bound

    def solve(self, inputs: PlanningInputs) -> KnobPlan:
        per_interval: list[list[common_pb2.RoutingWeight]] = []
        figures: list[dict[str, PoolFigures]] = []
        pue = inputs.params.pue
        short: dict[str, int] = {}
        for h in range(inputs.horizon_hours):
            weights: list[common_pb2.RoutingWeight] = []
            pool_figs: dict[str, PoolFigures] = {}
            for pool in inputs.fleet.pools:
                fc = inputs.load.get(pool.name)
                mean = fc.mean[h] if fc else 0.0
                load = (fc.upper[h] if self.load_bound == "upper" else mean) if fc else 0.0
                ci = inputs.ci[pool.region].mean[h] if pool.region in inputs.ci else 0.0
                engines = []
                for engine in pool.engines:
                    cap = inputs.capabilities.get(engine.id)
                    if cap is None:
                        continue
                    cost_g = cap.energy_per_request_j / 3.6e6 * pue * ci
                    engines.append((engine.id, cost_g, cap.capacity_requests_per_s))
                if not engines:
                    continue
                plan_rates = fill(load, engines, self.headroom)
                total = sum(plan_rates.values())
                capacity = sum(e[2] for e in engines)
                # The mean load is served in the same shares as the planned (upper-bound) load.
                share = {eid: (r / total if total > 0 else 1.0 / len(engines)) for eid, r in plan_rates.items()}
                mean_rates = {eid: mean * s for eid, s in share.items()}
                served = 0.0
                for engine_id, _, cap in engines:
                    rate = mean_rates[engine_id]
                    served += min(rate, cap)
                target = pool.slo.attainment_fraction
                attainment = target if mean <= 0 else target * min(1.0, served / mean)
                if load > capacity:
                    short[pool.name] = short.get(pool.name, 0) + 1
                if total <= 0:  # no load: keep every engine eligible, equally
                    share = {eid: 1.0 for eid in share}
                for engine_id, _, _ in sorted(engines):
                    weights.append(common_pb2.RoutingWeight(pool=pool.name, engine_id=engine_id,
                                                            weight=round(share[engine_id], 6)))
                pool_figs[pool.name] = PoolFigures(mean, capacity, attainment, mean_rates)
            per_interval.append(weights)
            figures.append(pool_figs)
        lines = [f"pool {name}: forecast load above the pool's SLO capacity in {n} of {inputs.horizon_hours} hours; "
                 f"attainment below target there" for name, n in sorted(short.items())]
        detail = (f"weights for {len(inputs.fleet.pools)} pools over {inputs.horizon_hours} h, engines filled by "
                  f"carbon per request up to {self.headroom:.0%} of SLO capacity ({self.load_bound} load)")
        return KnobPlan(per_interval, explanation=lines, detail=detail, pool_figures=figures)
