"""Kareto Algorithm 1 (solvers/cache_pareto.py): hypervolume and Pareto filter on hand-checked sets, and the
adaptive search against the full grid on Kareto's grid (synthetic long-tail surface)."""

from __future__ import annotations

import pytest

from greenserve.optimizer.solvers import cache_pareto as cp


def _p(lat: float, thr: float, cost: float, x: float = 0, y: float = 0) -> cp.ScoredPoint:
    return cp.ScoredPoint(x, y, lat, thr, cost)


def test_hypervolume_by_hand() -> None:
    ref = (10.0, 0.0, 10.0)  # latency 10, throughput 0, cost 10
    assert cp.hypervolume([_p(5, 2, 5)], ref) == pytest.approx(5 * 2 * 5)
    # Two boxes 4x1x4 (corner 6,-1,6) and 2x2x2 (8,-2,8): union 16 + 8 - overlap 2x1x2 = 20.
    assert cp.hypervolume([_p(6, 1, 6), _p(8, 2, 8)], ref) == pytest.approx(16 + 8 - 4)
    # A dominated point adds nothing; a point beyond the reference neither.
    assert cp.hypervolume([_p(6, 1, 6), _p(7, 0.5, 7), _p(11, 5, 1)], ref) == pytest.approx(16)


def test_pareto_filter() -> None:
    a, b, c = _p(1, 5, 5), _p(2, 5, 1), _p(2, 4, 5)
    assert cp.pareto_filter([a, b, c]) == [a, b]


def test_adaptive_reaches_the_grid_hypervolume_with_a_quarter_of_the_evaluations() -> None:
    grid = cp.grid_search(cp.long_tail_surface, (0, 4096, 256), (0, 3600, 120))
    assert grid.evaluations == 17 * 31
    adaptive = cp.adaptive_search(cp.long_tail_surface, x_start=(0, 2048, 512), y_start=(0, 2400, 600), x_max=4096,
                                  y_max=3600, x_fine_step=256, y_fine_step=120)
    ref = cp.reference_point(grid.points + adaptive.points)
    ratio = cp.hypervolume(adaptive.pareto, ref) / cp.hypervolume(grid.pareto, ref)
    assert ratio >= 0.99
    assert adaptive.evaluations <= 0.25 * grid.evaluations
    # Every adaptive point lies on the fine grid (comparable with the grid search).
    assert all(p.x % 256 == 0 and p.y % 120 == 0 for p in adaptive.points)
    # The expansion went past the coarse start (2048 GB DRAM) because latency still improved there.
    assert max(p.x for p in adaptive.points) > 2048


def test_evaluation_budget_and_bad_thresholds() -> None:
    res = cp.adaptive_search(cp.long_tail_surface, x_start=(0, 2048, 512), y_start=(0, 2400, 600), x_max=4096,
                             y_max=3600, x_fine_step=256, y_fine_step=120, max_evaluations=10)
    assert res.evaluations == 10 and res.stopped_by_budget
    with pytest.raises(ValueError, match="perf_threshold"):
        cp.adaptive_search(cp.long_tail_surface, x_start=(0, 512, 256), y_start=(0, 120, 120), x_max=512, y_max=120,
                           x_fine_step=256, y_fine_step=120, perf_threshold=-1)
