"""Benchmark smoke test and the reproducible fidelity table."""

from __future__ import annotations

import json

import pytest
from greenserve.bench import simulator as bench
from greenserve.simulator.fidelity import fidelity_rows, render_markdown


def test_bench_smoke_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--json", "--limit", "300"], prog="greenserve bench simulator") == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    for key in ("requests", "wall_seconds", "simulated_requests_per_second", "ttft_s", "tpot_s", "per_trace"):
        assert key in result
    assert result["requests"] == 600
    assert set(result["ttft_s"]) == {"p50", "p90", "p99"}
    assert set(result["per_trace"]) == {"mooncake_conversation_1h", "azure_conv_2023_1h"}
    assert result["per_trace"]["mooncake_conversation_1h"]["completed"] == 300


def test_bench_rejects_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--limit", "0"], prog="greenserve bench simulator")
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        bench.main(["--profile", "nope"], prog="greenserve bench simulator")
    assert "unknown profile" in capsys.readouterr().err


def test_fidelity_table_without_trace_rows() -> None:
    rows = fidelity_rows(include_trace_rows=False)
    by = {r.quantity: r for r in rows}
    load = by["mean KV load time of the cached context (SSD tier)"]
    assert load.published == 0.03 and abs(load.relative_error) < 0.5
    unloaded = by["mean TTFT, no cache, unloaded (prefill only)"]
    assert abs(unloaded.relative_error) < 0.5
    assert all(r.holds for r in rows if r.kind == "bound" and r.source == "GreenLLM Table II")
    table = render_markdown(rows)
    assert table.count("\n") == len(rows) + 1 and "GreenCache" in table


@pytest.mark.slow
def test_fidelity_kareto_trend_is_monotone_at_low_bandwidth() -> None:
    rows = [r for r in fidelity_rows() if r.source == "Kareto Table 1" and r.unit == "ratio"]
    assert len(rows) == 4
    five = next(r for r in rows if "at 5 GB/s" in r.quantity)
    forty = next(r for r in rows if "at 40 GB/s" in r.quantity)
    assert five.model > forty.model > 0.95  # TTFT falls as DRAM bandwidth rises, with diminishing returns


def test_docs_table_is_the_function_output() -> None:
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "simulator.md").read_text()
    for line in render_markdown(fidelity_rows(include_trace_rows=False)).splitlines():
        assert line in docs, f"docs/simulator.md is stale: {line}"
