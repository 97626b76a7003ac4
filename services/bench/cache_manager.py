"""Cache-manager benchmarks: `greenserve bench cache-policy` and `greenserve bench cache-eviction`.

Both print progress to stderr and one JSON object as the last line of stdout.
"""

from __future__ import annotations

import json
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from greenserve.bench import cache_policies as policies
from greenserve.bench import cache_traces as traces
from greenserve.cache_manager import read_or_recompute
from greenserve.common.cache_index.index import CacheIndex
from greenserve.common.cli_parser import Parser
from greenserve.simulator.workloads import trace_path

DEFAULT_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)
# Hit-decay time constant of the eviction benchmark's index: the online estimate on the Mooncake trace
# (90 % quantile of re-access gaps, 512 s bin; docs/cache_manager.md).
EVICTION_BENCH_TAU_S = 512.0


#: The traces shipped with the package that the policy bench replays by default (names of `trace_path`).
SHIPPED_TRACES = ("mooncake", "azure-conv")


def default_trace() -> Path:
    """The Mooncake FAST'25 conversation trace shipped with the package (greenserve/simulator/data/traces/)."""
    return trace_path("mooncake")


def _trace_file(spec: str) -> Path:
    """A --trace value: a file, or the name of a shipped trace (FileNotFoundError when its file is missing)."""
    path = Path(spec)
    if not path.exists() and spec in SHIPPED_TRACES:
        return trace_path(spec)
    return path


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def policy_main(argv: list[str], prog: str = "greenserve bench cache-policy") -> int:
    """Token hit rate of FIFO / LRU / LCS / LCS+TTL / Adaptive at capacities 1 %..100 % of each trace's
    unique blocks: the shipped Mooncake and Azure traces (or --trace files), GreenCache's workload shapes and
    adversarial ones (scans where LRU wins, skew where LCS wins, a phase change between them)."""
    parser = Parser(prog=prog, description=policy_main.__doc__)
    parser.add_argument("--trace", type=str, action="append", default=None,
                        help="a JSONL trace (Mooncake layout), an Azure LLM inference trace CSV (conversations "
                        "reconstructed: traces.azure_conversations) or a shipped trace by name (mooncake, azure-conv); "
                        "repeatable; default: both shipped traces (greenserve/simulator/data/traces/)")
    parser.add_argument("--shapes", type=str, default=",".join(traces.SHAPES),
                        help=f"comma-separated synthetic trace shapes also replayed ({', '.join(traces.SHAPES)}; "
                        "'none' for none; default all)")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests (smoke runs)")
    parser.add_argument("--capacities", type=str, default=None,
                        help="comma-separated fractions of unique blocks (default 0.01,...,1.0)")
    parser.add_argument("--policies", type=str, default=",".join(policies.POLICIES),
                        help=f"comma-separated policies (default {','.join(policies.POLICIES)})")
    parser.add_argument("--ttl-period-s", type=float, default=600.0, help="LCS+TTL: TTL recompute period")
    parser.add_argument("--ttl-window-s", type=float, default=1800.0, help="LCS+TTL: access window of a recompute")
    parser.add_argument("--top-k", type=int, default=16, help="prefix groups besides the residual (Kareto K)")
    parser.add_argument("--ablations", action="store_true",
                        help=f"also replay {', '.join(policies.ABLATIONS)} on the first trace (key 'ablations')")
    parser.add_argument("--json", action="store_true", help="accepted for symmetry; the last line is always JSON")
    ns = parser.parse_args(argv)
    try:
        paths = [_trace_file(spec) for spec in (ns.trace or list(SHIPPED_TRACES))]
    except FileNotFoundError as exc:  # an install without the package's trace files
        parser.error(str(exc))
    for path in paths:
        if not path.is_file():
            parser.error(f"trace file not found: {path}")
    shapes = [] if ns.shapes.strip() == "none" else [x.strip() for x in ns.shapes.split(",") if x.strip()]
    if any(x not in traces.SHAPES for x in shapes):
        parser.error(f"--shapes must name shapes among {', '.join(traces.SHAPES)} (or 'none')")
    names = [x.strip() for x in ns.policies.split(",") if x.strip()]
    if not names or any(x not in policies.POLICIES for x in names):
        parser.error(f"--policies must name policies among {', '.join(policies.POLICIES)}")
    if ns.limit is not None and ns.limit <= 0:
        parser.error("--limit must be positive")
    if not (ns.ttl_period_s > 0 and ns.ttl_window_s > 0) or ns.top_k < 1:  # NaN is not positive either
        parser.error("--ttl-period-s and --ttl-window-s must be positive, --top-k >= 1")
    try:
        fractions = ([float(x) for x in ns.capacities.split(",") if x.strip()] if ns.capacities
                     else list(DEFAULT_FRACTIONS))
    except ValueError:
        parser.error("--capacities must be comma-separated numbers")
    if not fractions or any(not (0 < f <= 1) for f in fractions):
        parser.error("--capacities must be fractions in (0, 1]")
    started_all = time.perf_counter()
    loaded: list[tuple[str, list[policies.Request]]] = []
    for path in paths:
        azure = path.suffix.lower() == ".csv"
        try:
            trace = traces.azure_conversations(path)[:ns.limit] if azure else policies.load_trace(path, ns.limit)
        except (ValueError, KeyError, TypeError) as exc:  # not JSON lines / CSV rows, or rows without hash_ids
            what = "an Azure LLM inference trace CSV" if azure else "a Mooncake JSONL trace"
            parser.error(f"trace {path}: not {what} ({type(exc).__name__}: {exc})")
        if not trace:
            parser.error(f"trace {path} has no requests")
        loaded.append((f"{path.name} (conversations reconstructed)" if azure else path.name, trace))
    for shape in shapes:
        trace = traces.shape(shape)
        loaded.append((shape, trace[:ns.limit] if ns.limit else trace))

    def run(compiled: policies.Compiled, names: tuple[str, ...] | list[str]
            ) -> tuple[dict[str, list[float]], dict[str, float]]:
        table: dict[str, list[float]] = {}
        seconds: dict[str, float] = {}
        for policy in names:
            started = time.perf_counter()
            table[policy] = [
                round(policies.replay(compiled, policy, max(1, int(round(f * compiled.n_blocks))),
                                      ttl_period_s=ns.ttl_period_s, ttl_window_s=ns.ttl_window_s,
                                      top_k=ns.top_k), 6)
                for f in fractions
            ]
            seconds[policy] = round(time.perf_counter() - started, 2)
            _log(f"  {policy}: {table[policy]} ({seconds[policy]} s)")
        return table, seconds

    per_trace: dict[str, dict[str, object]] = {}
    out: dict[str, object] = {"capacities": fractions}
    for k, (name, trace) in enumerate(loaded):
        compiled = policies.compile_trace(trace)
        _log(f"{name}: {len(trace)} requests, {compiled.n_blocks} unique blocks")
        table, seconds = run(compiled, names)
        entry: dict[str, object] = {"requests": len(trace), "unique_blocks": compiled.n_blocks, "hit_rate": table,
                                    "seconds": seconds}
        if "LRU" in table:
            entry["minus_lru"] = {p: [round(a - b, 6) for a, b in zip(rates, table["LRU"])]
                                  for p, rates in table.items() if p != "LRU"}
        per_trace[name] = entry
        if k == 0:  # the first trace also at the top level (the layout before the shapes were added)
            out.update({"hit_rate": table, "requests": len(trace), "unique_blocks": compiled.n_blocks})
            if ns.ablations:
                out["ablations"], more = run(compiled, policies.ABLATIONS)
                seconds.update(more)
            out["seconds"] = dict(seconds)
    out["traces"] = per_trace
    worst = {p: min(min(e["minus_lru"][p]) for e in per_trace.values())  # type: ignore[index]
             for p in names if p != "LRU" and "LRU" in names}
    if worst:
        out["worst_minus_lru"] = worst
    out["seconds"]["total"] = round(time.perf_counter() - started_all, 2)  # type: ignore[index]
    print(json.dumps(out))
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
    return {"prompt_tokens": tokens, "chunk_tokens": chunk_tokens, "chunks": n, "repeats": repeats,
            "decide_ms_p50": round(float(np.percentile(arr, 50)), 3),
            "decide_ms_p99": round(float(np.percentile(arr, 99)), 3)}


def _lmcache_like_keys(count: int, rng: np.random.Generator) -> list[str]:
    """Entry keys shaped like LMCache objects: 32-byte chunk hash hex @ model @ packed kv_rank @ salt."""
    raw = rng.integers(0, 256, size=(count, 32), dtype=np.uint8)
    return [row.tobytes().hex() + "@meta-llama/Llama-3.1-8B@16777472@" for row in raw]


def eviction_main(argv: list[str], prog: str = "greenserve bench cache-eviction") -> int:
    """Latency of choosing the lowest-LCS entry over an index of N entries, index bytes per entry, and the
    read-or-recompute decision time for a long prompt."""
    parser = Parser(prog=prog, description=eviction_main.__doc__)
    parser.add_argument("--entries", type=int, default=1_000_000, help="index size (default 1,000,000)")
    parser.add_argument("--choices", type=int, default=1000, help="eviction choices timed")
    parser.add_argument("--batch", type=int, default=1, help="victims per choice")
    parser.add_argument("--read-recompute-tokens", type=int, default=32768,
                        help="prompt tokens for the read-or-recompute timing (0 skips it)")
    parser.add_argument("--read-recompute-repeats", type=int, default=200, help="read-or-recompute decisions timed")
    parser.add_argument("--chunk-tokens", type=int, default=256, help="tokens per chunk (LMCache chunk size)")
    parser.add_argument("--read-recompute-only", action="store_true", help="only time read-or-recompute")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="accepted for symmetry; the last line is always JSON")
    ns = parser.parse_args(argv)
    if ns.entries <= 0 or ns.choices <= 0 or ns.batch <= 0 or ns.read_recompute_repeats <= 0:
        parser.error("--entries, --choices, --batch and --read-recompute-repeats must be positive")
    if ns.chunk_tokens <= 0 or ns.read_recompute_tokens < 0:
        parser.error("--chunk-tokens must be positive and --read-recompute-tokens non-negative")
    rng = np.random.default_rng(ns.seed)
    result: dict[str, object] = {}
    if not ns.read_recompute_only:
        n = ns.entries
        keys = _lmcache_like_keys(n, rng)
        now = 1_000_000.0
        stored = rng.uniform(0, now, n)
        tokens = rng.integers(1, 257, n)  # LMCache chunks: 256 tokens, the last one of a prompt shorter
        hits = rng.poisson(2.0, n)
        _log(f"building an index of {n} entries")
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        started = time.perf_counter()
        # A fixed tau (about what the online estimate settles at on Mooncake) so that the timed choices
        # go through the decayed scores; a synthetic index has no access stream to estimate it from.
        index = CacheIndex(initial_capacity=n, hit_decay=EVICTION_BENCH_TAU_S)
        index.store_many(keys, tokens=tokens, size_bytes=256 * 131072 * np.ones(n), now_s=stored, hits=hits)
        build_s = time.perf_counter() - started
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        del keys
        bytes_per_entry = used / n
        assert index.key_of(0).endswith("@16777472@")
        _log(f"index built in {build_s:.1f} s: {bytes_per_entry:.1f} bytes/entry "
             f"(numpy arrays + key table {index.array_bytes_per_slot()} B/slot)")
        times = []
        fresh = _lmcache_like_keys(ns.choices * ns.batch, rng)
        refreshes_before = index.refreshes
        for k in range(ns.choices):
            t = now + k * 0.5
            t0 = time.perf_counter()
            victims = index.choose_victims(ns.batch, t)
            times.append((time.perf_counter() - t0) * 1e3)
            # Evict and re-insert so the index stays at N entries and changes between choices.
            for j, s in enumerate(victims):
                index.remove_slot(int(s))
                index.store(fresh[k * ns.batch + j], tokens=256, size_bytes=256 * 131072, now_s=t)
        arr = np.asarray(times)
        result.update({"entries": n, "choose_ms_p50": round(float(np.percentile(arr, 50)), 3),
                       "choose_ms_p99": round(float(np.percentile(arr, 99)), 3),
                       "choose_ms_max": round(float(arr.max()), 3),
                       "full_passes": index.refreshes - refreshes_before, "choices": ns.choices,
                       "bytes_per_entry": round(bytes_per_entry, 1),
                       "array_bytes_per_slot": index.array_bytes_per_slot(), "batch": ns.batch,
                       "build_s": round(build_s, 2)})
        _log(f"choose: p50 {result['choose_ms_p50']} ms, p99 {result['choose_ms_p99']} ms, "
             f"{result['full_passes']} full passes in {ns.choices} choices")
    if ns.read_recompute_tokens:
        rr = _read_recompute_ms(ns.read_recompute_tokens, ns.chunk_tokens, ns.read_recompute_repeats, rng)
        _log(f"read-or-recompute: {rr}")
        result["read_or_recompute"] = rr
        result["read_or_recompute_ms_p50"] = rr["decide_ms_p50"]
        result["read_or_recompute_ms_p99"] = rr["decide_ms_p99"]
    print(json.dumps(result))
    return 0
