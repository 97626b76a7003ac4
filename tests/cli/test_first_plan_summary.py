"""The line `greenserve up` prints about the first plan counts its settings in words that agree with the count."""

from __future__ import annotations

from greenserve.v1 import common_pb2
from greenserve_client.local_loop import first_plan_summary


def test_the_first_plan_line_counts_in_the_right_number() -> None:
    plan = common_pb2.Plan(version=1)
    hour = plan.intervals.add()
    hour.routing_weights.add()
    hour.routing_weights.add()
    hour.cache_targets.add()
    hour.pools.add(ci_g_per_kwh=129.66)
    plan.expected_carbon.total_g = 390.0
    assert first_plan_summary(plan) == ("plan v1 in force; 2 routing weights, 1 cache target, 0 MIG layouts; "
                                        "CI 130 g/kWh; expected 0.39 kgCO2e over 1 h")
