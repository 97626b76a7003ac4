"""Cache-manager benchmarks: `greenserve bench cache-policy` and `greenserve bench cache-eviction`.

Both print progress to stderr and one JSON object as the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from greenserve.cache_manager import policies, read_or_recompute
from greenserve.cache_manager.index import CacheIndex

DEFAULT_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)


def shared_dir() -> Path:
    """`GREENSERVE_SHARED_DIR`, default `<repo root>/../shared`."""
    env = os.environ.get("GREENSERVE_SHARED_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared"


def default_trace() -> Path:
    return shared_dir() / "data" / "mooncake_fast25" / "conversation_trace.jsonl"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def policy_main(argv: list[str], prog: str = "greenserve bench cache-policy") -> int:
    """Token hit rate of FIFO / LRU / LCS / LCS+TTL at capacities 1 %..100 % of the trace's unique blocks."""
    parser = argparse.ArgumentParser(prog=prog, description=policy_main.__doc__)
    parser.add_argument("--trace", type=Path, default=None, help="JSONL trace (Mooncake layout); default: "
                        "../shared/data/mooncake_fast25/conversation_trace.jsonl")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests (smoke runs)")
    parser.add_argument("--capacities", type=str, default=None,
                        help="comma-separated fractions of unique blocks (default 0.01,...,1.0)")
    parser.add_argument("--ttl-period-s", type=float, default=600.0, help="LCS+TTL recompute period and window")
    parser.add_argument("--top-k", type=int, default=16, help="prefix groups besides the residual (Kareto K)")
    parser.add_argument("--json", action="store_true", help="accepted for symmetry; the last line is always JSON")
    ns = parser.parse_args(argv)
    path = ns.trace or default_trace()
    if not path.is_file():
        parser.error(f"trace file not found: {path}")
    if ns.limit is not None and ns.limit <= 0:
        parser.error("--limit must be positive")
    try:
        fractions = ([float(x) for x in ns.capacities.split(",") if x.strip()] if ns.capacities
                     else list(DEFAULT_FRACTIONS))
    except ValueError:
        parser.error("--capacities must be comma-separated numbers")
    if not fractions or any(not (0 < f <= 1) for f in fractions):
        parser.error("--capacities must be fractions in (0, 1]")
    trace = policies.load_trace(path, ns.limit)
    if not trace:
        parser.error(f"trace {path} has no requests")
    n_unique = policies.unique_blocks(trace)
    _log(f"{len(trace)} requests, {n_unique} unique blocks from {path.name}")
    table: dict[str, list[float]] = {}
    for policy in policies.POLICIES:
        started = time.perf_counter()
        table[policy] = []
        for f in fractions:
            rate = policies.replay(trace, policy, max(1, int(round(f * n_unique))),
                                   ttl_period_s=ns.ttl_period_s, top_k=ns.top_k)
            table[policy].append(round(rate, 6))
        _log(f"{policy}: {table[policy]} ({time.perf_counter() - started:.1f} s)")
    print(json.dumps({"capacities": fractions, "hit_rate": table, "requests": len(trace),
                      "unique_blocks": n_unique}))
    return 0


def _read_recompute_ms(tokens: int, chunk_tokens: int, repeats: int, rng: np.random.Generator) -> dict[str, float]:
    """Time the exact DP (fast paths off) for a `tokens`-token prompt in `chunk_tokens` chunks."""
    n = max(1, tokens // chunk_tokens)
    times = []
    for _ in range(repeats):
        # Profile-like numbers per chunk (StoreLLM Table 6 per-token read costs x chunk, with spread).
        read_s = rng.uniform(0.05e-3, 0.8e-3, n) * chunk_tokens / 16
        read_e = rng.uniform(0.09e-3, 2.6e-3, n) * chunk_tokens
        rec_s = rng.uniform(0.2e-3, 0.6e-3, n) * chunk_tokens / 16
        rec_e = rng.uniform(2e-3, 4e-3, n) * chunk_tokens
        budget = 0.3 * float(np.minimum(read_s, rec_s).sum())
        t0 = time.perf_counter()
        read_or_recompute.decide(read_s, read_e, rec_s, rec_e, delay_budget_s=budget, queue_wait_s=0.0, force_dp=True)
        times.append((time.perf_counter() - t0) * 1e3)
    arr = np.asarray(times)
    return {"prompt_tokens": tokens, "chunk_tokens": chunk_tokens, "chunks": n,
            "decide_ms_p50": round(float(np.percentile(arr, 50)), 3),
            "decide_ms_p99": round(float(np.percentile(arr, 99)), 3)}


def eviction_main(argv: list[str], prog: str = "greenserve bench cache-eviction") -> int:
    """Latency of choosing the lowest-LCS entry over an index of N entries, and index bytes per entry."""
    parser = argparse.ArgumentParser(prog=prog, description=eviction_main.__doc__)
    parser.add_argument("--entries", type=int, default=1_000_000, help="index size (default 1,000,000)")
    parser.add_argument("--choices", type=int, default=200, help="eviction choices timed")
    parser.add_argument("--batch", type=int, default=1, help="victims per choice")
    parser.add_argument("--read-recompute-tokens", type=int, default=32768,
                        help="prompt tokens for the read-or-recompute timing (0 skips it)")
    parser.add_argument("--chunk-tokens", type=int, default=256, help="tokens per chunk (LMCache chunk size)")
    parser.add_argument("--read-recompute-only", action="store_true", help="only time read-or-recompute")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="accepted for symmetry; the last line is always JSON")
    ns = parser.parse_args(argv)
    if ns.entries <= 0 or ns.choices <= 0 or ns.batch <= 0:
        parser.error("--entries, --choices and --batch must be positive")
    if ns.chunk_tokens <= 0 or ns.read_recompute_tokens < 0:
        parser.error("--chunk-tokens must be positive and --read-recompute-tokens non-negative")
    rng = np.random.default_rng(ns.seed)
    result: dict[str, object] = {}
    if not ns.read_recompute_only:
        tracemalloc.start()
        index = CacheIndex(initial_capacity=ns.entries)
        base = tracemalloc.get_traced_memory()[0]
        _log(f"building an index of {ns.entries} entries")
        now = 1_000_000.0
        stored = rng.uniform(0, now, ns.entries)
        tokens = rng.integers(256, 8192, ns.entries)
        hits = rng.poisson(2.0, ns.entries)
        for i in range(ns.entries):
            s = index.store(f"{i:016x}", tokens=int(tokens[i]), size_bytes=int(tokens[i]) * 131072,
                            now_s=float(stored[i]))
            for _ in range(int(hits[i])):
                index.hit_slot(s, hit_tokens=int(tokens[i]), now_s=float(stored[i]) + 1.0)
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        bytes_per_entry = used / ns.entries
        _log(f"index built: {bytes_per_entry:.1f} bytes/entry (numpy arrays {index.array_bytes_per_slot()} B/slot)")
        times = []
        for k in range(ns.choices):
            t = now + k * 0.5
            t0 = time.perf_counter()
            victims = index.choose_victims(ns.batch, t)
            times.append((time.perf_counter() - t0) * 1e3)
            # Evict and re-insert so the index stays at N entries and changes between choices.
            for s in victims:
                index.remove_slot(int(s))
                index.store(f"new-{k}-{int(s)}", tokens=512, size_bytes=512 * 131072, now_s=t)
        arr = np.asarray(times)
        result.update({"entries": ns.entries, "choose_ms_p50": round(float(np.percentile(arr, 50)), 3),
                       "choose_ms_p99": round(float(np.percentile(arr, 99)), 3),
                       "bytes_per_entry": round(bytes_per_entry, 1), "array_bytes_per_slot": index.array_bytes_per_slot(),
                       "batch": ns.batch})
        _log(f"choose: p50 {result['choose_ms_p50']} ms, p99 {result['choose_ms_p99']} ms")
    if ns.read_recompute_tokens:
        rr = _read_recompute_ms(ns.read_recompute_tokens, ns.chunk_tokens, 50, rng)
        _log(f"read-or-recompute: {rr}")
        result["read_or_recompute"] = rr
    print(json.dumps(result))
    return 0
