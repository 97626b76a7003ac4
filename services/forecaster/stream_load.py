"""Turn the router's load samples (StreamLoad) into hourly load series.

Each sample covers ``window_s`` seconds ending at ``time`` and counts requests and tokens; it belongs, whole,
to the UTC hour holding its window's middle. Samples are summed per pool and hour; an hour is emitted once a
sample of a later hour arrives, as rate = count / covered seconds (so an hour the router covered only partly
is not read as low load, and an hour with no sample at all stays missing). Three series per pool: requests,
input tokens and output tokens per second.

Covered seconds (issue 22). The router runs several worker processes and several replicas, each sending its
own samples of the same pool and hour; their counts add up to the pool's load, but their windows overlap in
time, so the sum of the windows over-counts the time covered (N reporters over half an hour would sum to N
half hours). The covered seconds are therefore

    covered = min(sum of the windows, latest window end - earliest window start, 1 h)

This is exact for one reporter, gaps or not (its windows do not overlap, so their sum is the smaller), and for
any number of reporters whose windows together leave no gap inside the span, each starting and stopping when
it likes (the pool's load at a moment is the sum of the reporters that ran then). What it gets wrong: N > 1
reporters that all pause for a while inside the span (the router down, the forecaster unreachable and the
samples dropped) have that gap counted as covered, so the hour reads low by up to the gap's share of the span. Telling it apart would need a reporter id on each sample (a proto
change). The span is not clipped to the hour: a window straddling the hour's edge is counted whole in the
hour holding its middle, so its whole length is the time its counts were taken over (clipping it would read
one reporter's hour too high).

A call is all or nothing (issue 21): every sample is checked first (:func:`check_sample`: ranges, and a time
within a window around now by the greenserve clock, so that one far-future sample cannot open an hour that every
later sample is "older" than), then :meth:`LoadAccumulator.plan` works on copies of the open hours, and the
caller stores the completed hours and the open ones (:class:`~greenserve.forecaster.models.LoadBucket`) in one
transaction before :meth:`LoadAccumulator.commit` swaps the copies in. A refused call changes nothing, and the
open hours survive a restart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timezone

import numpy as np
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from greenserve.common.errors import InvalidArgument
from greenserve.forecaster.csv_sources import HOUR_S
from greenserve.forecaster.ingest import MAX_POINT_VALUE, TIME_MAX_S, TIME_MIN_S, SeriesKey, to_dt, to_s
from greenserve.forecaster.models import LoadBucket
from greenserve.v1 import forecaster_pb2

QUANTITIES = ("requests_per_s", "input_tokens_per_s", "output_tokens_per_s")
#: Shortest measurement window of a sample (the router never sends less than 1 ms).
MIN_WINDOW_S = 0.001
#: Most input or output tokens one sample may count.
MAX_TOKENS_PER_SAMPLE = 10**12
#: Longest pool name (it becomes a series key).
MAX_POOL_CHARS = 255
#: Most samples one StreamLoad call may send (the router sends at most 1,000 per call).
MAX_SAMPLES_PER_CALL = 100_000


@dataclass(frozen=True)
class Sample:
    """A checked sample: its index in the call, pool, the hour holding its window's middle, its window, and its
    counts."""

    index: int
    pool: str
    hour_s: int
    window_s: float
    #: the window's end, in seconds after ``hour_s`` (in [0, 5400): the middle is in the hour)
    end_in_hour_s: float
    requests: int
    input_tokens: int
    output_tokens: int


@dataclass
class _Bucket:
    """An open hour: sums of the counts and of the windows (``covered_s``), and the span of the windows in
    seconds after ``hour_s``."""

    hour_s: int
    span_start_s: float
    span_end_s: float
    covered_s: float = 0.0
    requests: float = 0.0
    input_tokens: float = 0.0
    output_tokens: float = 0.0

    def add(self, smp: Sample) -> None:
        self.span_start_s = min(self.span_start_s, smp.end_in_hour_s - smp.window_s)
        self.span_end_s = max(self.span_end_s, smp.end_in_hour_s)
        self.covered_s += smp.window_s
        self.requests += smp.requests
        self.input_tokens += smp.input_tokens
        self.output_tokens += smp.output_tokens

    def seconds_covered(self) -> float:
        """min(sum of the windows, span, 1 h): see the module docstring."""
        return min(self.covered_s, self.span_end_s - self.span_start_s, HOUR_S)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat(timespec="seconds")


def check_sample(sample: forecaster_pb2.StreamLoadRequest, index: int, now_s: float, max_age_s: float,
                 max_ahead_s: float) -> Sample:
    """The sample checked against the documented ranges; InvalidArgument naming ``samples[index].<field>``."""
    name = f"samples[{index}]"
    pool = sample.pool.strip()
    if not pool:
        raise InvalidArgument(f"{name}.pool", "must not be empty")
    if len(pool) > MAX_POOL_CHARS:
        raise InvalidArgument(f"{name}.pool", f"longer than {MAX_POOL_CHARS} characters")
    if not (math.isfinite(sample.window_s) and MIN_WINDOW_S <= sample.window_s <= HOUR_S):
        raise InvalidArgument(f"{name}.window_s", f"must be in [{MIN_WINDOW_S}, {HOUR_S}], got {sample.window_s!r}")
    for field in ("input_tokens", "output_tokens"):
        if getattr(sample, field) > MAX_TOKENS_PER_SAMPLE:
            raise InvalidArgument(f"{name}.{field}", f"at most {MAX_TOKENS_PER_SAMPLE:.0e} per sample")
    if not sample.HasField("time"):
        raise InvalidArgument(f"{name}.time", "is required")
    seconds, nanos = sample.time.seconds, sample.time.nanos
    if not 0 <= nanos < 1_000_000_000:
        raise InvalidArgument(f"{name}.time", f"nanos must be in 0..999999999, got {nanos}")
    if not TIME_MIN_S <= seconds < TIME_MAX_S:
        raise InvalidArgument(f"{name}.time", f"must be in 1970-01-01 .. 2100-01-01 UTC, got {seconds} s")
    end = seconds + nanos / 1e9
    if end > now_s + max_ahead_s:
        raise InvalidArgument(f"{name}.time", f"{_iso(end)} is {end - now_s:.0f} s ahead of the service clock "
                                              f"({_iso(now_s)}); at most {max_ahead_s:g} s ahead is accepted")
    if end < now_s - max_age_s:
        raise InvalidArgument(f"{name}.time", f"{_iso(end)} is {now_s - end:.0f} s before the service clock "
                                              f"({_iso(now_s)}); at most {max_age_s:g} s old is accepted")
    hour = int((end - sample.window_s / 2) // HOUR_S * HOUR_S)  # the hour holding the window's middle
    end_in_hour = (seconds - hour) + nanos / 1e9  # integer part first: no epoch-sized float rounding
    return Sample(index, pool, hour, sample.window_s, end_in_hour, sample.requests, sample.input_tokens,
                  sample.output_tokens)


@dataclass
class Plan:
    """What one call changes: the open hour of each pool it touched, and the completed hours to store
    (series key, times, rates, index of the sample that completed the hour)."""

    buckets: dict[str, _Bucket]
    emitted: list[tuple[SeriesKey, np.ndarray, np.ndarray, int]]

    def persist(self, s: Session) -> None:
        """Store the touched open hours in the caller's transaction."""
        if not self.buckets:
            return
        s.execute(delete(LoadBucket).where(LoadBucket.pool.in_(list(self.buckets))))
        for pool, b in self.buckets.items():
            s.add(LoadBucket(pool=pool, hour_start=to_dt(b.hour_s), covered_s=b.covered_s, requests=b.requests,
                             input_tokens=b.input_tokens, output_tokens=b.output_tokens,
                             span_start_s=b.span_start_s, span_end_s=b.span_end_s))


class LoadAccumulator:
    """Per-pool hourly buckets. ``plan`` works on copies; ``commit`` makes a stored plan the current state."""

    def __init__(self) -> None:
        self.buckets: dict[str, _Bucket] = {}

    def restore(self, s: Session) -> None:
        """Load the open hours stored by earlier calls (startup)."""
        for row in s.scalars(select(LoadBucket)):
            self.buckets[row.pool] = _Bucket(to_s(row.hour_start), row.span_start_s, row.span_end_s, row.covered_s,
                                             row.requests, row.input_tokens, row.output_tokens)

    def plan(self, samples: list[Sample]) -> Plan:
        """The effect of ``samples`` in order, without changing this accumulator; InvalidArgument naming the
        first sample older than its pool's open hour, or completing an hour whose rate is out of range."""
        touched: dict[str, _Bucket] = {}
        emitted: list[tuple[SeriesKey, np.ndarray, np.ndarray, int]] = []
        for smp in samples:
            bucket = touched.get(smp.pool)
            if bucket is None and smp.pool in self.buckets:
                bucket = replace(self.buckets[smp.pool])
            if bucket is not None and smp.hour_s > bucket.hour_s:
                emitted.extend(self._emit(smp.pool, bucket, smp.index))
                bucket = None
            if bucket is None:
                bucket = _Bucket(smp.hour_s, span_start_s=smp.end_in_hour_s - smp.window_s,
                                 span_end_s=smp.end_in_hour_s)
            elif smp.hour_s < bucket.hour_s:
                raise InvalidArgument(f"samples[{smp.index}].time", f"hour {_iso(smp.hour_s)} is older than the "
                                      f"hour {_iso(bucket.hour_s)} already open for pool {smp.pool!r}")
            bucket.add(smp)
            touched[smp.pool] = bucket
        return Plan(touched, emitted)

    def commit(self, plan: Plan) -> None:
        self.buckets.update(plan.buckets)

    @staticmethod
    def _emit(pool: str, bucket: _Bucket, index: int) -> list[tuple[SeriesKey, np.ndarray, np.ndarray, int]]:
        covered = bucket.seconds_covered()
        t = np.array([bucket.hour_s], dtype=np.int64)
        counts = (bucket.requests, bucket.input_tokens, bucket.output_tokens)
        out = []
        for q, field, c in zip(QUANTITIES, ("requests", "input_tokens", "output_tokens"), counts, strict=True):
            rate = c / covered
            if not rate <= MAX_POINT_VALUE:
                raise InvalidArgument(f"samples[{index}].{field}", f"the hour {_iso(bucket.hour_s)} of pool "
                                      f"{pool!r} would store {rate:.3g} per second, above {MAX_POINT_VALUE:g}")
            out.append((SeriesKey("load", pool, q, q), t, np.array([rate]), index))
        return out
