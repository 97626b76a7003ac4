"""The safe plan: what the optimizer plans when its forecasts are too old to plan on.

While the forecaster is down or late, a computation plans on the last forecast of each series it fetched, with the
forecast's age stated (``inputs.ForecastSource``: ``source`` "cache", ``stale_s``). Past ``--forecast-max-age-s``
that forecast says too little about the hours ahead to bet capacity on it, so the computation degrades to a plan
that needs no forecast to be safe, BASE-like capacity:

* routing: every engine of every pool weighted equally (``EvenRouting``: the router's load balancing over the whole
  fleet, every engine carrying load, none left unloaded on a low forecast);
* sleeping engines and GPU clocks: none asleep, default clocks (nothing is planned for those knobs, which the
  enforcers read as "all awake, full speed");
* cache sizes, MIG layouts and serving modes: kept as in force (``KeepCurrent``): no LMCache restart, no MIG
  repartitioning and no mode switch is started on a forecast that old.

The plan carries the forecasts it was made on (``Plan.forecasts``: source "expired", their age in ``stale_s``) and
its explanation opens with "SAFE PLAN:" (explain.py). Once the forecaster answers again, the CI monitor
sees that the plan in force was made on degraded forecasts and asks for a new plan (loop.py): the loop converges
without an operator.
"""

from __future__ import annotations

from typing import Any

from greenserve.optimizer.inputs import DEGRADED_SOURCES, EXPIRED
from greenserve.optimizer.plan_builder import Planner
from greenserve.optimizer.planning import KnobPlan, PlanningInputs, solver_knobs
from greenserve.optimizer.solvers.baselines import EvenRouting
from greenserve.optimizer.solvers.keep_current import KeepCurrent

__all__ = ["DEGRADED_SOURCES", "EXPIRED", "expired_series", "safe_planner", "safe_solvers"]


class NothingPlanned:
    """A knob left at its default in every hour (no engine asleep, default GPU clocks)."""

    def __init__(self, knob: str) -> None:
        self.knob = knob
        self.name = f"{knob}.safe_default"

    def solve(self, inputs: PlanningInputs) -> KnobPlan:
        return KnobPlan([[] for _ in range(inputs.horizon_hours)], status="kept",
                        detail="nothing planned (safe plan: every engine awake, default clocks)")


def safe_solvers(knobs: list[str]) -> list[Any]:
    """One safe solver per knob of ``knobs`` (the knobs the configured planner fills)."""
    out: list[Any] = []
    for knob in knobs:
        if knob == "routing_weights":
            out.append(EvenRouting())
        elif knob in ("engine_runs", "gpu_power"):
            out.append(NothingPlanned(knob))
        else:
            out.append(KeepCurrent(knob))
    return out


def safe_planner(planner: Planner) -> Planner:
    """A planner with the safe solvers of ``planner``'s knobs (and its solver time limit)."""
    knobs = [k for s in planner.solvers for k in solver_knobs(s)]
    return Planner(safe_solvers(knobs), solver_timeout_s=planner.solver_timeout_s)


def expired_series(inputs: PlanningInputs) -> list[str]:
    """``ci:<region>`` / ``load:<pool>`` of the forecasts too old to plan on."""
    return ([f"ci:{region}" for region, fc in sorted(inputs.ci.items()) if fc.source == EXPIRED]
            + [f"load:{pool}" for pool, fc in sorted(inputs.load.items()) if fc.source == EXPIRED])
