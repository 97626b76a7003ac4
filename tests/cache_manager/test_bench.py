"""Smoke runs of both benchmarks with tiny sizes: the last stdout line is the promised JSON object."""

from __future__ import annotations

import json

import pytest

from greenserve.bench import cache_manager as bench


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_cache_policy_smoke(capsys) -> None:
    assert bench.policy_main(["--limit", "300", "--capacities", "0.05,1.0", "--ablations", "--shapes", "none",
                              "--json"]) == 0
    out = _last_json(capsys)
    assert out["capacities"] == [0.05, 1.0]
    assert set(out["hit_rate"]) == {"FIFO", "LRU", "LCS", "LCS+TTL", "Adaptive"}
    assert set(out["ablations"]) == {"LCS-no-decay", "LCS-no-decay-no-reset", "LCS-reset", "LCS-no-chain", "LRU-chain"}
    assert out["seconds"]["total"] > 0
    for rates in list(out["hit_rate"].values()) + list(out["ablations"].values()):
        assert len(rates) == 2 and all(0.0 <= r <= 1.0 for r in rates)
    # At 100 % capacity nothing is evicted: every policy without TTL reaches the infinite-cache hit rate.
    assert len({rates[1] for name, rates in out["hit_rate"].items() if name != "LCS+TTL"}) == 1
    assert out["hit_rate"]["LCS+TTL"][1] <= out["hit_rate"]["LRU"][1]


def test_cache_policy_custom_trace(tmp_path, capsys) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": i * 1000, "input_length": 1024, "hash_ids": [0, 1 + i % 3]} for i in range(30)]
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert bench.policy_main(["--trace", str(trace), "--capacities", "1.0", "--shapes", "none"]) == 0
    out = _last_json(capsys)
    # 4 unique blocks, all fit: only the first touch of each block misses.
    assert out["hit_rate"]["LRU"] == [pytest.approx((30 * 1024 - 4 * 512) / (30 * 1024))]


def test_cache_policy_shapes(tmp_path, capsys) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 512, "hash_ids": [7]}) + "\n")
    assert bench.policy_main(["--trace", str(trace), "--shapes", "stale-hot,zipf-0.7", "--limit", "400",
                              "--capacities", "0.05,1.0", "--policies", "LRU,Adaptive"]) == 0
    out = _last_json(capsys)
    assert set(out["traces"]) == {"t.jsonl", "stale-hot", "zipf-0.7"}
    for entry in out["traces"].values():
        assert set(entry["hit_rate"]) == {"LRU", "Adaptive"} and set(entry["minus_lru"]) == {"Adaptive"}
    assert out["worst_minus_lru"]["Adaptive"] == min(min(e["minus_lru"]["Adaptive"]) for e in out["traces"].values())


@pytest.mark.parametrize("flags", [["--capacities", "0,2"], ["--shapes", "nope"], ["--policies", "LRU,MRU"],
                                   ["--ttl-period-s", "nan"], ["--ttl-window-s", "nan"]])
def test_cache_policy_bad_flags(flags) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.policy_main(flags)
    assert exc.value.code == 2


@pytest.mark.parametrize("content", ["garbage\n", '{"timestamp": 0}\n', '{"timestamp": 0, "hash_ids": 5}\n'],
                         ids=["not-json", "no-hash-ids", "hash-ids-not-a-list"])
def test_cache_policy_unreadable_trace_is_a_usage_error(tmp_path, capsys, content) -> None:
    """A --trace file that is not a Mooncake JSONL trace ended the bench with a JSONDecodeError / KeyError /
    TypeError traceback; now the usage error names the file and what is wrong, exit status 2."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(content)
    with pytest.raises(SystemExit) as exc:
        bench.policy_main(["--trace", str(trace), "--shapes", "none", "--capacities", "1.0", "--policies", "LRU"])
    assert exc.value.code == 2
    assert f"trace {trace}: not a Mooncake JSONL trace" in capsys.readouterr().err


def test_cache_eviction_smoke(capsys) -> None:
    assert bench.eviction_main(["--entries", "2000", "--choices", "50", "--read-recompute-tokens", "4096",
                                "--read-recompute-repeats", "5"]) == 0
    out = _last_json(capsys)
    assert out["entries"] == 2000
    assert out["choose_ms_p50"] >= 0 and out["choose_ms_p99"] >= out["choose_ms_p50"]
    assert 1 <= out["full_passes"] <= 50
    assert out["bytes_per_entry"] > 0 and out["array_bytes_per_slot"] > 0
    assert out["read_or_recompute"]["chunks"] == 16
    assert out["read_or_recompute_ms_p99"] >= out["read_or_recompute_ms_p50"] > 0


def test_cache_policy_shipped_traces_by_name_and_azure_csv(tmp_path, capsys) -> None:
    assert bench.policy_main(["--trace", "azure-conv", "--trace", "mooncake", "--limit", "200", "--shapes", "none",
                              "--capacities", "1.0", "--policies", "LRU,Adaptive"]) == 0
    out = _last_json(capsys)
    assert list(out["traces"]) == ["AzureLLMInferenceTrace_conv.csv (conversations reconstructed)",
                                   "conversation_trace.jsonl"]
    azure = out["traces"]["AzureLLMInferenceTrace_conv.csv (conversations reconstructed)"]
    assert azure["requests"] == 200 and 0 < azure["hit_rate"]["LRU"][0] < 1  # reconstructed prefixes do repeat
    bad = tmp_path / "t.csv"
    bad.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.0,12\n")
    with pytest.raises(SystemExit) as exc:
        bench.policy_main(["--trace", str(bad), "--shapes", "none", "--capacities", "1.0", "--policies", "LRU"])
    assert exc.value.code == 2 and "not an Azure LLM inference trace CSV" in capsys.readouterr().err
