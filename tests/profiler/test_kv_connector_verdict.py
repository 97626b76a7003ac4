"""kv_connector_verdict: a KV connector that is asked for prefix tokens and never has any (LMCache's degraded mode on
a CPU build) is reported as not working; one that serves some is working; too few queries say nothing."""

from __future__ import annotations

from greenserve.profiler import engine_metrics


def page(queries: float, hits: float, local_queries: float = 0.0, local_hits: float = 0.0) -> engine_metrics.Snapshot:
    labels = '{engine="0",model_name="m"}'
    return engine_metrics.parse(
        "# TYPE vllm:external_prefix_cache_queries counter\n"
        f"vllm:external_prefix_cache_queries_total{labels} {queries}\n"
        "# TYPE vllm:external_prefix_cache_hits counter\n"
        f"vllm:external_prefix_cache_hits_total{labels} {hits}\n"
        "# TYPE vllm:prefix_cache_queries counter\n"
        f"vllm:prefix_cache_queries_total{labels} {local_queries}\n"
        "# TYPE vllm:prefix_cache_hits counter\n"
        f"vllm:prefix_cache_hits_total{labels} {local_hits}\n")


def test_queries_growing_with_no_hit_is_degraded_only_past_the_threshold() -> None:
    start = page(1000, 0)
    assert engine_metrics.kv_connector_verdict(start, page(1000 + 4096, 0)) == "degraded"
    assert engine_metrics.kv_connector_verdict(start, page(1000 + 4095, 0)) == "unknown"
    assert engine_metrics.kv_connector_verdict(start, page(1000 + 50_000, 128)) == "working"
    # hits before the window do not make it work now
    assert engine_metrics.kv_connector_verdict(page(0, 640), page(8192, 640)) == "degraded"


def test_no_connector_or_no_traffic_is_none() -> None:
    assert engine_metrics.kv_connector_verdict(page(500, 0), page(500, 0)) == "none"
    bare = engine_metrics.parse('# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total{engine="0"} 10\n')
    assert engine_metrics.kv_connector_verdict(bare, bare) == "none"


def test_lmcaches_in_process_counters_are_read_when_vllms_did_not_move() -> None:
    def lm(requested: float, hit: float) -> engine_metrics.Snapshot:
        return engine_metrics.parse("# TYPE lmcache:num_requested_tokens counter\n"
                                    f"lmcache:num_requested_tokens_total {requested}\n"
                                    "# TYPE lmcache:num_hit_tokens counter\n"
                                    f"lmcache:num_hit_tokens_total {hit}\n")
    assert engine_metrics.kv_connector_verdict(lm(0, 0), lm(5000, 0)) == "degraded"
    assert engine_metrics.kv_connector_verdict(lm(0, 0), lm(5000, 256)) == "working"


def test_the_window_carries_the_verdict_and_a_degraded_tier_adds_no_hits() -> None:
    win = engine_metrics.window(page(0, 0, 0, 0), page(8192, 0, 10_000, 1_808))
    assert win.kv_connector == "degraded"
    assert win.prefix_hit_fraction == 1_808 / 10_000 and win.lmcache_hit_fraction == 0.0
