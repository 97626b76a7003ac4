"""vLLM-named Prometheus metrics of one emulated engine, exposed with prometheus_client.

The engine updates plain Python numbers on its hot path (one bucket increment per token, no locks,
no label lookups); a custom collector turns them into metric families when ``/metrics`` is scraped.
Names, types, labels (``model_name``, ``engine``) and histogram buckets follow vLLM V1's
``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``); see vLLM's production-metrics page
(https://docs.vllm.ai, Usage: Production Metrics; design notes in the repository's ``docs/design/metrics.md``).
Counters are declared without the ``_total`` suffix, which the exposition adds, exactly as vLLM declares them.

Latencies are *engine* seconds: wall-clock seconds multiplied by the emulator's ``time_scale``, so a
profiler that runs the emulator 10x faster still scrapes the latencies the modelled engine would show
(at ``time_scale=1`` they are plain wall-clock seconds, as in vLLM).

KV connector: the emulator models no KV connector (no LMCache tier; its prefix cache is the GPU's, prefix_cache.py),
so ``vllm:external_prefix_cache_queries`` / ``_hits`` stay at 0, as vLLM exports them without a
``kv_transfer_config``: vLLM declares them unconditionally and only a connector's scheduler counts into them.

Two metrics are the emulator's own, not vLLM's: ``greenserve:engine_power_watts`` (gauge, the modelled power of
the step in flight) and ``greenserve:engine_energy_joules_total`` (counter, modelled joules on the modelled
clock), from the simulator's power model; a profiler without NVML reads its power from them.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

# vLLM V1 bucket boundaries (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS_S: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class FastHistogram:
    """Cumulative histogram kept as plain counts; ``observe_many`` adds n equal observations at once."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # last slot is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Add one observation."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_many(self, value: float, n: int) -> None:
        """Add ``n`` observations of the same value (all requests of one decode step)."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n

    @property
    def count(self) -> int:
        """Number of observations."""
        return sum(self.counts)

    def family(self, name: str, doc: str, labels: list[str], values: list[str]) -> HistogramMetricFamily:
        """The histogram as a prometheus_client metric family (cumulative buckets)."""
        fam = HistogramMetricFamily(name, doc, labels=labels)
        cumulative, running = [], 0
        for bound, n in zip((*(repr(float(b)) for b in self.bounds), "+Inf"), self.counts, strict=True):
            running += n
            cumulative.append((bound, running))
        fam.add_metric(values, cumulative, self.sum)
        return fam


class EngineMetrics:
    """Counters, gauges and histograms of one engine; the engine mutates the attributes directly."""

    def __init__(self, model_name: str, engine_index: int = 0) -> None:
        self.model_name = model_name
        self.engine_index = engine_index
        self.num_requests_running = 0
        self.num_requests_waiting = 0
        self.kv_cache_usage_perc = 0.0
        self.prefix_cache_queries_tokens = 0
        self.prefix_cache_hits_tokens = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.num_preemptions = 0
        #: finished requests by finish reason ("stop", "length", "abort", "error"; "repetition" is exported at 0)
        self.request_success: dict[str, int] = {}
        self.ttft = FastHistogram(TTFT_BUCKETS_S)
        self.itl = FastHistogram(ITL_BUCKETS_S)
        #: vLLM's per-request TPOT, observed when a request finishes; vLLM gives it the inter-token latency buckets
        self.request_tpot = FastHistogram(ITL_BUCKETS_S)
        self.e2e = FastHistogram(REQUEST_LATENCY_BUCKETS_S)
        self.queue_time = FastHistogram(REQUEST_LATENCY_BUCKETS_S)
        self.block_size_tokens = 0
        self.num_gpu_blocks = 0
        #: modelled power of the step in flight (idle power between steps), watts
        self.engine_power_w = 0.0
        #: modelled energy since the engine started, joules (the engine sets it; read when scraped)
        self.energy_j: Callable[[], float] = lambda: 0.0
        #: sleep mode: 0 awake, 1 weights offloaded, 2 everything discarded (vllm:engine_sleep_state)
        self.sleep_level = 0

    def registry(self) -> CollectorRegistry:
        """A registry holding only this engine's metrics (several engines may share a process)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        return registry


class _Collector(Collector):
    def __init__(self, m: EngineMetrics) -> None:
        self._m = m

    def collect(self) -> Iterator[Metric]:
        m = self._m
        labels = ["model_name", "engine"]
        values = [m.model_name, str(m.engine_index)]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            fam = GaugeMetricFamily(name, doc, labels=labels)
            fam.add_metric(values, value)
            return fam

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            fam = CounterMetricFamily(name, doc, labels=labels)
            fam.add_metric(values, value)
            return fam

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", m.num_requests_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", m.num_requests_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", m.kv_cache_usage_perc)
        sleep_state = GaugeMetricFamily(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            labels=[*labels, "sleep_state"],
        )
        for level, state in enumerate(("awake", "weights_offloaded", "discard_all")):
            sleep_state.add_metric([*values, state], 1.0 if m.sleep_level == level else 0.0)
        yield sleep_state
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            m.prefix_cache_queries_tokens,
        )
        yield counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", m.prefix_cache_hits_tokens
        )
        # vLLM counts into these only with a KV connector, which the emulator does not model: 0, as vLLM shows them
        yield counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of "
            "queried tokens.",
            0,
        )
        yield counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached "
            "tokens.",
            0,
        )
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", m.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", m.generation_tokens)
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", m.num_preemptions)
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.", labels=[*labels, "finished_reason"]
        )
        # vLLM exports every finish reason from the start, at 0 until one happens ("error" and "repetition" too:
        # FinishReason in vllm/v1/engine/__init__.py); the emulator ends requests by stop, length, abort or error
        for reason in sorted({"stop", "length", "abort", "error", "repetition", *m.request_success}):
            success.add_metric([*values, reason], m.request_success.get(reason, 0))
        yield success
        yield m.ttft.family("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels, values)
        yield m.itl.family("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", labels, values)
        yield m.request_tpot.family(
            "vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
            labels, values,
        )
        yield m.e2e.family(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", labels, values
        )
        yield m.queue_time.family(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", labels, values
        )
        # not vLLM's: the modelled power (simulator performance model) a profiler uses when it has no NVML
        yield gauge("greenserve:engine_power_watts",
                    "Modelled power of the engine: the step in flight, idle power between steps (watts).",
                    m.engine_power_w)
        yield counter("greenserve:engine_energy_joules",
                      "Modelled energy the engine drew since it started, on its modelled clock (joules).", m.energy_j())
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "enable_prefix_caching", "num_gpu_blocks"],
        )
        info.add_metric([str(m.block_size_tokens), "True", str(m.num_gpu_blocks)], 1.0)
        yield info
