"""Routing policy: filters, then a weighted sum of scorers, then the best engine (ties rotate).

``RoutingPolicy.choose`` takes the request's candidates from the registry (an unknown pool or model is the
caller's error, ``UnknownTargetError``), builds a ``Choice`` (choice.py) and runs, as GIE/llm-d's endpoint
picker does:

1. the filters (filters.py): availability, plan, bounded load; each narrows the engines, all but availability
   fail open;
2. the scorers (scorers.py): load, plan, prefix, session, affinity; each scores every engine left in [0, 1],
   times its weight (``PolicyConfig``; defaults in docs/router.md);
3. the pick: the highest total, ties broken by a rotating start; the session key is then stuck to the engine.

The cost per request is O(engines in the pool + prompt blocks), with no lock and no I/O.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from greenserve.common.errors import shown
from greenserve.router.routing.choice import Choice
from greenserve.router.routing.enforcer import ActivePlan
from greenserve.router.routing.engines import EngineRegistry, EngineState
from greenserve.router.routing.filters import AvailabilityFilter, BoundedLoadFilter, Filter, PlanFilter
from greenserve.router.routing.prefix_index import PrefixIndex
from greenserve.router.routing.scorers import (
    AffinityScorer,
    LoadScorer,
    PlanScorer,
    PrefixScorer,
    Scorer,
    SessionScorer,
)


class NoEngineError(Exception):
    """No engine can serve the request (none registered for it, or all draining/excluded)."""


class UnknownTargetError(NoEngineError):
    """The request names a pool or a model the router does not know. The caller's error, answered like vLLM
    answers an unknown model (HTTP 404, gRPC NOT_FOUND naming ``grpc_field``), not like a known target with no
    engine up now (503 / UNAVAILABLE, which clients and gateways retry: a retry cannot make it exist)."""

    http_param = ""  # where the HTTP request named it
    grpc_field = ""  # the field of a gRPC request that named it
    outcome = ""  # the failure outcome counted


class UnknownPoolError(UnknownTargetError):
    """A pool no engine of which is registered (in any state) and which neither the plan in force nor the fleet
    inventory names."""

    http_param, grpc_field, outcome = "x-greenserve-pool", "request.pool", "unknown_pool"

    def __init__(self, pool: str) -> None:
        super().__init__(f"the pool {shown(pool)} does not exist (x-greenserve-pool header)")
        self.pool = pool


class UnknownModelError(UnknownTargetError):
    """A request with no pool whose model no registered engine serves, while the engines serve several known
    models (with one model, or an engine whose model is not known yet, any model goes to them: the engine answers
    for itself)."""

    http_param, grpc_field, outcome = "model", "request.model", "unknown_model"

    def __init__(self, model: str) -> None:
        super().__init__(f"the model {shown(model)} does not exist")
        self.model = model


@dataclass(frozen=True)
class PolicyConfig:
    """Scorer weights and filter parameters."""

    plan_weight: float = 1.0
    load_weight: float = 2.0
    prefix_weight: float = 3.0
    session_weight: float = 10.0
    bounded_load_factor: float = 1.25
    bounded_load_slack: float = 8.0
    max_sessions: int = 100_000
    decode_load_weight: float = 0.0
    affinity_weight: float = 3.0
    affinity_queue_slack: float = 3.0


@dataclass(slots=True)
class Decision:
    """The chosen engine and why."""

    engine: EngineState
    matched_blocks: int
    total_blocks: int
    plan_version: int
    fallbacks: tuple[str, ...] = ()
    reason: str = ""


SESSION_KEY_MAX_CHARS = 256
"""Session keys longer than this are remembered by their 128-bit BLAKE2b digest: the key comes from the caller
(x-greenserve-session, x-session-id, the body's "user", gRPC's session_key) and up to ``max_sessions`` are kept,
so a key kept as given could hold up to 16 MiB (a body's "user") each."""


def _long_session_key(key: str) -> str:
    return "blake2b:" + hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class RoutingPolicy:
    """Chooses an engine for a request; see the module docstring."""

    def __init__(self, registry: EngineRegistry, index: PrefixIndex, plans: ActivePlan, config: PolicyConfig) -> None:
        self.registry = registry
        self.index = index
        self.plans = plans
        self.config = config
        self.sessions: OrderedDict[str, str] = OrderedDict()
        self._rotate = 0
        self.fallback_counts: dict[str, int] = {}
        self.filters: tuple[Filter, ...] = (
            AvailabilityFilter(), PlanFilter(plans),
            BoundedLoadFilter(config.bounded_load_factor, config.bounded_load_slack))
        # added in this order: a floating-point sum, and so which engines tie, depends on it
        self.scorers: tuple[Scorer, ...] = (
            LoadScorer(config.load_weight), PlanScorer(config.plan_weight), PrefixScorer(config.prefix_weight),
            SessionScorer(config.session_weight), AffinityScorer(config.affinity_weight, config.affinity_queue_slack))
        # bound once: choose runs per request
        self._filter_steps = tuple(f.apply for f in self.filters)
        self._prepares = tuple(s.prepare for s in self.scorers if type(s).prepare is not Scorer.prepare)
        self._adds = tuple(s.add for s in self.scorers)

    def plans_name_pool(self, pool: str) -> bool:
        """Whether the plan (any interval's routing weights) or the fleet inventory names ``pool``: a pool the
        optimizer serves is known even while none of its engines is registered (being started or scaled to 0).
        Asked only when no engine of the pool is registered, never on the way of a routable request."""
        plans = self.plans
        if pool in plans.pool_slo or pool in plans.pool_region:
            return True
        plan = plans.plan
        return plan is not None and any(w.pool == pool for interval in plan.intervals
                                        for w in interval.routing_weights)

    def choose(
        self,
        pool: str,
        model: str,
        hashes: Sequence[int],
        session_key: str = "",
        exclude: frozenset[str] | set[str] = frozenset(),
        explain: bool = False,
    ) -> Decision:
        """The best engine for a request (NoEngineError when none can serve it)."""
        if len(session_key) > SESSION_KEY_MAX_CHARS:  # one len() per request; long keys hashed (bounded memory)
            session_key = _long_session_key(session_key)
        cands = self.registry.candidates(pool, model)
        if not cands:
            if pool and not self.plans_name_pool(pool):  # (a pool with an engine in any state has candidates)
                raise UnknownPoolError(pool)
            if not pool and model and self.registry.model_unknown(model):
                raise UnknownModelError(model)
            what = f"pool {pool!r}" if pool else (f"model {model!r}" if model else "any request")
            raise NoEngineError(f"no engine registered for {what}")
        choice = Choice(pool, hashes, exclude, time.monotonic(), cands, self.registry.policy.stale_after_s,
                        self.config.decode_load_weight)
        for apply in self._filter_steps:
            apply(choice)
        if not choice.live:  # (only availability may leave none; the other filters fail open)
            raise NoEngineError("every engine for the request is draining, asleep, failed or already tried")
        live = choice.live
        if choice.loads is None:
            choice.measure_loads()
        choice.min_queue = min(choice.queue)
        if hashes:
            choice.matches = self.index.match(hashes)
        if session_key:
            choice.sticky = self.sessions.get(session_key)
        for prepare in self._prepares:
            prepare(choice)
        n = len(live)
        totals = [0.0] * n
        for add in self._adds:  # added in the scorers' order, engine by engine
            add(choice, totals)
        # the first engine with the best total, from a start that moves by one each request (ties rotate)
        start = self._rotate % n
        self._rotate += 1
        best_score = max(totals)
        best_i = start
        for k in range(start, start + n):
            best_i = k if k < n else k - n
            if totals[best_i] == best_score:
                break
        engine = live[best_i]
        if session_key:
            sessions = self.sessions
            sessions[session_key] = engine.id
            sessions.move_to_end(session_key)
            if len(sessions) > self.config.max_sessions:
                sessions.popitem(last=False)
        fallbacks = choice.fallbacks
        for name in fallbacks:
            self.fallback_counts[name] = self.fallback_counts.get(name, 0) + 1
        reason = ""
        if explain:
            parts = [part for scorer in self.scorers for part in scorer.explain(choice, best_i)]
            if fallbacks:
                parts.append("fallbacks=" + ",".join(fallbacks))
            reason = f"{engine.id}: score {best_score:.3f} of {n} candidates; " + ", ".join(parts)
        return Decision(engine, choice.matches.get(engine.id, 0), choice.total_blocks, choice.plan_version,
                        tuple(fallbacks), reason)
