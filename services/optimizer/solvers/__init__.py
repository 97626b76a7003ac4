"""Solver modules of the planner, one per knob (see ``greenserve.optimizer.planning``).

``default_solvers()`` is the set the optimizer runs: the min-carbon routing weights and, for every other knob,
"keep what is in force" until a solver for it is configured.
"""

from __future__ import annotations

from typing import Any

from greenserve.optimizer.solvers.keep_current import KeepCurrent
from greenserve.optimizer.solvers.routing_weights import MinCarbonRouting


def default_solvers(routing_headroom_fraction: float = 0.9, routing_load: str = "upper") -> list[Any]:
    return [
        MinCarbonRouting(headroom_fraction=routing_headroom_fraction, load_bound=routing_load),
        KeepCurrent("cache_targets"),
        KeepCurrent("mig_layouts"),
        KeepCurrent("serving_modes"),
    ]
