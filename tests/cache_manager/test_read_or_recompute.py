"""Read-or-recompute (StoreLLM Algorithm 1): the DP against brute force, fast paths, the queue credit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from greenserve.cache_manager.read_or_recompute import READ, RECOMPUTE, decide, decision_time_s


def brute(read_s, read_e, rec_s, rec_e, budget, q):
    t_max = float(np.minimum(read_s, rec_s).sum()) + budget
    best = None
    for combo in itertools.product((READ, RECOMPUTE), repeat=len(read_s)):
        a = np.array(combo)
        if decision_time_s(a, read_s, rec_s, q) <= t_max + 1e-12:
            e = float(np.where(a == READ, read_e, rec_e).sum())
            best = e if best is None else min(best, e)
    return best


@pytest.mark.parametrize("seed", range(25))
def test_dp_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 8
    read_s, rec_s = rng.uniform(0.1, 2.0, n), rng.uniform(0.1, 2.0, n)
    read_e, rec_e = rng.uniform(0.1, 3.0, n), rng.uniform(0.1, 3.0, n)
    budget = float(rng.uniform(0, 3))
    q = float(rng.choice([0.0, 1.0]))
    d = decide(read_s, read_e, rec_s, rec_e, delay_budget_s=budget, queue_wait_s=q)
    t_max = float(np.minimum(read_s, rec_s).sum()) + budget
    assert d.time_s <= t_max + 1e-9
    # Rounding times up to 1/2048 of the capacity can lose a little; never more than a few percent here.
    assert d.energy_j <= brute(read_s, read_e, rec_s, rec_e, budget, q) * 1.05 + 1e-9


def test_fast_path_min_energy_when_budget_is_loose() -> None:
    d = decide(np.array([5.0, 0.1]), np.array([0.1, 0.1]), np.array([1.0, 1.0]), np.array([9.0, 9.0]),
               delay_budget_s=100.0)
    assert d.path == "fast-min-energy" and list(d.actions) == [READ, READ]


def test_tight_budget_recomputes_the_slow_read() -> None:
    d = decide(np.array([5.0, 0.1]), np.array([0.1, 0.1]), np.array([1.0, 1.0]), np.array([9.0, 9.0]),
               delay_budget_s=0.5)
    assert list(d.actions) == [RECOMPUTE, READ]


def test_queue_wait_hides_slow_reads() -> None:
    args = (np.array([5.0, 0.1]), np.array([0.1, 0.1]), np.array([1.0, 1.0]), np.array([9.0, 9.0]))
    d = decide(*args, delay_budget_s=0.5, queue_wait_s=5.0)
    assert list(d.actions) == [READ, READ] and d.time_s == pytest.approx(0.1)


def test_empty_prompt() -> None:
    d = decide(np.empty(0), np.empty(0), np.empty(0), np.empty(0), delay_budget_s=0.0)
    assert len(d.actions) == 0 and d.energy_j == 0.0
