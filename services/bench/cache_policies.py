"""Trace replay of cache replacement policies: FIFO, LRU, LCS, LCS + group TTL, adaptive LRU/LCS (token hit rate).

The trace is the Mooncake FAST'25 JSONL layout: one request per line with `timestamp` (ms), `input_length`
(tokens) and `hash_ids` (chained 512-token prefix-block ids). A request's cached prefix is its leading run
of blocks present in the cache (prefix caching: a block after a missing one cannot be reused); the token
hit rate is hit tokens / input tokens (GreenCache Table 3's definition). Every block of the request is
then touched or stored. Capacity counts blocks; every block takes one block of the cache (a request's
partial last block too), so LCS gives every entry Size = 512 tokens' worth and #Token = its real tokens.

- FIFO / LRU: one ordered dict; LRU touches a request's blocks in prompt order (what LMCache's LRU does).
- LCS: `CacheIndex` (GreenCache Eq. 7, see index.py for the definitions; hits decaying with idle time,
  tau estimated online from the stream, every request's blocks fed to `observe_accesses`) with the prefix
  chain of each block, so only leaves are evicted, through the index's exact incremental choice.
- Adaptive: LRU or LCS, whichever a pair of shadow caches shows winning where they disagree, recently
  (`_replay_adaptive`, the rule of adaptive.py that the cache-manager runs live); guards against traffic where
  LCS's frequency term misleads it, keeps LCS's gain where reuse is skewed.
- LCS+TTL: LCS plus Kareto group TTLs (group_ttl.py): every `ttl_period_s` the TTLs are recomputed from
  the accesses of the last `ttl_window_s` with a budget of capacity x window block-seconds, and every
  `ttl_sweep_s` entries idle past their group's TTL are deleted (leaves first), as the service does.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from greenserve.cache_manager import adaptive, group_ttl
from greenserve.common.cache_index.index import CacheIndex

BLOCK_TOKENS = 512
POLICIES = ("FIFO", "LRU", "LCS", "LCS+TTL", "Adaptive")
ABLATIONS = ("LCS-no-decay", "LCS-no-decay-no-reset", "LCS-reset", "LCS-no-chain", "LRU-chain")


@dataclass(frozen=True)
class Request:
    """One trace request: arrival (s), input tokens, prefix-block ids."""

    time_s: float
    input_tokens: int
    blocks: tuple[int, ...]

    def block_tokens(self, i: int) -> int:
        if not self.input_tokens:
            return BLOCK_TOKENS
        return max(0, min(BLOCK_TOKENS, self.input_tokens - i * BLOCK_TOKENS))


def load_trace(path: Path, limit: int | None = None) -> list[Request]:
    """Read a Mooncake-layout JSONL trace (first `limit` requests)."""
    out: list[Request] = []
    with open(path) as fh:
        for line in fh:
            if not line.strip():
                continue
            row = json.loads(line)
            blocks = tuple(int(b) for b in row["hash_ids"])
            tokens = int(row.get("input_length") or len(blocks) * BLOCK_TOKENS)
            out.append(Request(float(row["timestamp"]) / 1000.0, max(tokens, 0), blocks))
            if limit is not None and len(out) >= limit:
                break
    return out


def unique_blocks(trace: Iterable[Request]) -> int:
    return len({b for r in trace for b in r.blocks})


@dataclass
class Compiled:
    """The trace as flat arrays over dense block ids (built once, shared by all replays)."""

    times_s: np.ndarray  # per request
    input_tokens: np.ndarray  # per request
    offsets: np.ndarray  # request r's refs are [offsets[r], offsets[r+1])
    blocks: np.ndarray  # dense block id per reference
    tokens: np.ndarray  # tokens per reference
    parents: np.ndarray  # dense id of the previous block of the request, -1 for the first
    groups: np.ndarray  # per request: prefix-subtree id (Kareto groups)
    group_names: list[str]
    n_blocks: int
    block_lists: list[list[int]]  # per request, python ints (FIFO / LRU)
    token_lists: list[list[int]]
    ttl_stats: dict[tuple[int, float, int], list] = None  # type: ignore[assignment]  # window stats cache

    def window_stats(self, r: int, window_s: float, top_k: int) -> list[group_ttl.GroupStats]:
        """Kareto group statistics of the accesses in [t_r - window_s, t_r) (cached: trace-only)."""
        if self.ttl_stats is None:
            self.ttl_stats = {}
        key = (r, window_s, top_k)
        if key not in self.ttl_stats:
            start = int(np.searchsorted(self.times_s, self.times_s[r] - window_s, side="left"))
            accesses = [
                (float(self.times_s[q]), b, self.group_names[int(self.groups[q])])
                for q in range(start, r) for b in self.block_lists[q]
            ]
            self.ttl_stats[key] = group_ttl.group_stats(accesses, top_k) if accesses else []
        return self.ttl_stats[key]


def compile_trace(trace: list[Request]) -> Compiled:
    dense: dict[int, int] = {}
    blocks, tokens, parents, offsets = [], [], [], [0]
    block_lists, token_lists = [], []
    group_of: dict[str, int] = {}
    groups = []
    for req in trace:
        ids = [dense.setdefault(b, len(dense)) for b in req.blocks]
        toks = [req.block_tokens(i) for i in range(len(ids))]
        blocks.extend(ids)
        tokens.extend(toks)
        parents.extend([-1] + ids[:-1] if ids else [])
        offsets.append(len(blocks))
        block_lists.append(ids)
        token_lists.append(toks)
        groups.append(group_of.setdefault(_subtree(req), len(group_of)))
    return Compiled(
        times_s=np.array([r.time_s for r in trace]), input_tokens=np.array([r.input_tokens for r in trace]),
        offsets=np.array(offsets, dtype=np.int64), blocks=np.array(blocks, dtype=np.int64),
        tokens=np.array(tokens, dtype=np.float64), parents=np.array(parents, dtype=np.int64),
        groups=np.array(groups, dtype=np.int64), group_names=list(group_of), n_blocks=len(dense),
        block_lists=block_lists, token_lists=token_lists)


def _subtree(req: Request) -> str:
    # All Mooncake requests share block 0; the subtree root is the block below the shared root.
    return str(req.blocks[1]) if len(req.blocks) > 1 else str(req.blocks[0]) if req.blocks else ""


def replay(trace: list[Request] | Compiled, policy: str, capacity_blocks: int, *, ttl_period_s: float = 600.0,
           ttl_window_s: float = 1800.0, ttl_sweep_s: float = 10.0, top_k: int = 16) -> float:
    """Token hit rate of `policy` (POLICIES or ABLATIONS) at `capacity_blocks` over the trace."""
    ct = trace if isinstance(trace, Compiled) else compile_trace(trace)
    if policy in ("FIFO", "LRU"):
        return _replay_ordered(ct, capacity_blocks, lru=policy == "LRU")
    if policy == "Adaptive":
        return _replay_adaptive(ct, capacity_blocks)
    if policy == "LRU-chain":
        return _replay_lcs(ct, capacity_blocks, recency_only=True)
    if policy in ("LCS", "LCS+TTL", "LCS-no-decay", "LCS-no-decay-no-reset", "LCS-reset", "LCS-no-chain"):
        return _replay_lcs(ct, capacity_blocks, ttl=policy == "LCS+TTL",
                           reset=policy in ("LCS-no-decay", "LCS-reset"),
                           hit_decay="none" if policy.startswith("LCS-no-decay") else "online",
                           chain=policy != "LCS-no-chain", ttl_period_s=ttl_period_s, ttl_window_s=ttl_window_s,
                           ttl_sweep_s=ttl_sweep_s, top_k=top_k)
    raise ValueError(f"unknown policy {policy!r}; expected one of {POLICIES + ABLATIONS}")


def _replay_ordered(ct: Compiled, capacity: int, *, lru: bool) -> float:
    cache: OrderedDict[int, None] = OrderedDict()
    move = cache.move_to_end
    hit_tokens = 0
    for ids, toks in zip(ct.block_lists, ct.token_lists):
        prefix = True
        for b, t in zip(ids, toks):
            if b in cache:
                if prefix:
                    hit_tokens += t
                if lru:
                    move(b)
            else:
                prefix = False
                if capacity > 0:
                    if len(cache) >= capacity:
                        cache.popitem(last=False)
                    cache[b] = None
    total = int(ct.input_tokens.sum())
    return hit_tokens / total if total else 0.0


class _OrderedCache:
    """The FIFO / LRU cache of the replay, one request at a time (`step`, same contract as `_LcsCache`)."""

    def __init__(self, ct: Compiled, capacity: int, *, lru: bool) -> None:
        self.ct, self.capacity, self.lru = ct, capacity, lru
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.stored: list[int] = []
        self.evicted: list[int] = []

    def __contains__(self, block: int) -> bool:
        return block in self.cache

    def step(self, r: int) -> float:
        cache, capacity = self.cache, self.capacity
        self.stored, self.evicted = [], []
        hit_tokens = 0
        prefix = True
        for b, t in zip(self.ct.block_lists[r], self.ct.token_lists[r]):
            if b in cache:
                if prefix:
                    hit_tokens += t
                if self.lru:
                    cache.move_to_end(b)
            else:
                prefix = False
                if capacity > 0:
                    if len(cache) >= capacity:
                        self.evicted.append(cache.popitem(last=False)[0])
                    cache[b] = None
                    self.stored.append(b)
        return float(hit_tokens)


def _replay_adaptive(ct: Compiled, capacity: int, *, half_life_turnovers: float = adaptive.HALF_LIFE_TURNOVERS,
                     margin: float = adaptive.LEAD_MARGIN, trace_leader: list[int] | None = None) -> float:
    """LRU / LCS chosen online by shadow caches: the cache-manager's live policy (adaptive.py), replayed.

    Two shadow caches of the same capacity, one LRU (`_OrderedCache`) and one LCS (`_LcsCache`), see every
    request; `adaptive.Duel` compares the tokens each hit where they disagree and names the leader. The real
    cache is an LCS index (`_LcsCache`, prefix chains, leaves first) whose eviction order is the leader's
    (`CacheIndex.set_order`: lowest LCS score, or least recently accessed), exactly as the service orders a
    pool's index. `trace_leader`, when given, receives the leader (0 LRU, 1 LCS) in force at each request.
    """
    lru, lcs = _OrderedCache(ct, capacity, lru=True), _LcsCache(ct, capacity)
    real = _LcsCache(ct, capacity)
    duel = adaptive.Duel(half_life_turnovers=half_life_turnovers, margin=margin)
    real.index.set_order(adaptive.ORDERS[duel.leader])
    hit_tokens = 0.0
    offsets = ct.offsets
    for r in range(len(ct.times_s)):
        if trace_leader is not None:
            trace_leader.append(duel.leader)
        got = real.step(r)
        hit_tokens += got
        if duel.observe(lru.step(r), lcs.step(r), int(offsets[r + 1] - offsets[r]), capacity, got):
            real.index.set_order(adaptive.ORDERS[duel.leader])
    total = float(ct.input_tokens.sum())
    return hit_tokens / total if total else 0.0


class _Recency(CacheIndex):
    """Ablation: the LCS machinery with a score of 1/Age (LRU order, prefix chain and leaves first)."""

    def _numerator(self, slots: np.ndarray, *, reset: bool = False) -> np.ndarray:
        return np.full(len(slots), float(BLOCK_TOKENS))

    def _truncated_value(self, s: int) -> float:
        return 1.0


def _replay_lcs(ct: Compiled, capacity: int, **opts: object) -> float:
    cache = _LcsCache(ct, capacity, **opts)  # type: ignore[arg-type]
    hit_tokens = 0.0
    for r in range(len(ct.times_s)):
        hit_tokens += cache.step(r)
    total = float(ct.input_tokens.sum())
    return hit_tokens / total if total else 0.0


class _LcsCache:
    """The LCS cache of the replay, one request at a time (`step`); after a step, `stored` and `evicted`
    hold the dense block ids it stored and dropped (the adaptive policy follows them)."""

    def __init__(self, ct: Compiled, capacity: int, *, ttl: bool = False, reset: bool = False, chain: bool = True,
                 hit_decay: str | float = "online", recency_only: bool = False, ttl_period_s: float = 600.0,
                 ttl_window_s: float = 1800.0, ttl_sweep_s: float = 10.0, top_k: int = 16) -> None:
        cls = _Recency if recency_only else CacheIndex
        if recency_only:
            reset, hit_decay = True, "none"
        self.ct, self.capacity, self.ttl, self.chain = ct, capacity, ttl, chain
        self.ttl_period_s, self.ttl_window_s, self.ttl_sweep_s, self.top_k = ttl_period_s, ttl_window_s, \
            ttl_sweep_s, top_k
        self.index = cls(truncation_reset=reset, hit_decay=hit_decay, initial_capacity=max(ct.n_blocks, 16))
        self.index.ensure_capacity(ct.n_blocks)
        self.live = self.index.key_hash  # non-zero = cached (slot = dense block id)
        self._size = np.full(1, float(BLOCK_TOKENS))
        self._ttl_by_group = np.empty(0)
        self._residual: float | None = None
        self._next_ttl_s = float(ct.times_s[0]) + ttl_period_s if len(ct.times_s) else 0.0
        self._next_sweep_s = self._next_ttl_s
        self.stored: np.ndarray = np.empty(0, dtype=np.int64)
        self.evicted: np.ndarray = np.empty(0, dtype=np.int64)

    def __contains__(self, block: int) -> bool:
        return bool(self.live[block] != 0)

    def step(self, r: int) -> float:
        """Serve request `r`: hit tokens of its cached prefix; then store its missing blocks (evicting)."""
        ct, index, capacity = self.ct, self.index, self.capacity
        self.stored = self.evicted = np.empty(0, dtype=np.int64)
        now = float(ct.times_s[r])
        a, b = int(ct.offsets[r]), int(ct.offsets[r + 1])
        if a == b:
            return 0.0
        ids = ct.blocks[a:b]
        index.observe_accesses(ids, now)
        expired = np.empty(0, dtype=np.int64)
        if self.ttl:
            if now >= self._next_ttl_s:
                self._ttl_by_group, self._residual = _compute_ttls(
                    ct.window_stats(r, self.ttl_window_s, self.top_k), capacity, self.ttl_window_s, ct.group_names)
                self._next_ttl_s = now + self.ttl_period_s
            if now >= self._next_sweep_s and (len(self._ttl_by_group) or self._residual is not None):
                expired = _expire(index, now, self._ttl_by_group, self._residual)
                self._next_sweep_s = now + self.ttl_sweep_s
        present = self.live[ids] != 0
        first_miss = int(np.argmin(present)) if not present.all() else len(ids)
        hit_tokens = 0.0
        if first_miss:
            hit = ids[:first_miss]
            ht = ct.tokens[a:a + first_miss]
            hit_tokens = float(ht.sum())
            index.hit_slots(hit, hit_tokens=ht, now_s=now)
        self.evicted = expired
        if first_miss == len(ids):
            return hit_tokens
        rest_present = present[first_miss:]
        later = ids[first_miss:][rest_present]
        if len(later):
            index.touch_slots(later, now)
        miss_pos = first_miss + np.flatnonzero(~rest_present)
        if capacity <= 0:
            return hit_tokens
        need = len(miss_pos) - (capacity - len(index))
        if need > 0:
            victims = index.choose_victims(need, now, exclude=ids[present])
            index.remove_slots(victims)
            self.evicted = np.concatenate([expired, victims]) if len(expired) else victims
        room = capacity - len(index)
        if room <= 0:
            return hit_tokens
        miss_pos = miss_pos[:room]
        new = ids[miss_pos]
        par = ct.parents[a + miss_pos] if self.chain else np.full(len(new), -1)
        index.store_slots(new, tokens=ct.tokens[a + miss_pos], size_bytes=np.broadcast_to(self._size, len(new)),
                          now_s=now, parents=par,
                          group=int(ct.groups[r]) if int(ct.groups[r]) < 0xFFFF else None)
        self.stored = new
        return hit_tokens


def _expire(index: CacheIndex, now: float, ttl_by_group: np.ndarray, residual: float | None) -> np.ndarray:
    """Delete entries idle past their group's TTL (returns their slots); an expired entry with a live
    unexpired child stays (its child needs it as prefix), so chains are only cut from the leaves."""
    expired = index.expired(now, ttl_by_group, residual)
    if not len(expired):
        return np.empty(0, dtype=np.int64)
    n = index._n
    removable = np.zeros(n, dtype=np.bool_)
    removable[expired] = True
    live = index.key_hash[:n] != 0
    par = index.parent[:n].astype(np.int64)
    for _ in range(64):
        keep_parent = par[live & ~removable & (par >= 0)]
        blocked = removable[keep_parent]
        if not blocked.any():
            break
        removable[keep_parent[blocked]] = False
    gone = np.flatnonzero(removable)
    index.remove_slots(gone)
    return gone


def _compute_ttls(stats: list[group_ttl.GroupStats], capacity: int, window_s: float,
                  group_names: list[str]) -> tuple[np.ndarray, float | None]:
    """Group TTLs from the window's statistics: (TTL per dense group id, residual TTL); Kareto Algorithm 2.

    Budget: the cache holds `capacity` blocks for the whole window (block-seconds). One SLSQP start from
    the scaled ROI point (the multi-start of the service is skipped to keep the replay fast).
    """
    if not stats:
        return np.empty(0), None
    sol = group_ttl.solve(stats, budget=float(capacity) * window_s, max_ttl_s=window_s, time_budget_s=0.0,
                          maxiter=50)
    by_id = sol.by_id()
    residual = by_id.pop(group_ttl.RESIDUAL)
    table = np.full(len(group_names), residual)
    index_of = {name: i for i, name in enumerate(group_names)}
    for sub, t in by_id.items():
        if sub in index_of:
            table[index_of[sub]] = t
    return table, residual


def hit_rate_table(trace: list[Request], fractions: list[float], policies: Iterable[str] = POLICIES,
                   **kwargs: object) -> dict[str, list[float]]:
    """Token hit rate per policy at each capacity fraction of the trace's unique blocks."""
    ct = compile_trace(trace)
    out: dict[str, list[float]] = {}
    for policy in policies:
        out[policy] = [
            round(replay(ct, policy, max(1, int(round(f * ct.n_blocks))), **kwargs), 6)  # type: ignore[arg-type]
            for f in fractions
        ]
    return out
