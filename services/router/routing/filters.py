"""The routing policy's filters: each narrows a request's ``Choice.live`` (choice.py), in order.

Every filter but availability fails open: when it would leave no engine, it leaves the engines as they are and
records its fallback (counted per name by the policy, shown in the decision's explanation).

1. ``AvailabilityFilter``: not draining, not held out by sleep mode (going to sleep, asleep or waking:
   engine_sleep.py; never failed open, an asleep engine would hold the request until it wakes), not ejected (an
   ejected engine whose backoff has passed gets one half-open trial request), not already tried by this request;
   when every engine is ejected, the one due back soonest is tried (fallback ``all_ejected``); when none is left
   at all, ``live`` is empty and the policy answers NoEngineError.
2. ``PlanFilter``: reads the plan in force for the request's pool (its weights then serve the plan scorer and the
   affinity target too) and drops the engines the plan gives weight 0 (fallback ``plan_excludes_all``).
3. ``BoundedLoadFilter``: drops the engines whose in-flight load exceeds ``max(c x mean, mean + slack)``
   (consistent hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam, SODA 2018; the absolute slack keeps
   affinity at low load, like SGLang's balance_abs and AIBrix's delta; fallback ``all_over_load_bound``).
"""

from __future__ import annotations

from typing import Protocol

from greenserve.router.routing.choice import Choice
from greenserve.router.routing.enforcer import ActivePlan


class Filter(Protocol):
    """A step that narrows ``choice.live``."""

    def apply(self, choice: Choice) -> None:
        """Narrows ``choice.live`` (through ``choice.keep`` once loads are measured), or records a fallback."""
        ...


class AvailabilityFilter:
    """Engines that can take a request now (see the module docstring)."""

    def apply(self, choice: Choice) -> None:
        cands = choice.live
        exclude = choice.exclude
        now = choice.now
        if exclude:
            live = [e for e in cands if e.id not in exclude and e.routable(now)]
        else:  # the common case: routable() asked only of ejected engines (all it adds for the others)
            live = [e for e in cands
                    if not e.draining and not e.sleep_hold and (not e.ejected_until or e.routable(now))]
        if not live:
            ejected = [e for e in cands if e.id not in exclude and not e.draining and not e.sleep_hold
                       and not e.probe_in_flight]
            if ejected:
                live = [min(ejected, key=lambda e: e.ejected_until)]
                choice.fallbacks.append("all_ejected")
        choice.live = live


class PlanFilter:
    """Engines the plan in force does not weigh 0; puts the plan's weights on the choice."""

    def __init__(self, plans: ActivePlan) -> None:
        self.plans = plans
        # of the last weights read (the plan's dicts are replaced, never changed, when the interval changes):
        # the weights, their mean (an unnamed engine's weight) and whether any engine may weigh 0
        self._seen: tuple[dict[str, float], float, bool] | None = None

    def apply(self, choice: Choice) -> None:
        live = choice.live
        if not live:
            return
        weights, choice.plan_version = self.plans.weights_for(choice.pool or live[0].pool)
        if not weights:
            return
        choice.weights = weights
        seen = self._seen
        if seen is None or seen[0] is not weights:
            mean = sum(weights.values()) / len(weights)
            seen = self._seen = (weights, mean, mean <= 0.0 or min(weights.values()) <= 0.0)
        unnamed = choice.unnamed_weight = seen[1]
        if not seen[2]:
            return
        kept = [e for e in live if weights.get(e.id, unnamed) > 0.0]
        if kept:
            choice.live = kept
        else:
            choice.fallbacks.append("plan_excludes_all")


class BoundedLoadFilter:
    """Engines whose in-flight load stays within the bound (see the module docstring)."""

    def __init__(self, factor: float, slack: float) -> None:
        self.factor = factor
        self.slack = slack

    def apply(self, choice: Choice) -> None:
        loads = choice.measure_loads()
        n = len(loads)
        if n < 2:
            return
        mean = (sum(loads) + 1.0) / n
        bound = max(self.factor * mean, mean + self.slack)
        if max(loads) <= bound:
            return
        keep = [i for i, load in enumerate(loads) if load <= bound]
        if keep:
            choice.keep(keep)
        else:
            choice.fallbacks.append("all_over_load_bound")
