"""Baseline solvers: what a fleet runs without greenserve, for evaluations and as explicit operator choices.

* ``EvenRouting``: every engine of a pool gets the same weight (the router's load balancing alone).
* ``FixedCache``: every pool with a declared cache limit gets the largest size ("Full Cache", today's static
  setting) or none ("No Cache"), every hour.
"""

from __future__ import annotations

from greenserve.optimizer.planning import KnobPlan, PlanningInputs, PoolFigures
from greenserve.optimizer.solvers.routing_weights import expected_attainment
from greenserve.v1 import common_pb2


class EvenRouting:
    knob = "routing_weights"
    name = "routing_weights.even"

    def solve(self, inputs: PlanningInputs) -> KnobPlan:
        per_interval, figures = [], []
        for h in range(inputs.horizon_hours):
            weights, figs = [], {}
            for pool in inputs.fleet.pools:
                engines = [e for e in pool.engines if e.id in inputs.capabilities]
                if not engines:
                    continue
                fc = inputs.load.get(pool.name)
                mean = fc.mean[h] if fc else 0.0
                caps = {e.id: inputs.capabilities[e.id].capacity_requests_per_s for e in engines}
                rates = {e.id: mean / len(engines) for e in engines}
                figs[pool.name] = PoolFigures(mean, sum(caps.values()), expected_attainment(
                    rates, inputs.capabilities, caps, pool.slo.attainment_fraction), rates)
                weights += [common_pb2.RoutingWeight(pool=pool.name, engine_id=e.id, weight=1.0) for e in engines]
            per_interval.append(weights)
            figures.append(figs)
        return KnobPlan(per_interval, detail="every engine weighted equally", pool_figures=figures)


class FixedCache:
    knob = "cache_targets"

    def __init__(self, full: bool) -> None:
        self.full = full
        self.name = "cache.full" if full else "cache.none"

    def solve(self, inputs: PlanningInputs) -> KnobPlan:
        targets = []
        for pool in inputs.fleet.pools:
            if pool.max_cache_disk_bytes:
                targets.append(common_pb2.CacheTarget(pool=pool.name, disk_bytes=pool.max_cache_disk_bytes
                                                      if self.full else 0))
            elif pool.max_cache_dram_bytes:
                targets.append(common_pb2.CacheTarget(pool=pool.name, dram_bytes=pool.max_cache_dram_bytes
                                                      if self.full else 0))
        label = "the largest size" if self.full else "no cache"
        return KnobPlan([list(targets) for _ in range(inputs.horizon_hours)], detail=f"every pool: {label}")

