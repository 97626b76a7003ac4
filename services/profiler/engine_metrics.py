"""What the profiler reads from an engine's Prometheus ``/metrics``: vLLM's current and older names, LMCache's.

A snapshot is taken when the measurement window opens and when it closes; counters and histogram sums are
differenced over the window. Each quantity lists its sample names newest first (vLLM renamed
``gpu_prefix_cache_*`` -> ``prefix_cache_*`` in 0.9 and ``time_per_output_token_seconds`` ->
``inter_token_latency_seconds`` in 0.11; ``request_time_per_output_token_seconds`` is the per-request TPOT);
the first one present wins. Values are summed over labels (engine ranks).

KV-connector (LMCache) hits: vLLM counts them itself, ``vllm:external_prefix_cache_queries`` / ``_hits``
(``vllm/v1/metrics/loggers.py``; the scheduler queries the connector for the prompt tokens the local prefix cache
missed), with any connector. That is the only LMCache figure on vLLM's page in LMCache's multiprocess mode (the
``LMCacheMPConnector`` the gpu-partitioner starts engines with): LMCache's ``lmcache:num_hit_tokens`` /
``num_requested_tokens`` are in-process-mode metrics (``lmcache/observability.py``), on vLLM's page only with a
shared ``PROMETHEUS_MULTIPROC_DIR``; they are read when vLLM's counters saw no connector query.

A KV connector that does not work is told by ``kv_connector_verdict``: LMCache's in-process vLLM connector
(LMCacheConnectorV1) on a CPU build starts, logs "No supported cpu connector found" and stores nothing, silently
(degraded mode); vLLM then keeps asking it for the prompt tokens its own prefix cache missed, and it never has any.
Over a window in which the connector was asked for at least ``DEGRADED_MIN_QUERY_TOKENS`` tokens and served none, the
tier is reported as not working. A working tier asked only for tokens nobody stored yet serves none either, so the
verdict is sound on a window whose prompts the tier was given before the engine's own cache lost them (a restart:
tests/real_engine/test_lmcache_degraded.py, where LMCache's multiprocess connector reads "working").

Power: an engine that models its own power (an emulator) may export ``greenserve:engine_energy_joules`` (counter)
or ``greenserve:engine_power_watts`` (gauge); a real vLLM exports neither, so its power comes from NVML.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

COUNTERS: dict[str, tuple[str, ...]] = {
    "prefix_queries_tokens": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_hits_tokens": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "external_queries_tokens": ("vllm:external_prefix_cache_queries_total",),
    "external_hits_tokens": ("vllm:external_prefix_cache_hits_total",),
    "lmcache_requested_tokens": ("lmcache:num_requested_tokens_total",),
    "lmcache_hit_tokens": ("lmcache:num_hit_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "energy_j": ("greenserve:engine_energy_joules_total",),
}
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "tpot": ("vllm:request_time_per_output_token_seconds", "vllm:inter_token_latency_seconds",
             "vllm:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds",),
}
GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "power_w": ("greenserve:engine_power_watts",),
}


@dataclass
class Snapshot:
    """Summed samples of one scrape: name -> value (histograms as ``<name>_sum`` / ``<name>_count``)."""

    values: dict[str, float] = field(default_factory=dict)

    def pick(self, names: tuple[str, ...]) -> tuple[str, float] | None:
        for name in names:
            if name in self.values:
                return name, self.values[name]
        return None

    def gauge(self, quantity: str) -> float | None:
        found = self.pick(GAUGES[quantity])
        return None if found is None else found[1]


_WANTED = {n for names in (*COUNTERS.values(), *GAUGES.values()) for n in names} | {
    f"{n}{suffix}" for names in HISTOGRAMS.values() for n in names for suffix in ("_sum", "_count")}
_PREFIXES = tuple(sorted({n.removesuffix("_total").removesuffix("_sum").removesuffix("_count") for n in _WANTED}))


def parse(text: str) -> Snapshot:
    """A Snapshot of Prometheus text (ValueError on malformed text). Histogram buckets are skipped."""
    keep = [line for line in text.splitlines()
            if (line.startswith(_PREFIXES) and "_bucket" not in line.split("{")[0])
            or (line.startswith("# ") and any(p in line for p in _PREFIXES))]
    snap = Snapshot()
    for family in text_string_to_metric_families("\n".join(keep) + "\n"):
        for sample in family.samples:
            if sample.name in _WANTED:
                snap.values[sample.name] = snap.values.get(sample.name, 0.0) + float(sample.value)
    return snap


@dataclass
class WindowMetrics:
    """Differences over a window; None where the engine does not export the quantity."""

    ttft_mean_s: float | None = None
    tpot_mean_s: float | None = None
    e2e_mean_s: float | None = None
    prefix_hit_fraction: float | None = None
    lmcache_hit_fraction: float | None = None
    energy_j: float | None = None
    #: the KV connector over the window: kv_connector_verdict's answer
    kv_connector: str = "none"
    names: dict[str, str] = field(default_factory=dict)


PER_REQUEST_TPOT = "vllm:request_time_per_output_token_seconds"


def window(before: Snapshot, after: Snapshot, single_token_requests: int = 0) -> WindowMetrics:
    """What happened between two scrapes. ``single_token_requests``: requests of one output token that finished in
    the window; vLLM observes a TPOT of 0 for each in its per-request histogram (``mean_time_per_output_token`` is 0
    when there is no second token), which would pull the mean down, so they are taken out of its count."""
    out = WindowMetrics()
    for quantity, names in HISTOGRAMS.items():
        for name in names:
            s0, c0 = before.values.get(f"{name}_sum"), before.values.get(f"{name}_count")
            s1, c1 = after.values.get(f"{name}_sum"), after.values.get(f"{name}_count")
            if s1 is None or c1 is None:
                continue
            dc = c1 - (c0 or 0.0)
            if name == PER_REQUEST_TPOT:
                dc -= single_token_requests  # their zeros add nothing to the sum
            if dc > 0:
                setattr(out, f"{quantity}_mean_s", (s1 - (s0 or 0.0)) / dc)
                out.names[quantity] = name
            break

    def delta(quantity: str) -> float | None:
        found = after.pick(COUNTERS[quantity])
        if found is None:
            return None
        name, value = found
        return value - before.values.get(name, 0.0)

    queries, hits = delta("prefix_queries_tokens"), delta("prefix_hits_tokens")
    if queries and hits is not None:
        out.prefix_hit_fraction = hits / queries
    # the connector's hits as a share of all queried prompt tokens, so that it adds to prefix_hit_fraction
    external_queries, external_hits = delta("external_queries_tokens"), delta("external_hits_tokens")
    requested, lm_hits = delta("lmcache_requested_tokens"), delta("lmcache_hit_tokens")
    if external_queries and queries and external_hits is not None:
        out.lmcache_hit_fraction = external_hits / queries
    elif requested and lm_hits is not None:
        out.lmcache_hit_fraction = lm_hits / requested
    out.energy_j = delta("energy_j")
    out.kv_connector = kv_connector_verdict(before, after)
    return out


#: prompt tokens a connector must have been asked for, over a window, before serving none of them means it is broken:
#: 32 of vLLM's 128-token CPU blocks (512 of its 16-token GPU blocks), more than a window of fresh prompts that merely
#: had nothing stored yet would plausibly be asked for without one repeat reaching the connector
DEGRADED_MIN_QUERY_TOKENS = 4096


def kv_connector_verdict(before: Snapshot, after: Snapshot,
                         min_query_tokens: float = DEGRADED_MIN_QUERY_TOKENS) -> str:
    """What the KV connector did between two scrapes: ``"working"`` (it served prefix tokens), ``"degraded"`` (it was
    asked for at least ``min_query_tokens`` and served none: LMCache in degraded mode), ``"unknown"`` (asked for
    fewer, none served), ``"none"`` (never asked: no connector, or no traffic). vLLM's own external-prefix counters
    are used when they moved, else LMCache's in-process ones."""
    for queries_q, hits_q in (("external_queries_tokens", "external_hits_tokens"),
                              ("lmcache_requested_tokens", "lmcache_hit_tokens")):
        found = after.pick(COUNTERS[queries_q])
        if found is None:
            continue
        queries = found[1] - before.values.get(found[0], 0.0)
        if queries <= 0:
            continue
        hits_found = after.pick(COUNTERS[hits_q])
        hits = 0.0 if hits_found is None else hits_found[1] - before.values.get(hits_found[0], 0.0)
        if hits > 0:
            return "working"
        return "degraded" if queries >= min_query_tokens else "unknown"
    return "none"
