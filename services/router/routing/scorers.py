"""The routing policy's scorers: each gives every engine left by the filters a score in [0, 1], times its weight.

The policy adds the weighted scores in the order of its scorers and picks the highest total (ties rotate).
Weights default to ``PolicyConfig``'s (docs/router.md; GIE's default profile weighs queue 2, kv-cache 2, prefix 3).
A scorer may first ``prepare`` (all of them before any adds its scores: the affinity target also raises the
prefix score), then ``add``s its weighted score of each engine to the totals, and ``explain``s its part of a
decision.

* ``LoadScorer``: ``(min_q + 1) / (q + 1)`` with q the engine's queue load (engines.EngineState.queue_load): the
  requests sent to it that still wait for their first token, plus ``decode_load_weight`` (default 0) per
  decoding one. What delays a new request's first token is the prefill work queued ahead of it. Counting every
  in-flight request alike (join the shortest queue) sends each new request to the engine where others just
  finished, i.e. bursts of prefills onto one engine (measured: docs/router.md, "Policy"). Decoding requests
  stay balanced through the bounded-load filter, which counts every request in flight; ties in q rotate.
* ``PlanScorer``: the engine's plan weight over the largest among the engines left (1 for all when there is no
  plan; an engine the plan does not name counts as the pool's mean weight).
* ``PrefixScorer``: leading prompt blocks the engine is believed to hold over the prompt's blocks.
* ``SessionScorer``: 1 for the engine the session key is stuck to (kept while it passes the filters).
* ``AffinityScorer``: 1 for the engine that rendezvous (highest random weight) hashing of the prompt's affinity key
  (prefix_index.PrefixHashes: a chat's system messages and first user message, a completion's first blocks) picks
  among the engines left by the filters, each weighted by its plan weight (Thaler and Ravishankar 1998; weighted
  form: score ``w / -ln(u)``, u uniform from the key and the engine id). The choice depends only on the key, the
  candidate set and the plan, never on which replica or worker took the request, so every turn of a conversation
  goes to the same engine from every replica; when that engine is over the load bound, the filter removed it and
  the next engine in the key's order takes it (consistent hashing with bounded loads). Skipped while that engine
  has more than ``queue_slack`` requests awaiting their first token beyond the least queued candidate (fallback
  ``affinity_busy``): a key many requests share at once (one prompt head sent in parallel) must not pile onto one
  engine; a conversation's turns come one after another and keep their engine. Skipped when every candidate is
  already known to hold the key's blocks, for a completion's key only (a prefix every engine holds, e.g. one
  shared prompt head, says nothing; a chat's key names one conversation). The chosen engine counts as holding at
  least the key's blocks for the prefix scorer: engines that hold only a system prompt shared by many
  conversations do not outscore it.

Each weighted score is computed as ``weight x numerator / denominator`` in that order, so that totals (and so ties)
come out the same on every replica and worker.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence

from greenserve.router.routing.choice import Choice
from greenserve.router.routing.engines import EngineState


class Scorer(ABC):
    """A weighted score per engine of ``choice.live``."""

    def __init__(self, weight: float) -> None:
        self.weight = weight

    def prepare(self, choice: Choice) -> None:  # noqa: B027 - optional hook, empty on purpose
        """Works out what this scorer needs from the whole choice (run for every scorer before any ``add``); the
        policy calls it only of scorers that override it."""

    @abstractmethod
    def add(self, choice: Choice, totals: list[float]) -> None:
        """Adds ``weight`` x the score of each engine of ``choice.live`` to ``totals`` (in the same order)."""

    def explain(self, choice: Choice, i: int) -> list[str]:
        """What this scorer saw of engine ``choice.live[i]``, for a decision's explanation."""
        return []


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
    log = math.log
    for e in engines:
        w = weights.get(e.id, default_weight) if weights else default_weight
        if w <= 0.0:
            continue
        x = key ^ e.id_hash  # _mix64, inlined: this runs per engine of every request with a prompt
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
        u = ((x ^ (x >> 31)) + 0.5) / _TWO_64
        score = -w / log(u)
        if best is None or score > best_score or (score == best_score and e.id < best.id):
            best, best_score = e, score
    return best


class LoadScorer(Scorer):
    """Least queue load first (see the module docstring)."""

    def add(self, choice: Choice, totals: list[float]) -> None:
        top = self.weight * (choice.min_queue + 1.0)
        for i, q in enumerate(choice.queue):
            totals[i] += top / (q + 1.0)

    def explain(self, choice: Choice, i: int) -> list[str]:
        assert choice.loads is not None  # measured before any scorer runs
        return [f"queue_load={choice.queue[i]:g} (min {choice.min_queue:g})", f"in_flight_load={choice.loads[i]:g}"]


class PlanScorer(Scorer):
    """The plan's weight, relative to the largest among the engines left."""

    def add(self, choice: Choice, totals: list[float]) -> None:
        weights, w = choice.weights, self.weight
        if not weights:
            for i in range(len(totals)):
                totals[i] += w
            return
        unnamed, live = choice.unnamed_weight, choice.live
        top = -math.inf
        for e in live:  # a plain loop: cheaper than max() over a generator for a few engines
            weight = weights.get(e.id, unnamed)
            if weight > top:
                top = weight
        choice.max_weight = top
        if top > 0:
            for i, e in enumerate(live):
                totals[i] += w * weights.get(e.id, unnamed) / top
        else:
            for i in range(len(totals)):
                totals[i] += w

    def explain(self, choice: Choice, i: int) -> list[str]:
        weights = choice.weights
        if not weights:
            return []
        weight = weights.get(choice.live[i].id, choice.unnamed_weight)
        return [f"plan_weight={weight:g}/{choice.max_weight:g} v{choice.plan_version}"]


class PrefixScorer(Scorer):
    """The share of the prompt's leading blocks the engine holds (the affinity target: at least its key's)."""

    def add(self, choice: Choice, totals: list[float]) -> None:
        total = choice.total_blocks
        if not total:
            return
        w, matches, live = self.weight, choice.matches, choice.live
        target = choice.target_index
        if matches:
            key_blocks = choice.key_blocks if target >= 0 else 0
            for i, e in enumerate(live):
                held = matches.get(e.id, 0)
                if i == target and held < key_blocks:
                    held = key_blocks
                if held:  # adding 0 changes nothing
                    totals[i] += w * held / total
        elif target >= 0 and choice.key_blocks:
            totals[target] += w * choice.key_blocks / total

    def explain(self, choice: Choice, i: int) -> list[str]:
        if not choice.total_blocks:
            return []
        return [f"prefix={choice.matches.get(choice.live[i].id, 0)}/{choice.total_blocks} blocks"]


class SessionScorer(Scorer):
    """1 for the engine the request's session is stuck to."""

    def add(self, choice: Choice, totals: list[float]) -> None:
        sticky = choice.sticky
        if sticky is None:
            return
        for i, e in enumerate(choice.live):
            if e.id == sticky:
                totals[i] += self.weight
                return

    def explain(self, choice: Choice, i: int) -> list[str]:
        sticky = choice.sticky
        if sticky is None:
            return []
        return ["session=" + ("kept" if sticky == choice.live[i].id else f"moved from {sticky}")]


class AffinityScorer(Scorer):
    """1 for the rendezvous engine of the prompt's affinity key (see the module docstring)."""

    def __init__(self, weight: float, queue_slack: float) -> None:
        super().__init__(weight)
        self.queue_slack = queue_slack

    def prepare(self, choice: Choice) -> None:
        live = choice.live
        if self.weight <= 0.0 or len(live) < 2:
            return
        hashes = choice.hashes
        key = getattr(hashes, "affinity_key", 0)
        if not key:
            return
        choice.key_blocks = key_blocks = hashes.affinity_blocks  # type: ignore[attr-defined]
        matches = choice.matches
        # A chat's key names one conversation: follow it on every replica. A completion's key is a prefix that
        # many unrelated prompts may share: only a prefix no engine holds yet (in this replica's index) goes to
        # its rendezvous engine; once engines hold it, prefix and load scoring share it out (else every prompt
        # with a common preamble piles onto one engine).
        if matches and not hashes.conversation:  # type: ignore[attr-defined]
            for e in live:
                if matches.get(e.id, 0) >= key_blocks:
                    return  # a candidate holds the completion's key already
        target = rendezvous(key, live, choice.weights, choice.unnamed_weight)
        if target is None:
            return
        i = live.index(target)
        if choice.queue[i] > choice.min_queue + self.queue_slack:
            choice.fallbacks.append("affinity_busy")
            return
        choice.target, choice.target_index = target, i

    def add(self, choice: Choice, totals: list[float]) -> None:
        i = choice.target_index
        if i >= 0:
            totals[i] += self.weight

    def explain(self, choice: Choice, i: int) -> list[str]:
        target = choice.target
        if target is None:
            return []
        return ["affinity=" + ("this engine" if target is choice.live[i] else target.id)]
