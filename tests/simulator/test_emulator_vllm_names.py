"""The emulator's metric names, and those the router and the profiler read, are vLLM's own.

Tests drive the router and the profiler against the emulator, so a name both sides misspelled would pass them and
fail against a real engine. This pins both sides to vLLM's declarations: the families of
``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``) in vLLM 0.33.0, the newest release on PyPI (the project pins
no vLLM; counters are declared without ``_total``, which the exposition adds), and the names renamed before 0.33
that the readers keep as fallbacks for older engines.
"""

from __future__ import annotations

from greenserve.profiler import engine_metrics
from greenserve.router.routing import scrape
from greenserve.simulator.emulator.metrics import EngineMetrics
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

# family -> type, as vLLM 0.33.0 declares them (the ones the emulator exports or a reader reads)
VLLM_0_33_FAMILIES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:engine_sleep_state": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:external_prefix_cache_queries": "counter",
    "vllm:external_prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:cache_config_info": "gauge",
}
# renamed in 0.9 (gpu_*) and 0.11 (time_per_output_token_seconds), absent from 0.33: fallbacks only
RENAMED_BEFORE_0_33 = {"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries", "vllm:gpu_prefix_cache_hits",
                       "vllm:time_per_output_token_seconds"}


KNOWN = set(VLLM_0_33_FAMILIES) | RENAMED_BEFORE_0_33


def _family(sample_name: str) -> str:
    """The family of a sample name as scraped (``vllm:prompt_tokens_total`` -> ``vllm:prompt_tokens``)."""
    for suffix in ("_total", "_sum", "_count"):
        base = sample_name.removesuffix(suffix)
        if base != sample_name and base in KNOWN:
            return base
    return sample_name


def test_every_vllm_family_the_emulator_exports_is_vllms_with_its_type() -> None:
    text = generate_latest(EngineMetrics("m").registry()).decode()
    exported = {f.name: f.type for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")}
    assert exported, "the emulator exports no vllm: family"
    for name, kind in exported.items():
        assert VLLM_0_33_FAMILIES.get(name) == kind, f"{name} ({kind}) is not a vLLM 0.33 {kind}"


def test_the_router_and_the_profiler_read_vllm_0_33_names_first_and_older_ones_only_after() -> None:
    lists = [names for names in scrape.METRIC_NAMES.values()]
    lists += [names for table in (engine_metrics.COUNTERS, engine_metrics.HISTOGRAMS, engine_metrics.GAUGES)
              for names in table.values()]
    for names in lists:
        vllm_names = [n for n in names if n.startswith("vllm:")]
        if not vllm_names:
            continue
        assert _family(vllm_names[0]) in VLLM_0_33_FAMILIES, f"{names}: the first name is not vLLM 0.33's"
        for name in vllm_names[1:]:
            assert _family(name) in KNOWN, name


# bucket bounds as vLLM 0.33.0 gives them (vllm/v1/metrics/buckets.py; request_time_per_output_token_seconds takes the
# inter_token_latency family's), for the histograms the emulator exports
_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                    480.0, 960.0, 1920.0, 7680.0)
VLLM_0_33_BUCKETS = {
    "vllm:time_to_first_token_seconds": (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                                         5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
    "vllm:inter_token_latency_seconds": _ITL,
    "vllm:request_time_per_output_token_seconds": _ITL,
    "vllm:e2e_request_latency_seconds": _REQUEST_LATENCY,
    "vllm:request_queue_time_seconds": _REQUEST_LATENCY,
}
# vLLM 0.33's label names: [model_name, engine] on every per-engine family, plus finished_reason on request_success
# (cache_config_info, an info gauge labelled by the CacheConfig's fields, is left out)
VLLM_0_33_EXTRA_LABELS = {"vllm:request_success": {"finished_reason"}, "vllm:engine_sleep_state": {"sleep_state"}}


def test_the_emulator_exports_the_first_vllm_name_every_reader_tries() -> None:
    """The router and the profiler read from the emulator the families they read from vLLM 0.33 (the per-request
    TPOT, the KV connector's external_prefix_cache counters), not a fallback the real engine never reaches."""
    text = generate_latest(EngineMetrics("m").registry()).decode()
    exported = {f.name for f in text_string_to_metric_families(text)}
    lists = [names for names in scrape.METRIC_NAMES.values()]
    lists += [names for table in (engine_metrics.COUNTERS, engine_metrics.HISTOGRAMS, engine_metrics.GAUGES)
              for names in table.values()]
    for names in lists:
        vllm_names = [n for n in names if n.startswith("vllm:")]
        if vllm_names:
            assert _family(vllm_names[0]) in exported, f"{names}: the emulator does not export {vllm_names[0]}"


def test_the_emulators_vllm_histograms_have_vllms_buckets_and_every_family_vllms_labels() -> None:
    text = generate_latest(EngineMetrics("m").registry()).decode()
    families = {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")}
    for name, bounds in VLLM_0_33_BUCKETS.items():
        les = [s.labels["le"] for s in families[name].samples if s.name == f"{name}_bucket"]
        assert les == [*(repr(float(b)) for b in bounds), "+Inf"], name
    for name, family in families.items():
        if name == "vllm:cache_config_info":
            continue
        for sample in family.samples:
            labels = set(sample.labels) - {"le"}
            assert labels == {"model_name", "engine"} | VLLM_0_33_EXTRA_LABELS.get(name, set()), (name, labels)
