"""Turn the router's load samples (StreamLoad) into hourly load series.

Each sample covers ``window_s`` seconds ending at ``time`` and counts requests and tokens; it belongs, whole,
to the UTC hour holding its window's middle. Samples are summed per pool and hour; an hour is emitted once its
grace has passed (below), as rate = count / covered seconds (so an hour the router covered only partly is not
read as low load, and an hour with no sample at all stays missing). Three series per pool: requests, input
tokens and output tokens per second.

Late samples. Several reporters (router workers and replicas) flush at their own phase,
and an RPC may be delayed: once one of them has sent a sample of hour H+1, another may still send its last
samples of H. So a pool keeps up to two hours open, its newest and the one before it, and an hour H is emitted
only once its grace (``late_s``, ``--stream-load-late-s``, default 300 s) has passed: a sample of a later
hour whose window ends at least ``late_s`` after H's end, or a sample of hour H+2 or later. Until then samples
of H are added to it (a late sample of H also opens H if no sample of H came before, as long as the newest
hour's samples show its grace has not passed). A sample of an hour that is closed (emitted, older than the
hour before the newest, or that hour once its grace has passed) is refused, naming ``samples[i].time``. For
the forecaster's consumers this means an hour's load point is stored up to ``late_s`` (plus a flush interval
of the router) after the hour ends: a forecast made before then does not see the hour yet (it starts from
the hour before, as it would if the point were missing). With ``late_s = 0`` no grace is given: every
sample of a later hour ends after H's end, so the first one emits H.

Covered seconds. The router runs several worker processes and several replicas, each sending its
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

A call is all or nothing: every sample is checked first (:func:`check_sample`: ranges, and a time
within a window around now by the greenserve clock, so that one far-future sample cannot open an hour that every
later sample is "older" than), then :meth:`LoadAccumulator.plan` works on copies of the open hours, and the
caller stores the completed hours and the open ones (at most two per pool,
:class:`~greenserve.forecaster.models.LoadBucket`) in one transaction before :meth:`LoadAccumulator.commit`
swaps the copies in. A refused call changes nothing, and the open hours survive a restart.
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
#: Largest message of a call: a valid sample (a 255-character pool of 4-byte characters) is about 1.1 KB. Samples
#: are kept until the whole call is checked, so without it one call could hold 100,000 messages of
#: --max-message-bytes each (a pool padded with blanks, or unknown fields).
MAX_SAMPLE_BYTES = 4096


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


#: Default of ``--stream-load-late-s``: how long after an hour's end its late samples are still taken.
DEFAULT_LATE_S = 300.0
#: Most open hours per pool: the newest and the one before it (while that one's grace lasts).
MAX_OPEN_HOURS = 2

Emitted = tuple[SeriesKey, np.ndarray, np.ndarray, int]


@dataclass
class LoadChanges:
    """What one call changes: the open hours (oldest first) of each pool it touched, and the completed hours to
    store (series key, times, rates, index of the sample that completed the hour)."""

    buckets: dict[str, list[_Bucket]]
    emitted: list[Emitted]

    def persist(self, s: Session) -> None:
        """Store the touched pools' open hours in the caller's transaction."""
        if not self.buckets:
            return
        s.execute(delete(LoadBucket).where(LoadBucket.pool.in_(list(self.buckets))))
        for pool, open_hours in self.buckets.items():
            for b in open_hours:
                s.add(LoadBucket(pool=pool, hour_start=to_dt(b.hour_s), covered_s=b.covered_s, requests=b.requests,
                                 input_tokens=b.input_tokens, output_tokens=b.output_tokens,
                                 span_start_s=b.span_start_s, span_end_s=b.span_end_s))


class LoadAccumulator:
    """Per-pool open hours (at most :data:`MAX_OPEN_HOURS`, oldest first). ``plan`` works on copies; ``commit``
    makes a stored plan the current state. ``late_s`` is the grace after an hour's end during which its late
    samples are still taken (the hour is emitted only once it has passed)."""

    def __init__(self, late_s: float = DEFAULT_LATE_S) -> None:
        self.late_s = late_s
        self.buckets: dict[str, list[_Bucket]] = {}

    def restore(self, s: Session) -> None:
        """Load the open hours stored by earlier calls (startup)."""
        for row in s.scalars(select(LoadBucket).order_by(LoadBucket.pool, LoadBucket.hour_start)):
            self.buckets.setdefault(row.pool, []).append(
                _Bucket(to_s(row.hour_start), row.span_start_s, row.span_end_s, row.covered_s, row.requests,
                        row.input_tokens, row.output_tokens))

    def _grace_passed(self, hour_s: int, end_s: float, sample_hour_s: int) -> bool:
        """Whether a sample of ``sample_hour_s`` whose window ends at ``end_s`` closes the hour ``hour_s``."""
        return sample_hour_s >= hour_s + 2 * HOUR_S or end_s >= hour_s + HOUR_S + self.late_s

    def plan(self, samples: list[Sample]) -> LoadChanges:
        """The effect of ``samples`` in order, without changing this accumulator; InvalidArgument naming the
        first sample of an hour already closed (emitted, or older than the hour before the newest one, or that
        hour once its grace has passed), or completing an hour whose rate is out of range."""
        touched: dict[str, list[_Bucket]] = {}
        emitted: list[Emitted] = []
        for smp in samples:
            open_hours = touched.get(smp.pool)
            if open_hours is None:
                open_hours = [replace(b) for b in self.buckets.get(smp.pool, ())]
            end_s = smp.hour_s + smp.end_in_hour_s
            # this sample closes the older open hours whose grace it shows has passed (oldest first)
            while open_hours and open_hours[0].hour_s < smp.hour_s and self._grace_passed(
                    open_hours[0].hour_s, end_s, smp.hour_s):
                emitted.extend(self._emit(smp.pool, open_hours.pop(0), smp.index))
            bucket = next((b for b in open_hours if b.hour_s == smp.hour_s), None)
            if bucket is None:
                if open_hours and smp.hour_s < open_hours[-1].hour_s:
                    self._check_late(smp, open_hours[-1])
                bucket = _Bucket(smp.hour_s, span_start_s=smp.end_in_hour_s - smp.window_s,
                                 span_end_s=smp.end_in_hour_s)
                open_hours.append(bucket)
                open_hours.sort(key=lambda b: b.hour_s)
            bucket.add(smp)
            assert len(open_hours) <= MAX_OPEN_HOURS, (smp.pool, [b.hour_s for b in open_hours])
            touched[smp.pool] = open_hours
        return LoadChanges(touched, emitted)

    def _check_late(self, smp: Sample, newest: _Bucket) -> None:
        """A sample of an hour with no open bucket, older than the pool's newest open hour: taken (opening the
        hour) only if it is the hour just before and its grace has not passed, else InvalidArgument. The newest
        hour's latest window end is the latest end of the pool's later samples: it tells whether a sample
        already closed this hour (emitted it, or would have had it been open)."""
        name = f"samples[{smp.index}].time"
        if smp.hour_s < newest.hour_s - HOUR_S:
            raise InvalidArgument(name, f"hour {_iso(smp.hour_s)} is older than the hours still open for pool "
                                  f"{smp.pool!r} ({_iso(newest.hour_s)} and the hour before it)")
        if self._grace_passed(smp.hour_s, newest.hour_s + newest.span_end_s, newest.hour_s):
            raise InvalidArgument(name, f"hour {_iso(smp.hour_s)} of pool {smp.pool!r} is closed: its late "
                                  f"samples are taken up to {self.late_s:g} s after it ends, and a sample ending at "
                                  f"{_iso(newest.hour_s + newest.span_end_s)} has arrived")

    def commit(self, plan: LoadChanges) -> None:
        self.buckets.update(plan.buckets)

    @staticmethod
    def _emit(pool: str, bucket: _Bucket, index: int) -> list[Emitted]:
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
