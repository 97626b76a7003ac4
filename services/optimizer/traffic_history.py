"""Fetching each cache-planned pool's recorded traffic for the replay (Kareto's "a recent window of the pool's
own traffic"): done where the planner gathers its inputs, only when a solver asks for it
(``wants_traffic_history``).

For every pool that declares a cache limit, the first window that holds at least ``replay_trace.MIN_REQUESTS``
requests, in this order: the planned hour's same hour yesterday, the same hour last week, then the most recent
hour with recorded accesses (the cache-manager's GetAccessWindow says when the newest one was). The window's
mean output tokens per request come from the forecaster's load history of that hour (GetPoints of the pool's
output-token and request series); without them, the pool's declared ``mean_output_tokens``, else 250. A pool
with no usable window gets no trace (the solver then replays its synthetic shape and says so).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.optimizer.replay_trace import ReplayTrace, build_trace
from greenserve.v1 import (
    cache_manager_pb2,
    cache_manager_pb2_grpc,
    common_pb2,
    forecaster_pb2,
    forecaster_pb2_grpc,
)

log = logging.getLogger("greenserve.optimizer.traffic_history")

HOUR_S = 3600
DEFAULT_OUTPUT_TOKENS = 250.0
WINDOW_LIMIT = 20_000  # accesses per window (GetAccessWindow's maximum)


def _hour_text(start_s: float) -> str:
    a = datetime.fromtimestamp(start_s, UTC)
    b = datetime.fromtimestamp(start_s + HOUR_S, UTC)
    return f"{a:%Y-%m-%d %H:%M}-{b:%H:%M} UTC"


def timestamp_of(seconds: float) -> Timestamp:
    return Timestamp(seconds=int(seconds))


async def _mean_output_tokens(forecaster: forecaster_pb2_grpc.ForecasterServiceStub | None, pool: common_pb2.Pool,
                              start_s: float, timeout_s: float) -> tuple[float, str]:
    """Mean output tokens per request in the hour from ``start_s`` (forecaster load history), else a default."""
    fallback = (float(pool.mean_output_tokens), "the pool's declared mean") if pool.mean_output_tokens else \
        (DEFAULT_OUTPUT_TOKENS, "the default")
    if forecaster is None:
        return fallback
    key = pool.load_series_key or pool.name
    values = []
    for unit in (common_pb2.UNIT_OUTPUT_TOKENS_PER_S, common_pb2.UNIT_REQUESTS_PER_S):
        request = forecaster_pb2.GetPointsRequest(series=common_pb2.SeriesRef(
            kind=common_pb2.SERIES_KIND_LOAD, key=key, unit=unit), start=timestamp_of(start_s),
            end=timestamp_of(start_s + HOUR_S))
        try:
            reply = await forecaster.GetPoints(request, timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return fallback
        values.append(sum(p.value for p in reply.points))
    if values[0] > 0 and values[1] > 0:
        return values[0] / values[1], "the forecaster's load history of that hour"
    return fallback


async def _window(stub: cache_manager_pb2_grpc.CacheManagerServiceStub, pool: str, start_s: float,
                  timeout_s: float) -> cache_manager_pb2.GetAccessWindowResponse:
    return await stub.GetAccessWindow(cache_manager_pb2.GetAccessWindowRequest(
        pool=pool, start=timestamp_of(start_s), end=timestamp_of(start_s + HOUR_S), limit=WINDOW_LIMIT),
        timeout=timeout_s)


async def pool_trace(stub: cache_manager_pb2_grpc.CacheManagerServiceStub,
                     forecaster: forecaster_pb2_grpc.ForecasterServiceStub | None, pool: common_pb2.Pool,
                     planned_start_s: float, timeout_s: float = 5.0) -> tuple[ReplayTrace | None, str]:
    """The first usable window of one pool (module doc) and, when there is none, why."""
    tried: list[str] = []
    candidates = [("yesterday", "same hour yesterday", planned_start_s - 86400.0),
                  ("last_week", "same hour last week", planned_start_s - 7 * 86400.0)]
    latest_s: float | None = None
    i = 0
    while i < len(candidates):
        source, name, start = candidates[i]
        i += 1
        reply = await _window(stub, pool.name, start, timeout_s)
        if reply.HasField("latest_time") and latest_s is None:
            latest_s = reply.latest_time.seconds
            recent = latest_s // HOUR_S * HOUR_S
            if all(abs(recent - c[2]) >= 1 for c in candidates):
                candidates.append(("recent", "the most recent hour with recorded accesses", float(recent)))
        label = f"{name} ({_hour_text(start)})"
        if not reply.accesses:
            tried.append(f"{label}: none recorded")
            continue
        mean_out, out_source = await _mean_output_tokens(forecaster, pool, start, timeout_s)
        capped = f", the hour's first {len(reply.accesses)} accesses (capped)" if reply.capped_hours or \
            reply.truncated else ""
        trace = build_trace(pool.name, source, label + capped, start, reply.accesses,
                            mean_output_tokens=mean_out, output_source=out_source)
        if trace is not None:
            return trace, ""
        tried.append(f"{label}: too few requests")
    return None, "; ".join(tried) if tried else "no window tried"


async def fetch_traces(channel: grpc.aio.Channel | None, forecaster: forecaster_pb2_grpc.ForecasterServiceStub | None,
                       fleet: common_pb2.FleetInventory,
                       planned_start_s: float, notes: list[str],
                       timeout_s: float = 5.0) -> tuple[dict[str, ReplayTrace], dict[str, str]]:
    """Per cache-planned pool, its replay trace, or why it has none (module doc)."""
    pools = [p for p in fleet.pools if (p.max_cache_dram_bytes or p.max_cache_disk_bytes) and p.engines]
    if not pools:
        return {}, {}
    if channel is None:
        return {}, {p.name: "no cache-manager configured" for p in pools}
    stub = cache_manager_pb2_grpc.CacheManagerServiceStub(channel)
    results = await asyncio.gather(*(pool_trace(stub, forecaster, p, planned_start_s, timeout_s) for p in pools),
                                   return_exceptions=True)
    traces: dict[str, ReplayTrace] = {}
    missing: dict[str, str] = {}
    for pool, result in zip(pools, results):
        if isinstance(result, grpc.aio.AioRpcError):
            missing[pool.name] = f"cache-manager {result.code().name} on GetAccessWindow"
        elif isinstance(result, BaseException):
            log.warning("access history of pool %s: %s: %s", pool.name, type(result).__name__, result)
            missing[pool.name] = f"{type(result).__name__} reading its access history"
        elif result[0] is not None:
            traces[pool.name] = result[0]
        else:
            missing[pool.name] = result[1]
    if any(m.startswith("cache-manager ") for m in missing.values()):
        notes.append("cache-manager did not answer GetAccessWindow: cache tiers scored on the synthetic shape")
    return traces, missing
