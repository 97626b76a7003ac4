"""Prometheus scraping: current and older vLLM metric names, DP ranks, bad text."""

from __future__ import annotations

import pytest
from greenserve.router.routing.scrape import parse_metrics

NEW = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 40.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 7.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 7.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.7
"""

OLD = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.75
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{model_name="m"} 9.0
"""


def test_new_names_summed_over_ranks_and_kv_averaged() -> None:
    m = parse_metrics(NEW)
    assert (m.running, m.waiting) == (5.0, 4.0)
    assert m.kv_usage_fraction == pytest.approx(0.375)
    assert (m.prefix_queries_tokens, m.prefix_hits_tokens) == (100.0, 40.0)


def test_old_names_read_the_same() -> None:
    m = parse_metrics(OLD)
    assert m.running == 1.0 and m.kv_usage_fraction == 0.75 and m.prefix_hits_tokens == 9.0
    assert m.prefix_queries_tokens is None


def test_new_name_wins_when_both_are_exposed() -> None:
    both = NEW + 'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.99\n'
    assert parse_metrics(both).kv_usage_fraction == pytest.approx(0.375)


def test_missing_metrics_are_none_and_garbage_raises() -> None:
    assert parse_metrics("# nothing here\n").running is None
    with pytest.raises(ValueError):
        parse_metrics("vllm:num_requests_running{engine=0 oops\n")
