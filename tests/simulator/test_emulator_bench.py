"""Smoke test of the engine emulator's load benchmark (tiny size)."""

from __future__ import annotations

import json

import pytest

from greenserve.bench.engine_sim import main


def test_bench_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--streams", "8", "--max-tokens", "5", "--prompt-words", "10", "--time-scale", "50"], prog="t") == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("tokens_per_second", "max_concurrent_streams", "pace_ratio", "server_cpu_seconds", "wall_seconds"):
        assert key in out
    assert out["tokens"] == 8 * 5 == out["engine_generated_tokens"] and out["errors"] == 0
    assert 1 <= out["max_concurrent_streams"] <= 8
