"""The adaptive replacement policy: LRU or LCS, whichever of two shadow caches wins on the access stream.

LCS (GreenCache's score) beats LRU where reuse is skewed and loses where its frequency term misleads it: on
Mooncake's synthetic trace, which it was not tuned on, it fell 0.93 points of token hit rate below LRU at
10 % capacity. No fixed policy is safe on traffic nobody has seen, so the policy in force is chosen online,
the way set dueling (DIP, Qureshi et al. ISCA'07) and ARC's ghost lists learn what a stream rewards:

* Two **shadow caches** of the real cache's capacity, one LRU and one LCS, hold keys and sizes only (no KV
  data) and see every access; each counts the tokens it would have hit.
* **The duel** (`Duel`) compares what they earned where they disagree: per request the difference of their
  hit tokens, split into "LCS hit more" and "LRU hit more", each summed with an exponential decay whose
  half-life is `HALF_LIFE_TURNOVERS` cache turnovers (one turnover: as many references as the cache holds
  entries), so the window scales with the cache and old evidence fades. LRU leads first. LCS takes the lead
  only when its disagreement sum exceeds LRU's by `LEAD_MARGIN` (50 % more); LRU takes it back as soon as its
  sum is the larger. The asymmetry is the hysteresis: a switch costs hits while the real cache's contents
  converge, so the burden of proof is on LCS, and a switch back to the safe policy is never delayed.
* **The real cache follows the leader's order**: its index scores entries by LCS or by recency alone
  (`CacheIndex.set_order`), so every eviction (a resize shrink, the index cap, the candidates listed) is the
  leader's choice over what the real cache holds.

Guarantee, per decayed window (the same sums the rule reads): while LCS leads, its shadow earned at least as
much as LRU's (else LRU would have taken back the lead), so the leader's shadow earns at least LRU's shadow at
every request. The real cache earns what the leader's shadow earns except while its contents converge after a
switch: it then misses entries the new leader holds and it does not, at most one miss per entry in which they
differ, so at most one cache's worth of misses per switch. A switch to LCS happens only after LCS earned
`LEAD_MARGIN` more on the disagreements over the window, so an LCS lead that turns out to be noise costs at
most one convergence and ends as soon as LRU's sum is ahead again. Hence, over each window, the real cache's
hit tokens >= LRU's - (switches in the window) x (one turnover of hits on the entries the two policies
disagree on); `greenserve bench cache-policy` measures the result on every trace and capacity
(docs/cache_manager.md), and tests/cache_manager/test_adaptive_policy.py asserts it on adversarial traces.

Memory (the live service, `LivePolicy`): the shadows hold at most `max_entries` keys each. Past that the
stream is spatially sampled (SHARDS, Waldspurger et al. FAST'15): only keys whose hash falls in 1 / 2^k of
the hash space are simulated, in shadows of 1 / 2^k of the capacity, and k grows by one (dropping the keys
outside the smaller sample) whenever a shadow would hold more than `max_entries`. The hit tokens of a sampled
shadow (and the real cache's, counted on the same sampled keys) are scaled by 2^k in the status, estimates of
the whole stream's.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from greenserve.common.cache_index.index import CacheIndex
from greenserve.common.cache_index.index_keys import key_hash
from greenserve.v1 import cache_manager_pb2

if TYPE_CHECKING:  # journal.py imports this module's users
    from greenserve.cache_manager import journal

LRU, LCS = 0, 1
NAMES = ("LRU", "LCS")
ORDERS = ("lru", "lcs")  # CacheIndex.set_order of each leader
#: Half-life of the duel's sums, in cache turnovers (references / entries the cache holds).
HALF_LIFE_TURNOVERS = 2.0
#: LCS leads once it earned this much more than LRU on the requests where they disagree (0.5: 50 % more).
LEAD_MARGIN = 0.5
#: Eviction policies of the cache-manager (--eviction-policy): the adaptive duel, or one order fixed.
POLICIES = ("adaptive", "lcs", "lru")
#: Default of --policy-shadow-max-entries: keys per shadow cache and pool before the stream is sampled.
SHADOW_MAX_ENTRIES = 16_384


class PolicyStatus(TypedDict):
    """`LivePolicy.status`: what the policy decided and why."""

    mode: str
    leader: str
    switches: int
    capacity_bytes: int
    sample_rate: float
    shadow_entries: list[int]
    window_hit_tokens: dict[str, float]  # "LRU", "LCS" (the shadows) and "real" -> hit tokens over the window
    window_disagreement_tokens: dict[str, float]  # "LRU", "LCS" -> hit tokens where the shadows disagreed


class PolicyState(TypedDict):
    """`LivePolicy.state`: the duel's state at a checkpoint (saved as JSON)."""

    mode: str
    leader: int
    switches: int
    won: list[float]
    earned: list[float]
    real: float
    sample_shift: int


class Duel:
    """The leader choice from the two shadows' hit tokens (no cache state; O(1) per request).

    `observe(lru, lcs, refs, entries)` takes one request: the hit tokens each shadow earned, the references it
    made (blocks, or 1 for an entry) and how many entries the cache holds (the turnover's size). It returns
    True when the leader changed. `real` (the real cache's hit tokens) only feeds the status sums.
    """

    def __init__(self, *, half_life_turnovers: float = HALF_LIFE_TURNOVERS, margin: float = LEAD_MARGIN,
                 start: int = LRU) -> None:
        if not half_life_turnovers > 0:
            raise ValueError("half_life_turnovers must be > 0")
        if not margin >= 0:
            raise ValueError("margin must be >= 0")
        self.half_life_turnovers = half_life_turnovers
        self.margin = margin
        self.leader = start
        self.switches = 0
        self.requests = 0
        # Decayed sums: tokens LRU hit more / LCS hit more (the disagreements), and, for the status, the
        # hit tokens of each shadow and of the real cache.
        self.won = [0.0, 0.0]
        self.earned = [0.0, 0.0]
        self.real = 0.0

    def observe(self, lru: float, lcs: float, refs: int, entries: int, real: float = 0.0) -> bool:
        self.requests += 1
        decay = 0.5 ** (refs / max(1.0, self.half_life_turnovers * entries))
        d = lcs - lru
        won, earned = self.won, self.earned
        won[LRU] = won[LRU] * decay + (-d if d < 0 else 0.0)
        won[LCS] = won[LCS] * decay + (d if d > 0 else 0.0)
        earned[LRU] = earned[LRU] * decay + lru
        earned[LCS] = earned[LCS] * decay + lcs
        self.real = self.real * decay + real
        if self.leader == LRU and won[LCS] > won[LRU] * (1.0 + self.margin):
            self.leader = LCS
        elif self.leader == LCS and won[LRU] > won[LCS]:
            self.leader = LRU
        else:
            return False
        self.switches += 1
        return True

    @property
    def name(self) -> str:
        return NAMES[self.leader]


# ----- the live service's shadows ----------------------------------------------------------------------
class _ShadowLru:
    """Keys and sizes in LRU order, at most `capacity` bytes."""

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self.keys: OrderedDict[int, int] = OrderedDict()
        self.bytes = 0

    def __contains__(self, h: int) -> bool:
        return h in self.keys

    def __len__(self) -> int:
        return len(self.keys)

    def touch(self, h: int) -> None:
        self.keys.move_to_end(h)

    def store(self, h: int, size: int) -> None:
        old = self.keys.pop(h, None)
        if old is not None:
            self.bytes -= old
        if not 0 < size <= self.capacity:
            return
        self.keys[h] = size
        self.bytes += size
        while self.bytes > self.capacity:
            self.bytes -= self.keys.popitem(last=False)[1]

    def drop(self, h: int) -> None:
        old = self.keys.pop(h, None)
        if old is not None:
            self.bytes -= old


class _ShadowLcs:
    """Keys in a metadata-only LCS index (the pool index's score), at most `capacity` bytes."""

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self.index = CacheIndex(initial_capacity=64)

    def __contains__(self, key: str) -> bool:
        return key in self.index

    def __len__(self) -> int:
        return len(self.index)

    def hit(self, key: str, tokens: int, now_s: float, turn: int, document_id: str) -> None:
        self.index.hit(key, hit_tokens=tokens, now_s=now_s, turn=turn, document_id=document_id)

    def store(self, key: str, size: int, tokens: int, now_s: float, turn: int, document_id: str) -> None:
        if not 0 < size <= self.capacity:
            self.index.remove(key)
            return
        slot = self.index.store(key, tokens=max(tokens, 1), size_bytes=size, now_s=now_s, turn=turn,
                                document_id=document_id)
        if self.index.bytes_in_use > self.capacity:
            for s in _victims(self.index, self.index.bytes_in_use - self.capacity, now_s, exclude=slot):
                self.index.remove_slot(s)


@dataclass(frozen=True)
class Access:
    """One access of the live stream, as the policy reads it (a journaled HIT, MISS or STORE)."""

    kind: str  # "hit", "miss" or "store"
    key: str
    time_s: float
    tokens: int = 0  # a STORE's tokens; a MISS's prompt tokens
    size_bytes: int = 0
    hit_tokens: int = 0  # a HIT's reused tokens
    turn: int = 0
    document_id: str = ""


_KINDS: dict[int, str] = {cache_manager_pb2.ACCESS_KIND_HIT: "hit", cache_manager_pb2.ACCESS_KIND_MISS: "miss",
                           cache_manager_pb2.ACCESS_KIND_STORE: "store"}


def access_of(ev: journal.Event) -> Access | None:
    """A journaled event as the policy reads it (None: an EVICT, which the shadows ignore)."""
    kind = _KINDS.get(ev.kind)
    if kind is None:
        return None
    return Access(kind, ev.entry_key, ev.time_s, tokens=ev.tokens, size_bytes=ev.size_bytes,
                  hit_tokens=ev.hit_tokens, turn=ev.turn, document_id=ev.document_id)


class LivePolicy:
    """One pool's eviction policy in the cache-manager: fixed (`"lcs"`, `"lru"`) or `"adaptive"` (module doc).

    `observe` takes every access of the pool in journal order (live and at the journal replay after a start);
    `order` is the CacheIndex order the pool's index must use. `capacity_bytes` is the real cache's size (the
    pool's LMCache L1 bytes); 0 (unknown) leaves the shadows empty and LRU in the lead.

    Event semantics (the router's feed: a HIT names the deepest reused block and its tokens, a MISS the prompt's
    deepest block, a STORE the stored prompt): a shadow holding a HIT's or MISS's key earns the tokens it would
    have served (hit tokens, or the whole prompt), then the key is recent in it; a shadow that does not hold a
    HIT's key stores it (the real cache would have recomputed and stored it) when its size is known (the HIT's own
    size, else the key's last STORE's; the table of sizes keeps the 2 x max_entries keys accessed last); a STORE
    stores the key in both shadows. Entries the service itself evicts do not change the shadows: they simulate
    their own policies.
    """

    def __init__(self, mode: str = "adaptive", capacity_bytes: int = 0, *,
                 max_entries: int = SHADOW_MAX_ENTRIES, half_life_turnovers: float = HALF_LIFE_TURNOVERS,
                 margin: float = LEAD_MARGIN) -> None:
        if mode not in POLICIES:
            raise ValueError(f"eviction policy must be one of {POLICIES}, got {mode!r}")
        if max_entries < 16:
            raise ValueError("max_entries must be >= 16")
        self.mode = mode
        self.max_entries = max_entries
        self.duel = Duel(half_life_turnovers=half_life_turnovers, margin=margin)
        self.sample_shift = 0  # keys simulated: hash's top sample_shift bits all zero (1 in 2^shift)
        self.capacity_bytes = 0
        self._sizes: OrderedDict[int, tuple[int, int]] = OrderedDict()  # sampled key -> (size, tokens) of its store
        self._lru = _ShadowLru(0)
        self._lcs = _ShadowLcs(0)
        self.events = 0
        self.set_capacity(capacity_bytes)

    # ----- what the service reads --------------------------------------------------------------------
    @property
    def leader(self) -> str:
        """The policy in force: "LRU" or "LCS"."""
        if self.mode == "lcs":
            return "LCS"
        if self.mode == "lru":
            return "LRU"
        return self.duel.name

    @property
    def order(self) -> str:
        return self.leader.lower()

    @property
    def sample_rate(self) -> float:
        return 1.0 / (1 << self.sample_shift)

    def status(self) -> PolicyStatus:
        """What the policy decided and why (logs, metrics, resize details)."""
        scale = float(1 << self.sample_shift)
        d = self.duel
        return {"mode": self.mode, "leader": self.leader, "switches": d.switches, "capacity_bytes": self.capacity_bytes,
                "sample_rate": self.sample_rate, "shadow_entries": [len(self._lru), len(self._lcs)],
                "window_hit_tokens": {"LRU": d.earned[LRU] * scale, "LCS": d.earned[LCS] * scale,
                                      "real": d.real * scale},
                "window_disagreement_tokens": {"LRU": d.won[LRU] * scale, "LCS": d.won[LCS] * scale}}

    def text(self) -> str:
        if self.mode != "adaptive":
            return f"eviction order {self.leader} (--eviction-policy {self.mode})"
        s = self.status()
        won = s["window_disagreement_tokens"]
        return (f"eviction order {self.leader} (adaptive: {self.duel.switches} switches; where the shadows disagreed "
                f"LRU hit {won['LRU']:.0f} tokens, LCS {won['LCS']:.0f} over the window; LCS leads only "
                f"{self.duel.margin:.0%} ahead)")

    # ----- checkpoints -------------------------------------------------------------------------------
    def state(self) -> PolicyState:
        """The duel's state (small; the shadows are not kept: they refill from the stream)."""
        d = self.duel
        return {"mode": self.mode, "leader": d.leader, "switches": d.switches, "won": list(d.won),
                "earned": list(d.earned), "real": d.real, "sample_shift": self.sample_shift}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take back a `state()` of the same mode (a checkpoint's, decoded JSON: any value may have any type);
        ValueError, TypeError or KeyError when it is not one."""
        if state.get("mode") != self.mode:
            raise ValueError(f"policy state of mode {state.get('mode')!r}, not {self.mode!r}")
        leader, shift = int(state["leader"]), int(state["sample_shift"])
        won = [float(x) for x in state["won"]]
        earned = [float(x) for x in state["earned"]]
        real = float(state["real"])
        values = [*won, *earned, real]
        if leader not in (LRU, LCS) or not 0 <= shift <= 63 or len(won) != 2 or len(earned) != 2 or not all(
                math.isfinite(v) and v >= 0 for v in values):
            raise ValueError("policy state out of range")
        d = self.duel
        d.leader, d.switches, d.won, d.earned, d.real = leader, int(state["switches"]), won, earned, real
        if shift != self.sample_shift:
            self.sample_shift = shift
            self._lru.keys.clear()
            self._lru.bytes = 0
            self._lcs = _ShadowLcs(0)
            self._sizes.clear()
            self._resize_shadows()

    # ----- capacity and sampling ---------------------------------------------------------------------
    def set_capacity(self, capacity_bytes: int) -> None:
        """The real cache's size; the shadows shrink (evicting by their own policy) or grow to it."""
        capacity_bytes = max(0, int(capacity_bytes))
        if capacity_bytes == self.capacity_bytes:
            return
        self.capacity_bytes = capacity_bytes
        self._resize_shadows()

    def _resize_shadows(self) -> None:
        cap = self.capacity_bytes * self.sample_rate
        self._lru.capacity = cap
        while self._lru.bytes > cap:
            self._lru.bytes -= self._lru.keys.popitem(last=False)[1]
        self._lcs.capacity = cap
        index = self._lcs.index
        if index.bytes_in_use > cap and len(index):
            now = float(np.max(index.last_access_s[: index._n]))
            for s in _victims(index, index.bytes_in_use - cap, now):
                index.remove_slot(s)

    def _sampled(self, h: int) -> bool:
        return self.sample_shift == 0 or h >> (64 - self.sample_shift) == 0

    def _halve_sample(self) -> None:
        """Simulate half as many keys (SHARDS with a lowered threshold): drop those outside the new sample."""
        self.sample_shift += 1
        for h in [h for h in self._lru.keys if not self._sampled(h)]:
            self._lru.drop(h)
        index = self._lcs.index
        live = np.flatnonzero(index.live)
        gone = live[(index.key_hash[live] >> np.uint64(64 - self.sample_shift)) != 0]
        for s in gone.tolist():
            index.remove_slot(s)
        for h in [h for h in self._sizes if not self._sampled(h)]:
            del self._sizes[h]
        # Earned sums are per simulated key: halve them so old and new evidence weigh alike.
        d = self.duel
        d.won = [x / 2 for x in d.won]
        d.earned = [x / 2 for x in d.earned]
        d.real /= 2
        self._resize_shadows()

    # ----- the stream --------------------------------------------------------------------------------
    def observe(self, ev: Access) -> bool:
        """Feed one access; True when the leader changed (the caller re-orders the pool's index)."""
        if self.mode != "adaptive" or self.capacity_bytes <= 0:
            return False
        h = _uhash(ev.key)
        if not self._sampled(h):
            return False
        self.events += 1
        lru, lcs = self._lru, self._lcs
        if ev.kind == "store":
            self._sizes[h] = (ev.size_bytes, ev.tokens)
            self._sizes.move_to_end(h)
            while len(self._sizes) > 2 * self.max_entries:
                self._sizes.popitem(last=False)
            lru.store(h, ev.size_bytes)
            lcs.store(ev.key, ev.size_bytes, ev.tokens, ev.time_s, ev.turn, ev.document_id)
            self._bound()
            return False
        tokens = ev.hit_tokens or ev.tokens if ev.kind == "hit" else ev.tokens
        real = float(ev.hit_tokens or ev.tokens) if ev.kind == "hit" else 0.0
        if ev.kind == "hit" and ev.size_bytes > 0:  # the router's HITs carry the reused prefix's size
            self._sizes[h] = (ev.size_bytes, tokens)
        if h in self._sizes:  # the size table keeps the keys accessed last (a hot key's size stays known)
            self._sizes.move_to_end(h)
            while len(self._sizes) > 2 * self.max_entries:
                self._sizes.popitem(last=False)
        in_lru, in_lcs = h in lru, ev.key in lcs
        if in_lru:
            lru.touch(h)
        if in_lcs:
            lcs.hit(ev.key, tokens, ev.time_s, ev.turn, ev.document_id)
        if ev.kind == "hit" and not (in_lru and in_lcs) and h in self._sizes:
            size, stored_tokens = self._sizes[h]
            if not in_lru:
                lru.store(h, size)
            if not in_lcs:
                lcs.store(ev.key, size, stored_tokens, ev.time_s, ev.turn, ev.document_id)
            self._bound()
        return self.duel.observe(float(tokens) if in_lru else 0.0, float(tokens) if in_lcs else 0.0, 1,
                                 max(len(lru), len(lcs), 1), real)

    def _bound(self) -> None:
        while max(len(self._lru), len(self._lcs)) > self.max_entries:
            self._halve_sample()


def _uhash(key: str) -> int:
    """The key's 64-bit hash (the index's own, so a key is sampled the same way everywhere)."""
    return int(key_hash(key))


def _victims(index: CacheIndex, excess: float, now_s: float, exclude: int = -1) -> list[int]:
    """Slots of the index's first victims (its own order, never `exclude`) whose bytes cover `excess`."""
    out: list[int] = []
    chosen: set[int] = set()
    ex = np.array([exclude], dtype=np.int64) if exclude >= 0 else None
    while excess > 0:
        slots = index.choose_victims(min(len(index), len(out) + 1 if len(out) < 8 else len(out) + 256), now_s,
                                     exclude=ex)
        fresh = [int(s) for s in slots if int(s) not in chosen]
        if not fresh:
            break
        for s in fresh:
            out.append(s)
            chosen.add(s)
            excess -= float(index.size_bytes[s])
            if excess <= 0:
                break
    return out


__all__ = ["Access", "access_of", "Duel", "HALF_LIFE_TURNOVERS", "LCS", "LEAD_MARGIN", "LRU", "LivePolicy", "NAMES", "ORDERS",
           "POLICIES", "SHADOW_MAX_ENTRIES"]
