"""Trace replay of cache replacement policies: FIFO, LRU, LCS, LCS + group TTL (token hit rate).

The trace is the Mooncake FAST'25 JSONL layout: one request per line with `timestamp` (ms), `input_length`
(tokens) and `hash_ids` (chained 512-token prefix-block ids). A request's cached prefix is its leading run
of blocks present in the cache (prefix caching: a block after a missing one cannot be reused); the token
hit rate is hit tokens / input tokens (GreenCache Table 3's definition). Every block of the request is
then stored or touched. Capacity counts blocks (entries); all blocks are 512 tokens except a request's last
one, and LCS sizes an entry by its tokens (bytes are proportional).

LCS+TTL: Kareto group TTLs (group_ttl.py) are recomputed every `ttl_period_s` from the accesses of the last
`ttl_period_s`, with a budget of capacity x period block-seconds; when room is needed, entries idle longer
than their group's TTL go first (lowest LCS first), then the LCS choice.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from greenserve.cache_manager import group_ttl
from greenserve.cache_manager.index import CacheIndex

BLOCK_TOKENS = 512
POLICIES = ("FIFO", "LRU", "LCS", "LCS+TTL")


@dataclass(frozen=True)
class Request:
    """One trace request: arrival (s), input tokens, prefix-block ids."""

    time_s: float
    input_tokens: int
    blocks: tuple[int, ...]

    def block_tokens(self, i: int) -> int:
        return min(BLOCK_TOKENS, self.input_tokens - i * BLOCK_TOKENS) if self.input_tokens else BLOCK_TOKENS


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


def _subtree(req: Request) -> str:
    # All Mooncake requests share block 0; the subtree root is the block below the shared root.
    return str(req.blocks[1]) if len(req.blocks) > 1 else str(req.blocks[0]) if req.blocks else ""


def replay(trace: list[Request], policy: str, capacity_blocks: int, *, ttl_period_s: float = 600.0,
           top_k: int = 16, age_basis: str = "access") -> float:
    """Token hit rate of `policy` at `capacity_blocks` over the trace."""
    if policy in ("FIFO", "LRU"):
        return _replay_ordered(trace, capacity_blocks, lru=policy == "LRU")
    if policy in ("LCS", "LCS+TTL"):
        return _replay_lcs(trace, capacity_blocks, ttl=policy == "LCS+TTL", ttl_period_s=ttl_period_s,
                           top_k=top_k, age_basis=age_basis)
    raise ValueError(f"unknown policy {policy!r}; expected one of {POLICIES}")


def _replay_ordered(trace: list[Request], capacity: int, *, lru: bool) -> float:
    cache: OrderedDict[int, None] = OrderedDict()
    hit_tokens = total_tokens = 0
    for req in trace:
        total_tokens += req.input_tokens
        prefix = True
        for i, b in enumerate(req.blocks):
            present = b in cache
            if prefix and present:
                hit_tokens += req.block_tokens(i)
            else:
                prefix = False
            if present:
                if lru:
                    cache.move_to_end(b)
            elif capacity > 0:
                if len(cache) >= capacity:
                    cache.popitem(last=False)
                cache[b] = None
    return hit_tokens / total_tokens if total_tokens else 0.0


def _replay_lcs(trace: list[Request], capacity: int, *, ttl: bool, ttl_period_s: float, top_k: int,
                age_basis: str) -> float:
    index = CacheIndex(age_basis=age_basis, initial_capacity=max(capacity, 16))
    slot_of: dict[int, int] = {}
    block_of_slot = np.full(max(capacity, 16) * 2 + 16, -1, dtype=np.int64)
    stable: dict[str, int] = {}  # subtree -> stable group number stored with the entries
    ttl_by_group = np.empty(0)
    residual_ttl: float | None = None
    window: list[tuple[float, int, str]] = []
    next_ttl_s = trace[0].time_s + ttl_period_s if trace else 0.0
    hit_tokens = total_tokens = 0

    def evict(slots: np.ndarray) -> None:
        for s in slots:
            s = int(s)
            b = int(block_of_slot[s])
            del slot_of[b]
            index.remove_slot(s)

    for req in trace:
        now = req.time_s
        if ttl and now >= next_ttl_s:
            top_ttls, residual_ttl = _compute_ttls(window, capacity, ttl_period_s, top_k)
            ttl_by_group = np.full(len(stable), np.inf if residual_ttl is None else residual_ttl)
            for sub_id, t in top_ttls.items():
                if sub_id in stable:
                    ttl_by_group[stable[sub_id]] = t
            window = []
            next_ttl_s = now + ttl_period_s
        total_tokens += req.input_tokens
        sub = _subtree(req)
        prefix = True
        missing: list[int] = []
        own: list[int] = []
        for i, b in enumerate(req.blocks):
            if ttl:
                window.append((now, b, sub))
            s = slot_of.get(b)
            tokens = req.block_tokens(i)
            if s is not None:
                own.append(s)
                if prefix:
                    hit_tokens += tokens
                    index.hit_slot(s, hit_tokens=tokens, now_s=now)
                else:
                    index.last_access_s[s] = now
            else:
                prefix = False
                missing.append(i)
        if not missing or capacity <= 0:
            continue
        free = capacity - len(slot_of)
        need = len(missing) - free
        if need > 0:
            exclude = np.asarray(own, dtype=np.int64)
            if ttl and (len(ttl_by_group) or residual_ttl is not None):
                expired = index.expired(now, ttl_by_group, residual_ttl)
                if len(exclude):
                    expired = expired[~np.isin(expired, exclude)]
                if len(expired):
                    sc = index.scores(now, expired)
                    chosen = expired[np.argsort(sc, kind="stable")[:need]]
                    evict(chosen)
                    need -= len(chosen)
            if need > 0:
                evict(index.choose_victims(need, now, exclude=exclude))
        room = capacity - len(slot_of)
        g = stable.setdefault(sub, len(stable)) if len(stable) < 0xFFFF else None
        for i in missing[: max(room, 0)]:
            b = req.blocks[i]
            s = index.store(str(b), tokens=req.block_tokens(i), size_bytes=req.block_tokens(i), now_s=now,
                            group=g)
            if s >= len(block_of_slot):
                block_of_slot = np.concatenate([block_of_slot, np.full(len(block_of_slot), -1, dtype=np.int64)])
            block_of_slot[s] = b
            slot_of[b] = s
    return hit_tokens / total_tokens if total_tokens else 0.0


def _compute_ttls(window: list[tuple[float, int, str]], capacity: int, period_s: float,
                  top_k: int) -> tuple[dict[str, float], float | None]:
    """Group TTLs from the window: ({subtree id: TTL} of the top-K groups, residual TTL)."""
    if not window:
        return {}, None
    stats = group_ttl.group_stats(window, top_k)
    sol = group_ttl.solve(stats, budget=float(capacity) * period_s, max_ttl_s=period_s, time_budget_s=0.5)
    by_id = sol.by_id()
    residual = by_id.pop(group_ttl.RESIDUAL)
    return by_id, residual


def hit_rate_table(trace: list[Request], fractions: list[float], policies: Iterable[str] = POLICIES,
                   **kwargs: object) -> dict[str, list[float]]:
    """Token hit rate per policy at each capacity fraction of the trace's unique blocks."""
    n_unique = unique_blocks(trace)
    out: dict[str, list[float]] = {}
    for policy in policies:
        out[policy] = [
            round(replay(trace, policy, max(1, int(round(f * n_unique))), **kwargs), 6)  # type: ignore[arg-type]
            for f in fractions
        ]
    return out
