"""Routing policy: filters, then a weighted sum of scorers, then the best engine (ties rotate).

Filters (each fails open: when it would leave no engine, it is skipped and the fallback is counted):

1. availability: not draining, not held out by sleep mode (going to sleep, asleep or waking: engine_sleep.py;
   never failed open, an asleep engine would hold the request until it wakes), not ejected (an ejected engine
   whose backoff has passed gets one half-open trial request); when every engine is ejected, the one due back
   soonest is tried;
2. plan: engines the active plan gives weight 0 in this pool;
3. bounded load: engines whose load exceeds ``max(c x mean, mean + slack)`` (consistent hashing with
   bounded loads, Mirrokni, Thorup and Zadimoghaddam, SODA 2018; the absolute slack keeps affinity
   at low load, like SGLang's balance_abs and AIBrix's delta).

Scorers, each in [0, 1], weighted (defaults in docs/router.md; GIE's default profile weighs queue 2,
kv-cache 2, prefix 3):

* plan: the engine's plan weight over the largest in its pool (1 for all when there is no plan; an
  engine the plan does not name counts as the pool's mean weight);
* load: ``(min_q + 1) / (q + 1)`` with q the engine's queue load (engines.EngineState.queue_load): the
  requests sent to it that still wait for their first token, plus ``decode_load_weight`` (default 0)
  per decoding one. What delays a new request's first token is the prefill work queued ahead of it.
  Counting every in-flight request alike (join the shortest queue) sends each new request to the
  engine where others just finished, i.e. bursts of prefills onto one engine: on the router bench
  (256 desynchronised streams, 2 engines) that cost +6.5 ms of TTFT p50 against round robin, the
  queue count +0.8..2 ms (the bench's run-to-run noise is about 1.5 ms). Decoding requests stay
  balanced through the bounded-load filter, which counts every request in flight; ties in q rotate;
* prefix: leading prompt blocks the engine is believed to hold over the prompt's blocks;
* session: 1 for the engine the session key is stuck to (kept while it passes the filters);
* affinity: 1 for the engine that rendezvous (highest random weight) hashing of the prompt's affinity key
  (prefix_index.PrefixHashes: a chat's system messages and first user message, a completion's first
  blocks) picks among the engines left by the filters, each weighted by its plan weight (Thaler and
  Ravishankar 1998; weighted form: score ``w / -ln(u)``, u uniform from the key and the engine id).
  The choice depends only on the key, the candidate set and the plan, never on which replica or worker
  took the request, so every turn of a conversation goes to the same engine from every replica; when
  that engine is over the load bound, the filter removed it and the next engine in the key's order
  takes it (consistent hashing with bounded loads). Also skipped while that engine has more than
  ``affinity_queue_slack`` requests awaiting their first token beyond the least queued candidate (its
  queue load, from this replica's requests and the engine's own metrics): a key many requests share at
  once (one prompt head sent in parallel) must not pile onto one engine; a conversation's turns come one
  after another and keep their engine. Skipped when every candidate is already known to
  hold the key's blocks, for a completion's key only (a prefix every engine holds, e.g. one shared
  prompt head, says nothing; a chat's key names one conversation). The chosen engine counts as
  holding at least the key's blocks for the prefix scorer: engines that hold only a system prompt
  shared by many conversations do not outscore it.

The cost per request is O(engines in the pool + prompt blocks), with no lock and no I/O.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from greenserve.common.errors import shown
from greenserve.router.routing.enforcer import ActivePlan
from greenserve.router.routing.engines import EngineRegistry, EngineState
from greenserve.router.routing.prefix_index import PrefixIndex


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


_M64 = (1 << 64) - 1
_TWO_64 = float(1 << 64)


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit ints that spreads every input bit."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def rendezvous(key: int, engines: Sequence[EngineState], weights: dict[str, float] | None = None,
               default_weight: float = 1.0) -> EngineState | None:
    """The engine with the highest random weight for ``key``: ``w / -ln(u)`` with ``u`` in (0, 1) hashed
    from the key and the engine id. Each engine wins a share of keys proportional to its weight, and
    removing an engine moves only the keys it had. Engines of weight 0 never win; None when none may."""
    best: EngineState | None = None
    best_score = 0.0
    for e in engines:
        w = weights.get(e.id, default_weight) if weights else default_weight
        if w <= 0.0:
            continue
        u = (_mix64(key ^ e.id_hash) + 0.5) / _TWO_64
        score = -w / math.log(u)
        if best is None or score > best_score or (score == best_score and e.id < best.id):
            best, best_score = e, score
    return best


@dataclass
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
        now = time.monotonic()
        fallbacks: list[str] = []
        if exclude:
            live = [e for e in cands if e.id not in exclude and e.routable(now)]
        else:  # the common case: routable() asked only of ejected engines (all it adds for the others)
            live = [e for e in cands if not e.draining and not e.sleep_hold and (not e.ejected_until or e.routable(now))]
        if not live:
            ejected = [e for e in cands if e.id not in exclude and not e.draining and not e.sleep_hold
                       and not e.probe_in_flight]
            if not ejected:
                raise NoEngineError("every engine for the request is draining, asleep, failed or already tried")
            live = [min(ejected, key=lambda e: e.ejected_until)]
            fallbacks.append("all_ejected")

        pool_key = pool or live[0].pool
        weights, plan_version = self.plans.weights_for(pool_key)
        unnamed_w = sum(weights.values()) / len(weights) if weights else 1.0  # engines the plan omits
        if weights:
            kept = [e for e in live if weights.get(e.id, unnamed_w) > 0.0]
            if kept:
                live = kept
            else:
                fallbacks.append("plan_excludes_all")

        stale = self.registry.policy.stale_after_s
        # (in-flight load, queue load) of each engine in one call (EngineState.loads)
        both = [e.loads(now, stale, self.config.decode_load_weight) for e in live]
        loads = [b[0] for b in both]
        if len(live) > 1:
            mean = (sum(loads) + 1.0) / len(live)
            bound = max(self.config.bounded_load_factor * mean, mean + self.config.bounded_load_slack)
            if max(loads) > bound:
                keep_idx = [i for i, load in enumerate(loads) if load <= bound]
                if keep_idx:
                    live = [live[i] for i in keep_idx]
                    loads = [loads[i] for i in keep_idx]
                    both = [both[i] for i in keep_idx]
                else:
                    fallbacks.append("all_over_load_bound")

        # the load scorer ranks by queue load; the bounded-load filter above caps total in-flight
        queue = [b[1] for b in both]
        matches = self.index.match(hashes) if hashes else {}
        total_blocks = len(hashes)
        sticky = self.sessions.get(session_key) if session_key else None
        cfg = self.config
        target: EngineState | None = None
        key = getattr(hashes, "affinity_key", 0) if cfg.affinity_weight > 0.0 and len(live) > 1 else 0
        key_blocks = 0
        if key:
            key_blocks = hashes.affinity_blocks  # type: ignore[attr-defined]
            # A chat's key names one conversation: follow it on every replica. A completion's key is a prefix
            # that many unrelated prompts may share: only a prefix no engine holds yet (in this replica's
            # index) goes to its rendezvous engine; once engines hold it, prefix and load scoring share it
            # out (else every prompt with a common preamble piles onto one engine).
            if hashes.conversation or not matches or \
                    all(matches.get(e.id, 0) < key_blocks for e in live):  # type: ignore[attr-defined]
                target = rendezvous(key, live, weights, unnamed_w)
        min_queue = min(queue)
        if target is not None and queue[live.index(target)] > min_queue + cfg.affinity_queue_slack:
            target = None
            fallbacks.append("affinity_busy")
        max_w = max((weights.get(e.id, unnamed_w) for e in live), default=1.0) if weights else 1.0
        n = len(live)
        start = self._rotate % n
        self._rotate += 1
        best_i = -1
        best_score = -1.0
        for k in range(n):
            i = (start + k) % n
            e = live[i]
            score = cfg.load_weight * (min_queue + 1.0) / (queue[i] + 1.0)
            if weights and max_w > 0:
                score += cfg.plan_weight * weights.get(e.id, unnamed_w) / max_w
            else:
                score += cfg.plan_weight
            if total_blocks:
                matched = matches.get(e.id, 0)
                if e is target and matched < key_blocks:
                    matched = key_blocks
                score += cfg.prefix_weight * matched / total_blocks
            if sticky is not None and e.id == sticky:
                score += cfg.session_weight
            if e is target:
                score += cfg.affinity_weight
            if score > best_score:
                best_score, best_i = score, i
        engine = live[best_i]
        if session_key:
            sessions = self.sessions
            sessions[session_key] = engine.id
            sessions.move_to_end(session_key)
            if len(sessions) > cfg.max_sessions:
                sessions.popitem(last=False)
        for name in fallbacks:
            self.fallback_counts[name] = self.fallback_counts.get(name, 0) + 1
        reason = ""
        if explain:
            i = best_i
            parts = [f"queue_load={queue[i]:g} (min {min_queue:g})", f"in_flight_load={loads[i]:g}"]
            if weights:
                parts.append(f"plan_weight={weights.get(engine.id, unnamed_w):g}/{max_w:g} v{plan_version}")
            if total_blocks:
                parts.append(f"prefix={matches.get(engine.id, 0)}/{total_blocks} blocks")
            if sticky is not None:
                parts.append("session=" + ("kept" if sticky == engine.id else f"moved from {sticky}"))
            if target is not None:
                parts.append("affinity=" + ("this engine" if target is engine else target.id))
            if fallbacks:
                parts.append("fallbacks=" + ",".join(fallbacks))
            reason = f"{engine.id}: score {best_score:.3f} of {n} candidates; " + ", ".join(parts)
        return Decision(engine, matches.get(engine.id, 0), total_blocks, plan_version, tuple(fallbacks), reason)
