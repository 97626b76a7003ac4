"""When a moving input asks for a new plan: debounce, hysteresis and a cooldown (issue 36, fault 7).

The CI monitor (loop.py) looks, every ``--ci-monitor-interval-s``, at how far the actual CI of each region and a
fresh forecast of it are from what the plan in force assumed. Compared with the threshold alone
(``--ci-change-fraction``, CLOVER's 5 %), an input oscillating around it asked for a new plan at every look above
it, and an actual CI that stays a few percent off the forecast (a forecaster's bias: the new plan assumes the
forecast again) asked for one at every look, for ever. A ``ThresholdTrigger`` fires for a key (a region's actual
CI, a region's forecast) only when:

* **debounce**: the deviation has been beyond the threshold at ``confirm_checks`` consecutive looks, unless it is
  beyond ``jump_factor`` x the threshold (a clear jump is acted on at once);
* **hysteresis**: once beyond, a look counts as beyond until the deviation falls under
  ``(1 - HYSTERESIS_FRACTION)`` x the threshold, so a deviation hovering at the threshold is one move, not a
  series of moves each starting the count again; under that it is back to normal;
* **cooldown**: at most once per ``cooldown_s`` of the clock per key; a deviation that persists through the
  cooldown fires again when it ends.
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
    _beyond: dict[Hashable, int] = field(default_factory=dict)
    _fired_at: dict[Hashable, float] = field(default_factory=dict)

    def look(self, key: Hashable, deviation: float, now_s: float) -> bool:
        """One look at ``key``'s deviation at ``now_s``; True when it asks for a new plan."""
        beyond = self._beyond.get(key, 0)
        limit = self.threshold * (1.0 - self.hysteresis_fraction) if beyond else self.threshold
        if not deviation > limit:  # NaN is not beyond
            self._beyond[key] = 0
            return False
        beyond += 1
        self._beyond[key] = beyond
        if beyond < self.confirm_checks and not deviation > self.jump_factor * self.threshold:
            return False
        if now_s - self._fired_at.get(key, -math.inf) < self.cooldown_s:
            return False
        self._fired_at[key] = now_s
        self._beyond[key] = 0
        return True
