"""Kareto Algorithm 2: group statistics, ROI-optimal TTLs, the budgeted SLSQP multi-start."""

from __future__ import annotations

import numpy as np
import pytest

from greenserve.cache_manager import group_ttl


def _accesses():
    out = []
    rng = np.random.default_rng(0)
    t = 0.0
    for _ in range(3000):
        t += rng.exponential(1.0)
        sub = rng.choice(["hot", "warm", "cold"], p=[0.5, 0.3, 0.2])
        span = {"hot": 20, "warm": 200, "cold": 5000}[sub]
        out.append((t, int(rng.integers(0, span)) + {"hot": 0, "warm": 10_000, "cold": 20_000}[sub], sub))
    return out


def test_group_stats_top_k_and_residual() -> None:
    stats = group_ttl.group_stats(_accesses(), top_k=1)
    assert [g.group_id for g in stats] == ["hot", group_ttl.RESIDUAL]
    assert all(np.all(np.diff(g.inter_arrivals_s) >= 0) for g in stats)


def test_cost_and_hits_definitions() -> None:
    g = group_ttl.GroupStats("g", np.array([1.0, 3.0]), unique_blocks=2, accesses=4)
    assert g.cost(2.0) == pytest.approx(2 * 2 + 1 + 2)
    assert g.hits(3.0) == pytest.approx(2.0)
    assert g.hits(1.0) == pytest.approx(1.0)


def test_solution_respects_budget_and_beats_uniform_scaling() -> None:
    stats = group_ttl.group_stats(_accesses(), top_k=2)
    budget = 0.3 * sum(g.cost(float(g.inter_arrivals_s[-1])) for g in stats if len(g.inter_arrivals_s))
    sol = group_ttl.solve(stats, budget)
    assert sol.cost <= budget * (1 + 1e-6)
    assert np.all(sol.ttl_s >= 0)
    # A single TTL for every group, scaled to the same budget, keeps no more hits.
    lo, hi = 0.0, 1e6
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(g.cost(mid) for g in stats) <= budget else (lo, mid)
    uniform_hits = sum(g.hits(lo) for g in stats)
    assert sol.hits >= uniform_hits - 1e-6
    assert sol.by_id()["hot"] > 0


def test_zero_budget_gives_zero_ttls() -> None:
    stats = group_ttl.group_stats(_accesses(), top_k=2)
    assert np.all(group_ttl.solve(stats, 0.0).ttl_s == 0)
