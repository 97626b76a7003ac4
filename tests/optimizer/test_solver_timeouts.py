"""A solver that runs past its time limit does not leave solves of later computations queued behind it.

Solvers run on the planner's two solver threads. When one ran out of time, the planner answered "keep current" but
left the future as it was: a solve still waiting for a thread (both busy with earlier, timed-out solves) ran later
anyway, on inputs long outdated, and kept the threads from the next computation's solvers; with computations
arriving faster than the stale solves drained, the queue (each entry holding its computation's inputs) grew
without bound. Found by an adversarial audit of the optimizer's solver threads (failed before the fix: every
timed-out solve ran in the end)."""

from __future__ import annotations

import threading
import time

from greenserve.common.carbon_params import load_default_params
from greenserve.optimizer.plan_builder import Planner
from greenserve.optimizer.planning import PlanningInputs
from greenserve.v1 import common_pb2


class StuckSolver:
    knob, name = "cache_targets", "cache_targets.stuck"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0
        self._lock = threading.Lock()

    def solve(self, inputs: PlanningInputs):  # never answers in time
        with self._lock:
            self.started += 1
        self.release.wait(30)
        raise RuntimeError("too late")


def test_a_timed_out_solve_that_never_started_is_dropped() -> None:
    solver = StuckSolver()
    planner = Planner([solver], solver_timeout_s=0.05)
    inputs = PlanningInputs(start_s=0.0, horizon_hours=1, fleet=common_pb2.FleetInventory(), ci={}, load={},
                            capabilities={}, params=load_default_params(), gpu_platform={})
    try:
        for _ in range(6):
            result = planner.plan(inputs, trigger="manual", created_s=0.0)
            assert [o.status for o in result.plan.solver_outcomes] == ["timeout"]
        solver.release.set()
        time.sleep(0.5)
        assert solver.started == 2  # the two that had a thread; the four queued behind them never ran
    finally:
        solver.release.set()
        planner.close()
