"""Pooling a point's interleaved rounds (scripts/real_engine_profile.py --rounds): the pooled requests, the span
they cover, and the spread between rounds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from greenserve.profiler.points import PointExtras, RequestSamples, summarize
from greenserve.profiler.rounds import pooled_samples, round_spread
from greenserve.v1 import common_pb2


def _round(ttft_s: list[float], tpot_s: list[float], start_s: float = 100.0) -> RequestSamples:
    n = len(ttft_s)
    arrival = start_s + np.arange(n, dtype=float)
    ttft, tpot = np.asarray(ttft_s), np.asarray(tpot_s)
    return RequestSamples(arrival_s=arrival, ttft_s=ttft, tpot_s=tpot, e2e_s=ttft + 9 * tpot,
                          output_tokens=np.full(n, 10.0), prompt_tokens=np.full(n, 100.0))


def test_pooled_rounds_keep_every_request_and_add_up_their_spans() -> None:
    a = _round([0.010, 0.020, 0.030], [0.001, 0.001, 0.001], start_s=50.0)
    b = _round([0.040, 0.050], [0.002, float("nan")], start_s=7.0)  # a failed request stays failed
    pooled = pooled_samples([a, b])
    assert len(pooled.ttft_s) == 5 and int(pooled.completed.sum()) == 4
    # round a: arrivals 0, 1, 2 s, last completion 2.039 s; round b starts there
    assert pooled.arrival_s.tolist() == pytest.approx([0.0, 1.0, 2.0, 2.039, 3.039])
    slo = common_pb2.Slo(ttft_s=1.0, tpot_s=1.0, attainment_fraction=0.9)
    point = summarize(1.0, pooled, slo, PointExtras())
    assert point.requests == 5 and point.failed_requests == 1
    assert point.ttft_p50_s == pytest.approx(0.030)  # exact: the middle of all five requests
    assert point.duration_s == pytest.approx(2.039 + 0.040 + 9 * 0.002)  # the failed last one ends nothing
    with pytest.raises(ValueError, match="rounds"):
        pooled_samples([])


def test_round_spread_is_each_rounds_p50_their_range_and_the_split_halves() -> None:
    rounds = [_round([0.010, 0.012, 0.014], [0.0020] * 3), _round([0.020, 0.022, 0.024], [0.0021] * 3),
              _round([0.012, 0.012, 0.012], [0.0020] * 3)]
    spread = round_spread(rounds)
    assert spread["round_ttft_p50_s"] == pytest.approx([0.012, 0.022, 0.012])
    assert spread["ttft_p50_s_round_range"] == pytest.approx((0.022 - 0.012) / 0.012)
    # even rounds (0, 2) pooled: p50 0.012; odd (1): 0.022
    assert spread["ttft_p50_s_split_half"] == pytest.approx(0.010 / 0.017)
    assert spread["tpot_p50_s_split_half"] == pytest.approx(0.0001 / 0.00205)
    single = round_spread(rounds[:1])
    assert single["ttft_p50_s_round_range"] is None and single["ttft_p50_s_split_half"] is None
    assert math.isclose(single["round_tpot_p50_s"][0], 0.002)
