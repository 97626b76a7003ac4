"""Prometheus counters and histograms that the request path updates in plain Python, folded into the
prometheus_client objects whenever the registry is collected.

Why: every prometheus_client value update takes a lock, and in multiprocess mode (the router's workers,
workers.py) also checks the pid (a getpid() system call) and writes the value into the process's mmap file:
1.6 us per counter increment and 3.3 us per histogram observation there, 0.6 / 0.8 us in one process
(timeit, prometheus_client 0.26), about 10 us of each request's CPU for the router's four per-request updates.
Here an increment is a float addition and an observation a bisect plus two additions; a fold hands each
series' sums over in one update per series and histogram bucket.

When values reach the prometheus objects: :class:`MetricFolder` is registered in the registry before the
metrics it folds, and ``CollectorRegistry.collect`` runs collectors in registration order, so every
collection (a scrape of this process's registry, a worker's publishing of its gauges every second, see
workers.py) sees every value recorded before it. With workers, the whole router's sums lag each other
worker by at most that second, and a worker killed outright (SIGKILL) loses at most its last second of
counts (a worker that stops normally folds at stop: ``RouterCore.stop``).

Everything here runs on the event loop's thread (the request path, the scrape handler and the publishing
task all do), so the pending sums need no lock.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from prometheus_client import Counter, Histogram


class _Folds(Protocol):
    def fold(self) -> None: ...


_M = TypeVar("_M", bound=_Folds)


class FoldedCounter:
    """A prometheus Counter (or one labelled child of it), counted in plain Python until folded."""

    __slots__ = ("_pending", "_target")

    def __init__(self, target: Any) -> None:
        self._target = target
        self._pending = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:  # as prometheus_client's Counter.inc
            raise ValueError(f"counters can only be incremented by non-negative amounts, got {amount!r}")
        self._pending += amount

    def fold(self) -> None:
        if self._pending:
            amount, self._pending = self._pending, 0.0
            self._target.inc(amount)


class FoldedLabelledCounter:
    """A labelled prometheus Counter whose children are :class:`FoldedCounter` (``labels(*values)``)."""

    def __init__(self, target: Counter) -> None:
        self._target = target
        self._children: dict[tuple[str, ...], FoldedCounter] = {}

    def labels(self, *values: str) -> FoldedCounter:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = FoldedCounter(self._target.labels(*values))
        return child

    def fold(self) -> None:
        for child in self._children.values():
            child.fold()


class FoldedHistogram:
    """An unlabelled prometheus Histogram, observed in plain Python (bucket counts and a sum) until folded.

    A value lands in the first bucket whose upper bound is >= it, as ``Histogram.observe`` does (bisect on
    the same bounds, +Inf last); NaN, which prometheus_client adds to the sum but to no bucket, likewise.
    Folding adds to the histogram's own bucket and sum values (``_buckets``, ``_sum``: prometheus_client has
    no public way to observe a count at once; tests/router/test_folded_metrics.py compares the exposition
    with a histogram observed value by value, so a change of those internals fails there)."""

    def __init__(self, target: Histogram) -> None:
        self._target = target
        self._bounds: list[float] = list(target._upper_bounds)
        if len(target._buckets) != len(self._bounds):
            raise ValueError("FoldedHistogram needs an unlabelled Histogram")
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._observed = False

    def observe(self, amount: float) -> None:
        self._sum += amount
        self._observed = True
        if amount == amount:  # not NaN
            self._counts[bisect_left(self._bounds, amount)] += 1

    def fold(self) -> None:
        if not self._observed:
            return
        counts, buckets = self._counts, self._target._buckets
        for i, count in enumerate(counts):
            if count:
                buckets[i].inc(count)
                counts[i] = 0
        total, self._sum, self._observed = self._sum, 0.0, False
        self._target._sum.inc(total)


class MetricFolder:
    """A collector that folds its metrics into their prometheus objects and reports nothing itself.

    Register it in a registry before the metrics it folds (see the module docstring)."""

    def __init__(self) -> None:
        self._metrics: list[_Folds] = []

    def add(self, metric: _M) -> _M:
        self._metrics.append(metric)
        return metric

    def fold(self) -> None:
        for metric in self._metrics:
            metric.fold()

    def collect(self) -> Sequence[Any]:
        self.fold()
        return ()

    def describe(self) -> Sequence[Any]:
        return ()

