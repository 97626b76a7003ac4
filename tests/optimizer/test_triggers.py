"""ThresholdTrigger (issue 36, fault 7): debounce over samples, hysteresis, jumps and the cooldown."""

from __future__ import annotations

import math

from greenserve.optimizer.triggers import ThresholdTrigger, relative_deviation


def fires(deviations: list[float], step_s: float = 3600.0, **kw) -> list[bool]:
    trigger = ThresholdTrigger(0.05, **kw)
    return [trigger.look("k", d, i * step_s, sample=i) for i, d in enumerate(deviations)]


def test_across_the_band_edge_never_fires_and_hovering_fires_once() -> None:
    assert not any(fires([0.065, 0.035] * 5))
    assert fires([0.054, 0.046] * 5) == [False, True] + [False] * 8
    assert fires([0.065] * 6) == [False, True, False, False, False, False]  # a persistent move: once
    # back under the band re-arms it
    assert fires([0.065, 0.065, 0.0, 0.065, 0.065]) == [False, True, False, False, True]


def test_a_jump_fires_at_once_within_the_cooldown_only_once() -> None:
    assert fires([0.0, 0.3]) == [False, True]
    assert fires([0.3, 0.3, 0.3], step_s=600.0, cooldown_s=1800.0) == [True, False, False]
    assert fires([0.3, 0.3, 0.3, 0.3], step_s=600.0, cooldown_s=1200.0) == [True, False, True, False]


def test_the_same_sample_looked_at_again_counts_once() -> None:
    trigger = ThresholdTrigger(0.05)
    assert [trigger.look("k", 0.07, t, sample="10:00") for t in (0, 900, 1800, 2700)] == [False] * 4
    assert trigger.look("k", 0.07, 3600, sample="11:00")
    assert not trigger.look("other", 0.07, 3600, sample="11:00")  # per key


def test_deviation_edges() -> None:
    assert relative_deviation(100.0, 105.0) == 0.05
    assert relative_deviation(0.0, 1.0) == math.inf and relative_deviation(0.0, 0.0) == 0.0
    assert relative_deviation(math.nan, 1.0) == 0.0
    assert not any(fires([math.nan, math.nan, math.nan]))
