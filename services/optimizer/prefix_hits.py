"""Each pool's measured prefix-hit fraction for the live planner: the fraction of prompt tokens found in the prefix
cache over the last hour, the same quantity ``greenserve evaluate`` feeds its planner (services/evaluation/day.py:
prompt tokens found in a cache tier / prompt tokens, of the window replayed last, "what the cache-manager sees").

Source: the cache-manager's access history (GetAccessWindow of ``[now - WINDOW_S, now)``), which the router fills
through ReportAccesses, one HIT (its ``hit_tokens``) or MISS and the STORE of the whole prompt per request
(services/router/accounting/feeds.py). The requests are paired from those records as the replay traces pair them
(``replay_trace.paired_requests``). The hits are what the router's prefix index matched on the engine it chose, so a
prefix the engine evicted still counts as a hit here; vLLM's own counters (``vllm:prefix_cache_hits`` /
``vllm:prefix_cache_queries``) stay with the router's scrapes and are not read by the optimizer.

Bounds: at most ``WINDOW_LIMIT`` accesses per pool (the cache-manager also records at most its
``--access-history-per-hour`` first accesses of an hour); a pool with fewer than ``MIN_REQUESTS`` requests in the
window gets no figure and is planned with no prefix reuse, and the plan's notes say so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import grpc
from greenserve.optimizer import capacity, replay_trace
from greenserve.optimizer.traffic_history import WINDOW_LIMIT, timestamp_of
from greenserve.v1 import cache_manager_pb2, cache_manager_pb2_grpc, common_pb2

log = logging.getLogger("greenserve.optimizer.prefix_hits")

WINDOW_S = 3600.0
MIN_REQUESTS = 20
SOURCE = "cache-manager access history (router-reported hits)"


@dataclass(frozen=True)
class PoolHits:
    """One pool's measurement over the window."""

    requests: int
    prompt_tokens: int
    hit_tokens: int
    truncated: bool = False

    @property
    def fraction(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens > 0 else 0.0


def measure(accesses: Iterable[cache_manager_pb2.AccessRecord]) -> PoolHits:
    """Requests, prompt tokens and hit tokens of a window's access records, paired as the replay traces pair them
    (``replay_trace.paired_requests``): a HIT or MISS opens a request, the STORE right after it (same time and
    conversation) gives its whole prompt; a STORE with no HIT or MISS before it (not a routed request) is left out."""
    rows = [r for r in replay_trace.paired_requests(accesses, routed_only=True) if r[3] > 0]
    return PoolHits(len(rows), sum(r[3] for r in rows), sum(min(r[5], r[3]) for r in rows))


async def fetch_hit_fractions(channel: grpc.aio.Channel | None, fleet: common_pb2.FleetInventory, now_s: float,
                              notes: list[str], timeout_s: float = 3.0) -> dict[str, float]:
    """Pool -> prefix-hit fraction over the last hour as predictions take it (``capacity.hit_fraction_step``), for
    the pools with at least ``MIN_REQUESTS`` requests in it; one note per pool says the figure and its source, or
    why there is none."""
    if channel is None or not fleet.pools:
        if fleet.pools:
            notes.append("prefix hits: no cache-manager configured, capacity assumes no prefix reuse")
        return {}
    stub = cache_manager_pb2_grpc.CacheManagerServiceStub(channel)
    start = max(0.0, now_s - WINDOW_S)

    async def one(pool: str) -> cache_manager_pb2.GetAccessWindowResponse | grpc.aio.AioRpcError:
        try:
            return await stub.GetAccessWindow(cache_manager_pb2.GetAccessWindowRequest(
                pool=pool, start=timestamp_of(start), end=timestamp_of(now_s + 1), limit=WINDOW_LIMIT),
                timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            return exc

    names = [p.name for p in fleet.pools]
    replies = await asyncio.gather(*(one(name) for name in names))
    out: dict[str, float] = {}
    failed: dict[str, list[str]] = {}
    for name, reply in zip(names, replies):
        if isinstance(reply, grpc.aio.AioRpcError):
            failed.setdefault(reply.code().name, []).append(name)
            continue
        m = measure(reply.accesses)
        if m.requests < MIN_REQUESTS:
            notes.append(f"prefix hits of pool {name}: {m.requests} request(s) in the last hour in the {SOURCE}, "
                         f"fewer than {MIN_REQUESTS}: no figure, capacity assumes no prefix reuse")
            continue
        stepped = capacity.hit_fraction_step(m.fraction)
        out[name] = stepped
        notes.append(f"prefix hits of pool {name}: {m.fraction:.1%} of prompt tokens ({m.hit_tokens:,} of "
                     f"{m.prompt_tokens:,}, {m.requests:,} requests{', the hour truncated' if reply.truncated else ''})"
                     f" over the last hour, from the {SOURCE}; capacity counts {stepped:.0%}")
    for code, pools in failed.items():
        notes.append(f"prefix hits: cache-manager {code} on GetAccessWindow for pool(s) {', '.join(pools)}, "
                     f"capacity assumes no prefix reuse there")
    return out
