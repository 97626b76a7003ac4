"""The router's ActivePlan selects the interval covering its clock, whichever way the clock moves (fault 5 of
issue 36: a virtual clock jumping forward by hours or back before the interval in force)."""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.router.routing.enforcer import ActivePlan
from greenserve.v1 import common_pb2

T0 = 1_704_067_200
HOUR_S = 3600


def _plan() -> common_pb2.Plan:
    """Three hourly intervals from T0, each weighting a different engine of pool p."""
    plan = common_pb2.Plan(version=1)
    for i in range(3):
        interval = plan.intervals.add(start=Timestamp(seconds=T0 + i * HOUR_S),
                                      end=Timestamp(seconds=T0 + (i + 1) * HOUR_S))
        interval.routing_weights.add(pool="p", engine_id=f"e{i}", weight=1.0)
    return plan


def test_weights_follow_a_clock_jumping_forward_back_and_outside_the_plan() -> None:
    now = [T0 + 1800.0]
    store = ActivePlan(clock=lambda: now[0])
    assert store.apply(_plan())

    def engine_in_force() -> str:
        weights, version = store.weights_for("p")
        assert version == 1 and weights is not None
        return next(iter(weights))

    assert engine_in_force() == "e0"
    for instant_s, engine in [(T0 + 2 * HOUR_S + 5, "e2"),   # forward two hours
                              (T0 + 10, "e0"),               # back into the first interval
                              (T0 + HOUR_S, "e1"),           # exactly at a boundary
                              (T0 + HOUR_S - 0.001, "e0"),   # just before it
                              (T0 + 30 * HOUR_S, "e2"),      # past the end: the last interval
                              (T0 - 5 * HOUR_S, "e0"),       # before the start: the first
                              (T0 + HOUR_S + 1, "e1")]:
        now[0] = instant_s
        assert engine_in_force() == engine, instant_s
        assert store.interval_in_force().routing_weights[0].engine_id == engine
