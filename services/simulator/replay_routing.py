"""The replay's routing policies: which engine of a simulated fleet takes a request
(``replay_fleet.FleetConfig.policy``).

A policy is any object with ``choose(sim, r, candidates) -> engine index``; ``sim`` is the running replay
(its ``engines``, with ``outstanding`` and ``cached_prefix_blocks``, and ``hashes``), ``r`` the request's index
and ``candidates`` the routable engines' indices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from greenserve.simulator.replay import _Sim

INF = math.inf



class ReplayRouting(Protocol):
    """Chooses an engine index for request ``r`` among ``candidates`` (routable engine indices)."""

    def choose(self, sim: _Sim, r: int, candidates: list[int]) -> int: ...


class RoundRobin:
    """Cycle through the routable engines."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    def choose(self, sim: _Sim, r: int, candidates: list[int]) -> int:
        e = candidates[self._next % len(candidates)]
        self._next += 1
        return e


class LeastLoaded:
    """Fewest outstanding requests (queued + running); ties to the lowest index."""

    __slots__ = ()

    def choose(self, sim: _Sim, r: int, candidates: list[int]) -> int:
        engines = sim.engines
        best, best_load = candidates[0], INF
        for e in candidates:
            load = engines[e].outstanding
            if load < best_load:
                best, best_load = e, load
        return best


class PrefixAffinity:
    """Longest cached prefix (HBM + DRAM tiers) wins unless that engine has more than ``load_slack``
    outstanding requests above the least-loaded one; otherwise least loaded."""

    __slots__ = ("load_slack",)

    def __init__(self, load_slack: int = 8) -> None:
        if load_slack < 0:
            raise ValueError("load_slack: must be >= 0")
        self.load_slack = load_slack

    def choose(self, sim: _Sim, r: int, candidates: list[int]) -> int:
        engines = sim.engines
        min_load = min(engines[e].outstanding for e in candidates)
        hashes = sim.hashes[r] if sim.hashes else ()
        best, best_key = candidates[0], None
        for e in candidates:
            eng = engines[e]
            if eng.outstanding > min_load + self.load_slack:
                continue
            matched = eng.cached_prefix_blocks(hashes) if hashes else 0
            key = (-matched, eng.outstanding, e)
            if best_key is None or key < best_key:
                best, best_key = e, key
        return best


class WeightedRandom:
    """Random engine with fixed weights (e.g. a plan's routing weights); deterministic for the seed."""

    __slots__ = ("_rng", "weights")

    def __init__(self, weights: Sequence[float], seed: int = 0) -> None:
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1 or len(w) == 0 or np.any(w < 0) or not np.isfinite(w).all() or w.sum() <= 0:
            raise ValueError("weights: must be non-negative, finite and not all zero")
        self.weights = w
        self._rng = np.random.default_rng(seed)

    def choose(self, sim: _Sim, r: int, candidates: list[int]) -> int:
        w = self.weights[candidates] if len(self.weights) > max(candidates) else np.ones(len(candidates))
        total = w.sum()
        if total <= 0:
            return candidates[0]
        x = self._rng.random() * total
        acc = 0.0
        for e, wi in zip(candidates, w):
            acc += wi
            if x < acc:
                return e
        return candidates[-1]


def make_policy(policy: Any, seed: int = 0) -> ReplayRouting:
    """A policy object from a name (``round_robin``, ``least_loaded``, ``prefix_affinity``) or an object."""
    if isinstance(policy, str):
        if policy == "round_robin":
            return RoundRobin()
        if policy == "least_loaded":
            return LeastLoaded()
        if policy == "prefix_affinity":
            return PrefixAffinity()
        raise ValueError(f"policy: must be round_robin, least_loaded or prefix_affinity, got {policy!r}")
    if not hasattr(policy, "choose"):
        raise ValueError("policy: must be a name or have a choose(sim, r, candidates) method")
    return policy
