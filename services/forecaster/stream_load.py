"""Turn the router's load samples (StreamLoad) into hourly load series.

Each sample covers ``window_s`` seconds ending at ``time`` and counts requests and tokens. Samples are summed
per pool and UTC hour together with the seconds they cover; an hour is emitted once a sample of a later hour
arrives, as rate = count / covered seconds (so an hour the router covered only partly is not read as low
load, and an hour with no sample at all stays missing). Three series per pool: requests, input tokens and
output tokens per second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from greenserve.common.errors import InvalidArgument
from greenserve.forecaster.csv_sources import HOUR_S
from greenserve.forecaster.ingest import SeriesKey
from greenserve.v1 import forecaster_pb2

QUANTITIES = ("requests_per_s", "input_tokens_per_s", "output_tokens_per_s")


@dataclass
class _Bucket:
    hour_s: int
    covered_s: float = 0.0
    requests: float = 0.0
    input_tokens: float = 0.0
    output_tokens: float = 0.0


class LoadAccumulator:
    """Per-pool hourly buckets; ``add`` returns the series points of hours that are complete."""

    def __init__(self) -> None:
        self.buckets: dict[str, _Bucket] = {}

    def add(self, sample: forecaster_pb2.StreamLoadRequest, index: int = 0
            ) -> list[tuple[SeriesKey, np.ndarray, np.ndarray]]:
        pool = sample.pool.strip()
        if not pool:
            raise InvalidArgument(f"samples[{index}].pool", "must not be empty")
        if not (math.isfinite(sample.window_s) and 0 < sample.window_s <= HOUR_S):
            raise InvalidArgument(f"samples[{index}].window_s", f"must be in (0, {HOUR_S}]")
        if not sample.HasField("time"):
            raise InvalidArgument(f"samples[{index}].time", "is required")
        end = sample.time.seconds + sample.time.nanos / 1e9
        hour = int((end - sample.window_s / 2) // HOUR_S * HOUR_S)  # the hour holding the window's middle
        out: list[tuple[SeriesKey, np.ndarray, np.ndarray]] = []
        bucket = self.buckets.get(pool)
        if bucket is not None and hour > bucket.hour_s:
            out = self._emit(pool, bucket)
            bucket = None
        if bucket is None:
            bucket = _Bucket(hour)
            self.buckets[pool] = bucket
        elif hour < bucket.hour_s:
            raise InvalidArgument(f"samples[{index}].time", "older than an hour already reported for this pool")
        bucket.covered_s += sample.window_s
        bucket.requests += sample.requests
        bucket.input_tokens += sample.input_tokens
        bucket.output_tokens += sample.output_tokens
        return out

    @staticmethod
    def _emit(pool: str, bucket: _Bucket) -> list[tuple[SeriesKey, np.ndarray, np.ndarray]]:
        covered = min(bucket.covered_s, HOUR_S)
        t = np.array([bucket.hour_s], dtype=np.int64)
        counts = (bucket.requests, bucket.input_tokens, bucket.output_tokens)
        return [(SeriesKey("load", pool, q, q), t, np.array([c / covered])) for q, c in zip(QUANTITIES, counts,
                                                                                               strict=True)]
