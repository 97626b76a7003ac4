"""Solver modules of the planner, one per knob (see ``greenserve.optimizer.planning``).

``default_solvers()`` is the set the optimizer runs: the coupled decision (``coupled.py``: engines loaded, DRAM
sizes, SM clocks and sleeping engines from one MILP), CLOVER's objective solved exactly (variants on MIG slices) and
GreenLLM's mode choice (serving modes). ``planner="per-knob"`` runs one solver per knob instead: the min-carbon
routing weights, the GreenCache ILP (cache sizes), CLOVER and GreenLLM; each knob but routing can be set to
``keep`` (what is in force).
"""

from __future__ import annotations

from typing import Any

from greenserve.optimizer.solvers.cache_greencache import GreenCacheIlp
from greenserve.optimizer.solvers.cache_kareto import KaretoSearch
from greenserve.optimizer.solvers.coupled import CoupledSolver
from greenserve.optimizer.solvers.keep_current import KeepCurrent
from greenserve.optimizer.solvers.mig_variants import MigVariantsSolver
from greenserve.optimizer.solvers.routing_weights import MinCarbonRouting
from greenserve.optimizer.solvers.serving_modes import GreenLlmModes


def cache_solver(name: str, per_hour_slo: bool = False, kareto_ttl_max_s: float = 0.0) -> Any:
    """``greencache`` (the GreenCache ILP), ``kareto`` (Kareto's adaptive Pareto search over DRAM x disk, points
    scored by simulator replays; DRAM x disk TTL when ``kareto_ttl_max_s`` > 0) or ``keep`` (the sizes in force)."""
    if name == "greencache":
        return GreenCacheIlp(per_hour_slo=per_hour_slo)
    if name == "kareto":
        return KaretoSearch(ttl_max_s=kareto_ttl_max_s)
    if name == "keep":
        return KeepCurrent("cache_targets")
    raise ValueError(f"cache solver: must be greencache, kareto or keep, got {name!r}")


def mig_solver(name: str, headroom_fraction: float = 0.9, load_bound: str = "upper", **options: Any) -> Any:
    """``clover-exact`` (variants on MIG slices, CLOVER's objective solved exactly) or ``keep`` (layouts in force).
    ``options``: change_s, max_ged_per_hour, max_accuracy_loss_fraction, gap_rel (``MigVariantsSolver``)."""
    if name == "clover-exact":
        return MigVariantsSolver(headroom_fraction=headroom_fraction, load_bound=load_bound, **options)
    if name == "keep":
        return KeepCurrent("mig_layouts")
    raise ValueError(f"mig solver: must be clover-exact or keep, got {name!r}")


def modes_solver(name: str, load_bound: str = "upper") -> Any:
    """``greenllm`` (GreenLLM's mode choice per pool and hour) or ``keep`` (the modes in force)."""
    if name == "greenllm":
        return GreenLlmModes(load_bound=load_bound)
    if name == "keep":
        return KeepCurrent("serving_modes")
    raise ValueError(f"modes solver: must be greenllm or keep, got {name!r}")


def default_solvers(routing_headroom_fraction: float = 0.9, routing_load: str = "upper",
                    cache: str = "greencache", cache_per_hour_slo: bool = False, mig: str = "clover-exact",
                    mig_options: dict[str, Any] | None = None, modes: str = "greenllm",
                    cache_kareto_ttl_max_s: float = 0.0, planner: str = "coupled",
                    attainment_floor_fraction: float = 0.95) -> list[Any]:
    """``planner``: ``coupled`` (engines, DRAM size, clocks and sleep decided together by ``CoupledSolver``; the
    MIG and serving-mode solvers beside it) or ``per-knob`` (one solver per knob, one after another: ``cache``
    chooses the cache solver). The coupled planner sizes the DRAM tier itself: a cache solver other than the
    default (``kareto``, ``keep``) is an explicit choice, and the knobs are then planned one by one."""
    if planner == "coupled" and cache == "greencache":
        return [
            CoupledSolver(attainment_floor_fraction=attainment_floor_fraction,
                          headroom_fraction=routing_headroom_fraction),
            mig_solver(mig, routing_headroom_fraction, routing_load, **(mig_options or {})),
            modes_solver(modes, routing_load),
        ]
    if planner not in ("coupled", "per-knob"):
        raise ValueError(f"planner: must be coupled or per-knob, got {planner!r}")
    return [
        MinCarbonRouting(headroom_fraction=routing_headroom_fraction, load_bound=routing_load),
        cache_solver(cache, cache_per_hour_slo, cache_kareto_ttl_max_s),
        mig_solver(mig, routing_headroom_fraction, routing_load, **(mig_options or {})),
        modes_solver(modes, routing_load),
    ]
