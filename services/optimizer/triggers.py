"""When a moving input asks for a new plan: debounce, hysteresis and a cooldown.

The CI monitor (loop.py) looks, every ``--ci-monitor-interval-s``, at how far the actual CI of each region and a
fresh forecast of it are from what the plan in force assumed. Compared with the threshold alone
(``--ci-change-fraction``, CLOVER's 5 %), an input oscillating around it asked for a new plan at every sample above
it, and an actual CI that stays a few percent off the forecast (a forecaster's bias: each new plan assumes the
forecast again for the hours ahead) asked for one at every sample, for ever. A ``ThresholdTrigger`` keeps, per key
(a region's actual CI, a region's forecast), whether the input is "moved" and fires on the move only:

* **samples**: a look counts only when it reads a new sample (the hour of the actual CI, the history end of the
  forecast); looking at the same sample again adds nothing;
* **debounce**: a deviation beyond the threshold fires once it has been seen in ``confirm_checks`` consecutive
  samples (a sample under the threshold in between starts the count again);
* **hysteresis**: a move that fired stays "moved" (no new fire) until the deviation falls under
  ``(1 - HYSTERESIS_FRACTION)`` x the threshold; a sample inside that band neither ends a move nor starts a count;
* **jumps**: a deviation beyond ``jump_factor`` x the threshold fires at its first sample, moved or not;
* **cooldown**: whatever the rules above say, at most one fire per ``cooldown_s`` of the clock per key.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field

#: Share of the threshold a deviation must fall below to count as back to normal once it was beyond it.
HYSTERESIS_FRACTION = 0.2
#: A deviation beyond this many times the threshold fires at the first look.
JUMP_FACTOR = 2.0


def relative_deviation(assumed: float, actual: float) -> float:
    """``|actual - assumed| / assumed``; inf when the plan assumed nothing (0) and something came, 0 when neither."""
    if not (math.isfinite(assumed) and math.isfinite(actual)):
        return 0.0
    if assumed <= 0:
        return math.inf if actual > 0 else 0.0
    return abs(actual - assumed) / assumed


@dataclass
class ThresholdTrigger:
    """Debounced, hysteretic, rate-limited threshold on a relative deviation, per key (module docstring)."""

    threshold: float
    confirm_checks: int = 2
    cooldown_s: float = 3600.0
    jump_factor: float = JUMP_FACTOR
    hysteresis_fraction: float = HYSTERESIS_FRACTION
    _beyond: dict[Hashable, int] = field(default_factory=dict)  # consecutive samples beyond (or in the band)
    _moved: set[Hashable] = field(default_factory=set)  # fired, not yet back under the band
    _fired_at: dict[Hashable, float] = field(default_factory=dict)
    _sample: dict[Hashable, Hashable] = field(default_factory=dict)

    def look(self, key: Hashable, deviation: float, now_s: float, sample: Hashable | None = None) -> bool:
        """One look at ``key``'s deviation at ``now_s``, read from ``sample`` (None: every look is a new sample);
        True when it asks for a new plan."""
        if sample is not None:
            if key in self._sample and self._sample[key] == sample:
                return False  # the sample already counted
            self._sample[key] = sample
        lower = self.threshold * (1.0 - self.hysteresis_fraction)
        counted = self._beyond.get(key, 0)
        if not deviation > lower:  # back to normal (NaN too)
            self._moved.discard(key)
            self._beyond[key] = 0
            return False
        if not deviation > self.threshold and not counted:  # inside the band: no new count
            return False
        counted += 1
        self._beyond[key] = counted
        jump = deviation > self.jump_factor * self.threshold
        confirmed = counted >= self.confirm_checks and key not in self._moved
        if not (jump or confirmed) or now_s - self._fired_at.get(key, -math.inf) < self.cooldown_s:
            return False
        self._fired_at[key] = now_s
        self._moved.add(key)
        self._beyond[key] = 0
        return True
