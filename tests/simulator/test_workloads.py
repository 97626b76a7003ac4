"""Trace parsers on slices of the real traces shipped with the package, synthetic generators, bad input."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
from greenserve.simulator.workloads import (
    TRACE_FILES,
    TRACES_DIR,
    Workload,
    load_azure_csv,
    load_mooncake_jsonl,
    multi_turn_workload,
    poisson_workload,
    trace_path,
    zipf_document_workload,
)
import itertools

MOONCAKE = trace_path("mooncake")
AZURE = trace_path("azure-conv")


def test_shipped_traces_are_the_upstream_files_of_source_md() -> None:
    """Each shipped trace is byte-identical to the upstream file whose sha256 SOURCE.md records."""
    source = (TRACES_DIR / "SOURCE.md").read_text()
    for name, file in TRACE_FILES.items():
        assert trace_path(name) == TRACES_DIR / file
        row = re.search(rf"^\| `{re.escape(file)}` \|.*`([0-9a-f]{{64}})`", source, re.MULTILINE)
        assert row, f"SOURCE.md has no row for {file}"
        assert hashlib.sha256(trace_path(name).read_bytes()).hexdigest() == row.group(1)
    with pytest.raises(ValueError, match="unknown trace"):
        trace_path("azure-code")


def test_mooncake_slice_matches_source_md() -> None:
    w = load_mooncake_jsonl(MOONCAKE, limit=500)
    assert len(w) == 500 and w.arrival_s[0] == 0.0
    assert w.hash_block_tokens == 512
    # SOURCE.md: len(hash_ids) == ceil(input_length / 512) for every row
    assert all(len(h) == -(-p // 512) for h, p in zip(w.block_hashes, w.prompt_tokens))
    assert all(b >= a for a, b in zip(w.arrival_s, w.arrival_s[1:]))


def test_mooncake_full_hour_stats() -> None:
    w = load_mooncake_jsonl(MOONCAKE)
    assert len(w) == 12031  # SOURCE.md
    assert w.arrival_s[-1] == pytest.approx(3536.999)
    assert np.mean(w.prompt_tokens) == pytest.approx(12035, rel=0.01)


def test_azure_first_hour_slice() -> None:
    w = load_azure_csv(AZURE, limit=300)
    assert len(w) == 300 and w.arrival_s[0] == 0.0
    assert not w.block_hashes
    full = load_azure_csv(AZURE, max_seconds=3600.0)
    assert len(full) == 19366  # the file spans 3,502 s < 1 h (SOURCE.md)
    assert np.mean(full.prompt_tokens) == pytest.approx(1155, rel=0.01)
    assert full.duration_s == pytest.approx(3501.7, abs=1.0)
    ten_min = load_azure_csv(AZURE, max_seconds=600.0)
    assert 0 < len(ten_min) < len(full) and ten_min.arrival_s[-1] < 600.0


def test_malformed_traces_name_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n{"timestamp": 5}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_mooncake_jsonl(bad)
    csv_bad = tmp_path / "bad.csv"
    csv_bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,2\n2023-11-16 18:15:47.0,x,2\n")
    with pytest.raises(ValueError, match="bad.csv:3"):
        load_azure_csv(csv_bad)
    header_bad = tmp_path / "h.csv"
    header_bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="header"):
        load_azure_csv(header_bad)


def test_workload_validation() -> None:
    with pytest.raises(ValueError, match="arrival_s"):
        Workload("x", [1.0, 0.5], [1, 1], [1, 1])
    with pytest.raises(ValueError, match="prompt_tokens"):
        Workload("x", [0.0], [1, 2], [1])
    with pytest.raises(ValueError, match="output_tokens"):
        Workload("x", [0.0], [5], [0])
    with pytest.raises(ValueError, match="rate_per_s"):
        poisson_workload(10, 0.0)
    with pytest.raises(ValueError, match="arrival"):
        poisson_workload(10, 1.0, arrival="uniform")


def test_generators_are_deterministic_and_shaped() -> None:
    a, b = poisson_workload(1000, 5.0, seed=9), poisson_workload(1000, 5.0, seed=9)
    assert a.arrival_s == b.arrival_s and a.prompt_tokens == b.prompt_tokens
    assert 1000 / a.duration_s == pytest.approx(5.0, rel=0.1)
    g = poisson_workload(2000, 5.0, seed=1, arrival="gamma", cv=3.0)
    gaps = np.diff(g.arrival_s)
    assert np.std(gaps) / np.mean(gaps) > 2.0  # burstier than Poisson (cv 1)
    mt = multi_turn_workload(200, 0.5, seed=1, mean_turns=6)
    assert max(mt.prompt_tokens) <= 8192
    # later turns of a conversation share the earlier turn's leading blocks
    by_conv: dict[int, list[int]] = {}
    for i, c in enumerate(mt.session_ids):
        by_conv.setdefault(c, []).append(i)
    shared = [i for idx in by_conv.values() for i, j in itertools.pairwise(idx)
              if mt.block_hashes[i] and mt.block_hashes[j][:len(mt.block_hashes[i])] == mt.block_hashes[i]]
    assert len(shared) > 100
    z = zipf_document_workload(3000, 2.0, n_documents=100, alpha=0.7, seed=1)
    counts = np.bincount(z.session_ids, minlength=100)
    top10 = np.sort(counts)[::-1][:10].sum() / counts.sum()
    assert top10 > 0.15  # skewed: the top 10 % of documents get well over 10 % of prompts
