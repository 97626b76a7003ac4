"""Reading a vLLM engine's Prometheus ``/metrics``: current and older metric names.

vLLM renamed metrics between releases (``gpu_cache_usage_perc`` -> ``kv_cache_usage_perc`` and
``gpu_prefix_cache_*`` -> ``prefix_cache_*`` in 0.9; see vllm PR #30041 and the metric-rename breakages of
production-stack #617, GIE PR #1905). Each quantity here lists its names newest first; the first one
present wins, so an engine of either generation reads the same. Values are summed over the ``engine``
label (data-parallel ranks of one server); KV usage, a fraction, is averaged instead.

The text is parsed with prometheus_client's parser, after dropping every line that names none of the
wanted metrics: a vLLM page is mostly histogram buckets, and skipping them makes a scrape ~10x cheaper.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# quantity -> sample names, newest first (counters as scraped, with the _total suffix).
METRIC_NAMES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    # histograms: only their _sum and _count (the recent mean is the change of both between scrapes)
    "ttft_sum": ("vllm:time_to_first_token_seconds_sum",),
    "ttft_count": ("vllm:time_to_first_token_seconds_count",),
    "tpot_sum": ("vllm:inter_token_latency_seconds_sum", "vllm:time_per_output_token_seconds_sum"),
    "tpot_count": ("vllm:inter_token_latency_seconds_count", "vllm:time_per_output_token_seconds_count"),
}
_ALL_NAMES = tuple({name for names in METRIC_NAMES.values() for name in names})
_PREFIXES = tuple(sorted({name.removesuffix("_total") for name in _ALL_NAMES}))


@dataclass(frozen=True)
class EngineMetrics:
    """What the router reads from one scrape; None where the engine exposes no such metric."""

    running: float | None = None
    waiting: float | None = None
    kv_usage_fraction: float | None = None
    prefix_queries_tokens: float | None = None
    prefix_hits_tokens: float | None = None
    ttft_sum_s: float | None = None
    ttft_count: float | None = None
    tpot_sum_s: float | None = None
    tpot_count: float | None = None


def _relevant(text: str) -> str:
    keep = []
    for line in text.splitlines():
        if line.startswith(_PREFIXES) or (line.startswith("# ") and any(p in line for p in _PREFIXES)):
            keep.append(line)
    return "\n".join(keep) + "\n"


def parse_metrics(text: str) -> EngineMetrics:
    """EngineMetrics from Prometheus text exposition (ValueError on malformed text)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(_relevant(text)):
        for sample in family.samples:
            if sample.name in _ALL_NAMES:
                sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
                counts[sample.name] = counts.get(sample.name, 0) + 1
    for name in METRIC_NAMES["kv_usage"]:  # a fraction: the mean over ranks, not the sum
        if name in sums:
            sums[name] /= counts[name]

    def pick(quantity: str) -> float | None:
        for name in METRIC_NAMES[quantity]:
            if name in sums:
                return sums[name]
        return None

    return EngineMetrics(
        running=pick("running"),
        waiting=pick("waiting"),
        kv_usage_fraction=pick("kv_usage"),
        prefix_queries_tokens=pick("prefix_queries"),
        prefix_hits_tokens=pick("prefix_hits"),
        ttft_sum_s=pick("ttft_sum"),
        ttft_count=pick("ttft_count"),
        tpot_sum_s=pick("tpot_sum"),
        tpot_count=pick("tpot_count"),
    )
