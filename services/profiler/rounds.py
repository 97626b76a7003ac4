"""Repeated measurements of one point, pooled: interleaved rounds of a sweep on a shared machine.

A sweep in rounds measures every rate once per round (round k, then round k + 1, ...), so that a change in the
machine's load reaches every rate alike instead of some rates of the ladder. One point is then all its rounds'
requests together (``pooled_samples``: exact client-side p50s over many requests), and ``round_spread`` says how
far the rounds were apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from greenserve.profiler.points import RequestSamples

__all__ = ["pooled_samples", "round_spread"]

_FIELDS = ("arrival_s", "ttft_s", "tpot_s", "e2e_s", "output_tokens", "prompt_tokens")


def pooled_samples(rounds: Sequence[RequestSamples]) -> RequestSamples:
    """One point's requests over its rounds. Each round's arrivals are shifted to start at the previous round's
    last completion, so the pooled window spans the rounds' spans added up (throughput and energy per request are
    then those of the rounds together). ValueError when there is no round."""
    if not rounds:
        raise ValueError("rounds: no round to pool")
    parts, offset_s = [], 0.0
    for s in rounds:
        arrival = s.arrival_s - (float(s.arrival_s.min()) if len(s.arrival_s) else 0.0) + offset_s
        parts.append(RequestSamples(arrival_s=arrival, ttft_s=s.ttft_s, tpot_s=s.tpot_s, e2e_s=s.e2e_s,
                                    output_tokens=s.output_tokens, prompt_tokens=s.prompt_tokens))
        done = np.isfinite(s.e2e_s)
        if done.any():
            offset_s = float(np.max((arrival + s.e2e_s)[done]))
        elif len(arrival):
            offset_s = float(arrival.max())
    return RequestSamples(**{f: np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS})


def _p50(values: np.ndarray) -> float | None:
    v = values[np.isfinite(values)]
    return float(np.median(v)) if len(v) else None


def round_spread(rounds: Sequence[RequestSamples]) -> dict[str, Any]:
    """How far one point's rounds are apart, for TTFT and TPOT (keys ``<q>`` = ``ttft_p50_s``, ``tpot_p50_s``):
    ``round_<q>`` each round's p50; ``<q>_round_range`` their range over their median; ``<q>_split_half`` the p50
    of the even rounds' requests pooled against the odd rounds', |difference| over their mean: how reproducible a
    pooled p50 of half the requests is (None with fewer than 2 rounds)."""
    out: dict[str, Any] = {}
    for q, field in (("ttft_p50_s", "ttft_s"), ("tpot_p50_s", "tpot_s")):
        values = [v for v in (_p50(getattr(s, field)) for s in rounds) if v is not None]
        out[f"round_{q}"] = values
        out[f"{q}_round_range"] = ((max(values) - min(values)) / float(np.median(values))
                                   if len(values) > 1 and np.median(values) > 0 else None)
        halves = [_p50(np.concatenate([getattr(s, field) for s in rounds[k::2]])) if rounds[k::2] else None
                  for k in (0, 1)]
        out[f"{q}_split_half"] = (abs(halves[0] - halves[1]) / ((halves[0] + halves[1]) / 2)
                                  if halves[0] and halves[1] else None)
    return out
