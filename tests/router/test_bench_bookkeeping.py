"""bench_bookkeeping: the per-request bookkeeping microbenchmark runs, counts every request, and refuses bad input."""

from __future__ import annotations

import asyncio
import json

import pytest

from greenserve.bench.router_bookkeeping import STAGES, main, measure


def test_every_request_is_counted_and_each_stage_timed() -> None:
    result = asyncio.run(measure(requests=300, prompt_chars=1024, engines=2, metric_reader=False))
    assert result["requests_counted"] == 300  # the folded prometheus counter, as /metrics reports it
    us = result["us_per_request"]
    assert set(us) == set(STAGES) and all(v >= 0 for v in us.values())
    assert us["hash"] > 0 and us["finish"] > 0 and result["total_us_per_request"] > 0
    assert us["flush"] < 1.0  # no metric reader: nothing is queued for OTel


def test_with_a_metric_reader_the_receipt_metrics_flush_costs_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--requests", "200", "--metric-reader"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["metric_reader"] and result["us_per_request"]["flush"] > 0


def test_bad_input_is_refused_with_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--requests", "0"])
    assert exc.value.code == 2 and "must be >= 1" in capsys.readouterr().err
