"""The GreenCache ILP's HiGHS path solves the LP relaxation first (cache_ilp.solve_highs): an integral relaxation
is returned as the proven optimum, a fractional one goes on to the MIP. Both paths give PuLP's optimum."""

from __future__ import annotations

import pytest
from greenserve.bench.optimizer_cache import synthetic_models
from greenserve.optimizer.solvers.cache_greencache import PoolCacheModel, solve_ilp


def test_a_fractional_relaxation_goes_on_to_the_mip() -> None:
    # One hour, two sizes: the SLO (0.9) is met by half of each size in the relaxation (carbon 15), only by the
    # larger size in integers (carbon 20).
    m = PoolCacheModel("a", "disk", [0, 10], [1.0], [[10.0, 20.0]], [[0.8, 1.0]], [[1.0, 1.0]], 0.9, "test", [100.0])
    picks, status, objective, gap = solve_ilp([m])
    assert (picks, status, gap) == ({"a": [1]}, "Optimal", 0.0)
    assert objective == pytest.approx(20.0)


@pytest.mark.parametrize("restart_g", [0.0, 0.5])
def test_highs_matches_pulp_with_and_without_restart_charges(restart_g: float) -> None:
    models = synthetic_models(3, 24, 9, seed=5, restart_g=restart_g)
    fast = solve_ilp(models, backend="highs")
    ref = solve_ilp(models, backend="pulp-highs")
    assert fast[1] == ref[1] == "Optimal" and fast[3] == 0.0
    assert fast[2] == pytest.approx(ref[2], rel=1e-9)
