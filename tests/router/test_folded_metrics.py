"""Folded prometheus metrics (folded_metrics.py): after N updates a scrape shows exactly what updating the
prometheus_client objects one by one shows, in one process and summed over worker processes."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from greenserve.router.accounting.folded_metrics import (
    FoldedCounter,
    FoldedHistogram,
    FoldedLabelledCounter,
    MetricFolder,
)
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

BUCKETS = (.005, .01, .025, .05, .1, .2, .5, 1, 2, 5, 10, 30)


def _values(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if not s.name.endswith("_created"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _pair() -> tuple[CollectorRegistry, MetricFolder, tuple, CollectorRegistry, tuple]:
    folded_reg, folder = CollectorRegistry(), MetricFolder()
    folded_reg.register(folder)
    folded = (folder.add(FoldedLabelledCounter(Counter("req", "r", ["protocol", "outcome"], registry=folded_reg))),
              folder.add(FoldedHistogram(Histogram("ttft_seconds", "t", buckets=BUCKETS, registry=folded_reg))),
              folder.add(FoldedCounter(Counter("grams", "g", registry=folded_reg))))
    plain_reg = CollectorRegistry()
    plain = (Counter("req", "r", ["protocol", "outcome"], registry=plain_reg),
             Histogram("ttft_seconds", "t", buckets=BUCKETS, registry=plain_reg), Counter("grams", "g", registry=plain_reg))
    return folded_reg, folder, folded, plain_reg, plain


def _update(metrics: tuple, rnd: random.Random, n: int) -> None:
    requests, ttft, grams = metrics
    for _ in range(n):
        requests.labels(rnd.choice(["http", "grpc"]), rnd.choice(["ok", "ok", "rejected"])).inc()
        # bucket bounds themselves, values between and beyond them
        ttft.observe(rnd.choice([rnd.choice(BUCKETS), rnd.uniform(0, 40), 0.0, 31.0]))
        grams.inc(rnd.uniform(0, 0.01))


def test_a_scrape_shows_every_folded_update_as_the_plain_metrics_would() -> None:
    folded_reg, _, folded, plain_reg, plain = _pair()
    for n in (1, 37, 1000):  # scrape after each batch: folding twice must not count twice
        _update(folded, random.Random(n), n)
        _update(plain, random.Random(n), n)
        got, want = _values(folded_reg), _values(plain_reg)
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-9), key
    assert want[("ttft_seconds_count", ())] == 1038
    assert want[("req_total", (("outcome", "ok"), ("protocol", "http")))] > 0


def test_nan_goes_to_the_sum_only_and_negative_increments_are_refused() -> None:
    folded_reg, _, (requests, ttft, grams), _, _ = _pair()
    ttft.observe(math.nan)
    ttft.observe(0.3)
    values = _values(folded_reg)
    assert values[("ttft_seconds_count", ())] == 1 and math.isnan(values[("ttft_seconds_sum", ())])
    with pytest.raises(ValueError, match="non-negative"):
        grams.inc(-1.0)


_WORKER = """
import os, random, sys
from prometheus_client import CollectorRegistry, Counter, Histogram
sys.path.insert(0, {tests!r})
from test_folded_metrics import BUCKETS, _update
from greenserve.router.accounting.folded_metrics import FoldedCounter, FoldedHistogram, FoldedLabelledCounter, MetricFolder
reg, folder = CollectorRegistry(), MetricFolder()
reg.register(folder)
metrics = (folder.add(FoldedLabelledCounter(Counter("req", "r", ["protocol", "outcome"], registry=reg))),
           folder.add(FoldedHistogram(Histogram("ttft_seconds", "t", buckets=BUCKETS, registry=reg))),
           folder.add(FoldedCounter(Counter("grams", "g", registry=reg))))
seed, n = int(sys.argv[1]), int(sys.argv[2])
_update(metrics, random.Random(seed), n // 2)
list(reg.collect())  # a worker publishing its gauges (workers.py) folds
_update(metrics, random.Random(seed + 100), n - n // 2)
folder.fold()  # RouterCore.stop
"""


def test_two_worker_processes_sum_to_the_plain_totals(tmp_path: Path) -> None:
    """In multiprocess mode (router workers) the folded values reach each process's file: the directory's
    sum over two processes equals one process updating plain metrics with both processes' values."""
    from prometheus_client.multiprocess import MultiProcessCollector

    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(tests=str(Path(__file__).parent)))
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for seed, n in ((1, 300), (2, 501)):
        subprocess.run([sys.executable, str(script), str(seed), str(n)], env=env, check=True, timeout=60)
    whole = CollectorRegistry()
    MultiProcessCollector(whole, str(tmp_path))
    _, _, _, plain_reg, plain = _pair()
    for seed, n in ((1, 300), (2, 501)):
        _update(plain, random.Random(seed), n // 2)
        _update(plain, random.Random(seed + 100), n - n // 2)
    got, want = _values(whole), _values(plain_reg)
    assert want[("ttft_seconds_count", ())] == 801
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9), key
