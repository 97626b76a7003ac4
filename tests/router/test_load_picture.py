"""Issue 22, item 5: an engine's load comes from its own metrics (so every replica counts the requests
the others sent), plus this replica's own starts since the scrape; recent TTFT/TPOT from its histograms."""

from __future__ import annotations

from greenserve.router.routing.engines import EngineState
from greenserve.router.routing.scrape import EngineMetrics, parse_metrics

STALE_S = 2.0


def _engine() -> EngineState:
    return EngineState(id="e1", url="http://h:8000", pool="p", model="m")


def test_four_replicas_do_not_each_believe_an_engine_idle() -> None:
    replicas = [_engine() for _ in range(4)]
    for r in replicas:  # each replica sent 3 requests, 1 of them still awaiting its first token
        for _ in range(3):
            r.start_request(0.0, 256)
        r.prefilling = 1
    # the engine reports all 12: 8 running, 4 waiting
    for r in replicas:
        r.apply_metrics(EngineMetrics(running=8, waiting=4), now=10.0)
    a = replicas[0]
    assert a.load(10.1, STALE_S) == 12  # not its own 3
    # the other replicas' 3 queued prefills delay a new request here as much as its own one
    assert a.queue_load(10.1, STALE_S, 0.0) == 1 + 3
    # a burst of this replica's own between two scrapes counts at once
    for _ in range(5):
        a.start_request(10.2, 256)
    a.prefilling += 5
    assert a.load(10.3, STALE_S) == 17
    assert a.queue_load(10.3, STALE_S, 0.0) == 6 + 3
    # stale metrics: only what this replica knows
    assert a.load(20.0, STALE_S) == 8 and a.queue_load(20.0, STALE_S, 0.0) == 6


def test_recent_ttft_and_tpot_are_the_histograms_means_between_scrapes() -> None:
    page = """# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 3
vllm:time_to_first_token_seconds_sum{model_name="m"} %s
vllm:time_to_first_token_seconds_count{model_name="m"} %s
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_sum{model_name="m"} %s
vllm:inter_token_latency_seconds_count{model_name="m"} %s
vllm:num_requests_running{model_name="m"} 2
"""
    e = _engine()
    e.apply_metrics(parse_metrics(page % (1.0, 10, 2.0, 100)), now=1.0)
    assert e.recent_ttft_s == 0.0  # one scrape: no interval yet
    e.apply_metrics(parse_metrics(page % (1.5, 12, 2.5, 150)), now=2.0)
    assert abs(e.recent_ttft_s - 0.25) < 1e-9 and abs(e.recent_tpot_s - 0.01) < 1e-9
    e.apply_metrics(parse_metrics(page % (1.5, 12, 2.5, 150)), now=3.0)  # no request: the last mean stays
    assert abs(e.recent_ttft_s - 0.25) < 1e-9
    assert e.running == 2
