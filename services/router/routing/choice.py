"""One routing decision in the making: the engines still in the running and what the filters and scorers share.

``RoutingPolicy.choose`` builds a ``Choice`` per request from the registry's candidates, runs its filters on it
(filters.py), then its scorers (scorers.py), then picks the best total. Each filter narrows ``live``; the lists
that run parallel to ``live`` (``loads``, ``queue``) are narrowed with it by ``keep``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from greenserve.router.routing.engines import EngineState

_NO_MATCHES: Mapping[str, int] = MappingProxyType({})


class Choice:
    """The state of one request's choice (see the module docstring); built and dropped per request (slots: the
    cheapest object to build and read)."""

    __slots__ = ("decode_load_weight", "exclude", "fallbacks", "hashes", "key_blocks", "live", "loads", "matches",
                 "max_weight", "min_queue", "now", "plan_version", "pool", "queue", "stale_after_s", "sticky",
                 "target", "target_index", "total_blocks", "unnamed_weight", "weights")

    def __init__(self, pool: str, hashes: Sequence[int], exclude: frozenset[str] | set[str], now: float,
                 candidates: list[EngineState], stale_after_s: float, decode_load_weight: float) -> None:
        self.pool = pool
        self.hashes = hashes
        self.exclude = exclude
        self.now = now
        self.live = candidates
        self.stale_after_s = stale_after_s
        self.decode_load_weight = decode_load_weight
        self.fallbacks: list[str] = []
        self.total_blocks = len(hashes)
        # the plan in force for the request's pool (set by the plan filter)
        self.weights: dict[str, float] | None = None
        self.plan_version = 0
        self.unnamed_weight = 1.0  # weight of an engine the plan does not name: the mean of the named ones
        self.max_weight = 1.0  # the largest plan weight of the engines the filters left (set by the plan scorer)
        # per engine of ``live``: in-flight load and queue load (EngineState.loads), measured on first use
        self.loads: list[float] | None = None
        self.queue: list[float] = []
        self.min_queue = 0.0
        # the prompt's blocks each engine is believed to hold, the session's engine, the affinity target and its
        # index in ``live``, the blocks of the prompt's affinity key
        self.matches: Mapping[str, int] = _NO_MATCHES
        self.sticky: str | None = None
        self.target: EngineState | None = None
        self.target_index = -1
        self.key_blocks = 0

    def measure_loads(self) -> list[float]:
        """The in-flight load of each engine of ``live`` (the queue loads go to ``queue``); measured once."""
        if self.loads is not None:
            return self.loads
        now, stale, decode = self.now, self.stale_after_s, self.decode_load_weight
        loads: list[float] = []
        queue: list[float] = []
        self.loads, self.queue = loads, queue
        for e in self.live:  # a plain loop: cheaper than list comprehensions for a few engines
            in_flight, queued = e.loads(now, stale, decode)
            loads.append(in_flight)
            queue.append(queued)
        return loads

    def keep(self, indices: list[int]) -> None:
        """Narrows ``live`` (and the loads measured so far) to the engines at ``indices``."""
        self.live = [self.live[i] for i in indices]
        if self.loads is not None:
            self.loads = [self.loads[i] for i in indices]
            self.queue = [self.queue[i] for i in indices]
