"""Client reach: the Node.js client streams through Generate; the benchmark's --quick smoke run."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
NODE_DIR = REPO / "clients" / "node"
NODE = shutil.which("node")
# A --quick bench takes about 20 s on a quiet box. Its processes are pinned (router on one CPU, engines and load
# generator on the other), so on 2 cores shared with other work each gets a fraction of one core: the full suite saw
# one stall past 120 s at the router's start. 240 s still catches a hang, inside pytest's 300 s per test.
BENCH_TIMEOUT_S = 240


@pytest.mark.skipif(NODE is None or not (NODE_DIR / "node_modules").is_dir(),
                    reason="node or clients/node/node_modules missing (npm ci in clients/node)")
async def test_node_client_streams_through_generate(emulators, router) -> None:
    emus = await emulators(1)
    r = await router([emus[0].url])
    request = {"request": {"model": emus[0].model, "chat": {"messages": [{"role": "CHAT_ROLE_USER", "content": "hi"}]}},
               "sampling": {"max_tokens": 5}, "request_id": "node-1"}
    proc = await asyncio.create_subprocess_exec(
        NODE, str(NODE_DIR / "bin" / "greenserve-node.js"), "--addr", r.running.address, "call", "RouterService",
        "Generate", json.dumps(request), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    messages = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    assert len(messages) >= 2 and all(m["request_id"] == "node-1" for m in messages)
    assert "".join(m["text_delta"] for m in messages)
    assert messages[-1]["receipt"]["completion_tokens"] == 5
    assert messages[-1]["finish_reason"] == "length"


@pytest.mark.slow
def test_bench_quick_prints_json_with_the_figures() -> None:
    proc = subprocess.run([sys.executable, "-m", "greenserve_client.cli", "bench", "router", "--quick", "--json",
                           "--levels", "2", "--min-requests", "10"],
                          capture_output=True, text=True, timeout=BENCH_TIMEOUT_S, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("added_ttft_p50_ms", "added_ttft_p99_ms", "concurrency", "max_rps", "levels", "peers",
                "routed_rps", "direct_rps", "sequential"):
        assert key in result
    assert result["design"] == "paired" and result["concurrency"] == 2 and result["protocol"] == "http"
    # paired rows: the routed group and its direct control group ran together, each with its own samples
    (paired,) = result["levels"]
    assert (paired["target"], paired["protocol"]) == ("router", "http")
    assert paired["requests"] == 10 and paired["direct"]["requests"] == 10
    assert paired["errors"] == 0 and paired["direct"]["errors"] == 0
    assert paired["added_ttft_p50_ms"] == round(paired["ttft_p50_ms"] - paired["direct"]["ttft_p50_ms"], 3)
    assert result["added_ttft_p99_ms"] == paired["added_ttft_p99_ms"]
    assert result["routed_rps"] > 0 and result["direct_rps"] > 0
    sequential = result["sequential"]["levels"]
    targets = {(row["target"], row["protocol"]) for row in sequential}
    assert targets == {("direct", "http"), ("router", "http"), ("router", "grpc")}
    assert all(row["errors"] == 0 and row["requests"] == 10 for row in sequential)
    assert result["sequential"]["added_ttft_p50_ms"] is not None
    assert result["max_rps"] > 0 and "skipped" in result["peers"]["vllm-router"]
    pinning = result["cpu_pinning"]
    if pinning["enabled"]:  # router alone on its CPU, engines and load generator elsewhere
        assert not set(pinning["router"]) & set(pinning["engines"]) and pinning["loadgen"] == pinning["engines"]
    router_rows = [row for row in sequential + result["levels"] if row["target"] == "router"]
    assert all(row["router_cpu_ms_per_request"] > 0 for row in router_rows)
    assert all(row["loadgen_cpu_percent"] is not None for row in sequential)


@pytest.mark.slow
def test_bench_duration_mode_unpinned_with_two_load_processes() -> None:
    proc = subprocess.run([sys.executable, "-m", "greenserve_client.cli", "bench", "router", "--quick", "--json",
                           "--levels", "4", "--duration-s", "1", "--no-pin", "--loadgen-procs", "2",
                           "--protocols", "http"],
                          capture_output=True, text=True, timeout=BENCH_TIMEOUT_S, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["cpu_pinning"]["enabled"] is False and result["setup"]["duration_s"] == 1.0
    assert all(row["requests"] > 0 and row["errors"] == 0 for row in result["sequential"]["levels"])
    # time-bounded paired phase: both groups ran for the same second, each served requests
    (paired,) = result["levels"]
    assert paired["requests"] > 0 and paired["direct"]["requests"] > 0 and paired["direct"]["errors"] == 0


def test_token_counts_are_seeded_per_stream_and_stay_in_range() -> None:
    from itertools import islice

    from greenserve.bench.router_loadgen import token_counts

    a = list(islice(token_counts(0, 3, 64, 192), 200))
    assert a == list(islice(token_counts(0, 3, 64, 192), 200))  # same stream, same sequence in every run
    assert a != list(islice(token_counts(0, 4, 64, 192), 200))  # streams differ: they desynchronise
    assert min(a) >= 64 and max(a) <= 192 and len(set(a)) > 50


async def test_loadgen_ramp_requests_are_not_measured(emulators: Any) -> None:
    """With a stagger, the streams start spread over the ramp and what is sent during it is dropped."""
    from greenserve.bench.router_loadgen import loadgen

    (emu,) = await emulators(1, time_scale=5.0)
    cfg = {"concurrency": 4, "requests": 40, "prompt": "hello " * 20, "model": emu.model, "max_tokens": 8,
           "max_tokens_spread": 0.5, "stagger_s": 0.2, "protocol": "http", "targets": [emu.url]}
    res = await loadgen(cfg)
    assert res["errors"] == 0
    assert 0 < len(res["ttfts"]) < 40  # the ramp's requests were sent but not measured
    assert res["elapsed_s"] > 0 and res["wall_s"] > 0.2
    flat = await loadgen({**cfg, "stagger_s": 0.0, "max_tokens_spread": 0.0})
    assert len(flat["ttfts"]) == 40


@pytest.mark.parametrize("flag, value", [("--max-tokens-spread", "2"), ("--max-tokens", "0"), ("--stagger-s", "-1"),
                                         ("--throughput-max-tokens", "-1")])
def test_bench_rejects_bad_stream_flags_naming_them(flag: str, value: str, capsys: Any) -> None:
    from greenserve.bench.router import main

    with pytest.raises(SystemExit) as exc:
        main([flag, value])
    assert exc.value.code == 2 and flag in capsys.readouterr().err


def test_quick_keeps_its_short_outputs_when_only_the_spread_is_given() -> None:
    """--max-tokens-spread must not count as --max-tokens (a prefix of its name)."""
    proc = subprocess.run([sys.executable, "-m", "greenserve_client.cli", "bench", "router", "--quick", "--json",
                           "--levels", "2", "--min-requests", "4", "--protocols", "http",
                           "--max-tokens-spread", "0.5"],
                          capture_output=True, text=True, timeout=BENCH_TIMEOUT_S, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    setup = json.loads(proc.stdout.strip().splitlines()[-1])["setup"]
    assert setup["max_tokens"] == 16 and setup["quick"] is True
