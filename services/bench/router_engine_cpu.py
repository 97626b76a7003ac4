"""CPU per streamed token of the bench engine (router_engine.py) against the simulator's emulator under the same
load: the check that the router benchmarks measure the router, not their engines.

Run: ``python -m greenserve.bench.router_engine_cpu [--streams N] [--engines noop,emulator]`` (one JSON line).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from greenserve.bench import router_launch as bench_launch
from greenserve.bench.router_engine import DEFAULT_MODEL, DEFAULT_TPOT_S, serve_args
from greenserve.bench.router_launch import Procs, spawn_engine, wait_http
from greenserve.bench.router_measure import proc_cpu_s, run_load, run_summary
from greenserve.common.cli_parser import Parser


def measure_cpu(kind: str, streams: int, max_tokens: int, duration_s: float, loadgen_procs: int,
                tpot_s: float = DEFAULT_TPOT_S) -> dict[str, Any]:
    """Streams ``streams`` closed-loop requests of ``max_tokens`` tokens straight to one engine of ``kind``
    (``noop``: the bench engine; ``emulator``: the simulator's, real time) for ``duration_s`` and returns its CPU
    per streamed token (engine process CPU over the run / tokens of the requests served)."""
    procs = Procs()
    try:
        if kind == "noop":
            cmd = [sys.executable, *serve_args(tpot_s=tpot_s)]
            model = DEFAULT_MODEL
        else:
            cmd = [sys.executable, "-m", "greenserve.simulator.emulator", "--port", "0", "--max-num-seqs", "4096"]
            model = None
        url = spawn_engine(procs, cmd, None, f"{kind} engine")
        proc = procs.procs[-1]
        wait_http(url + "/health", 30, proc)
        if model is None:
            with urllib.request.urlopen(url + "/v1/models", timeout=5) as resp:
                model = json.loads(resp.read())["data"][0]["id"]
        load = {"model": model, "prompt": "x" * 1024, "max_tokens": max_tokens, "max_tokens_spread": 0.0,
                "targets": [url], "protocol": "http", "concurrency": streams, "requests": 10**9, "stagger_s": 1.0,
                "duration_s": duration_s}
        cpu0, sys0, tokens0 = proc_cpu_s(proc.pid), _system_cpu_s(proc.pid), generation_tokens(url)
        summary = run_summary(run_load(load, 600, loadgen_procs, None))
        cpu_s, tokens = proc_cpu_s(proc.pid) - cpu0, generation_tokens(url) - tokens0
        system_s = _system_cpu_s(proc.pid) - sys0
    finally:
        procs.stop()
    summary.pop("_ttft_mean_ms", None)
    # CPU and tokens over the same span (ramp and drain included): the engine's own token counter
    return {"engine": kind, "streams": streams, "max_tokens": max_tokens, "duration_s": duration_s,
            "engine_cpu_s": round(cpu_s, 3), "generation_tokens": int(tokens),
            "engine_cpu_us_per_token": round(1e6 * cpu_s / tokens, 2) if tokens else None,
            "engine_system_cpu_us_per_token": round(1e6 * system_s / tokens, 2) if tokens else None,
            "engine_cpu_percent_of_measured_s": round(100.0 * cpu_s / duration_s, 1), "load": summary}


def _system_cpu_s(pid: int) -> float:
    """CPU seconds a process spent in the kernel (its sends: on loopback the receiver's TCP path too)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[12]) / os.sysconf("SC_CLK_TCK")


def generation_tokens(url: str) -> float:
    """``vllm:generation_tokens_total`` of the engine at ``url`` (this engine and the emulator both count it)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "vllm:generation_tokens_total")


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m greenserve.bench.router_engine_cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--duration-s", type=float, default=10.0)
    p.add_argument("--loadgen-procs", type=int, default=2)
    p.add_argument("--engines", default="noop,emulator", help="which engines, comma-separated")
    p.add_argument("--nice", type=int, default=0, help="niceness of every process started (negative needs root)")
    args = p.parse_args(argv)
    kinds = [k.strip() for k in args.engines.split(",") if k.strip()]
    if not kinds or any(k not in ("noop", "emulator") for k in kinds):
        p.error("--engines: a comma-separated list of noop, emulator")
    for name in ("streams", "max_tokens", "loadgen_procs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be >= 1")
    if not args.duration_s > 0:
        p.error("--duration-s: must be > 0")
    bench_launch.exit_on_sigterm()
    bench_launch.NICE = args.nice  # the launcher every bench process starts through applies it
    out = {k: measure_cpu(k, args.streams, args.max_tokens, args.duration_s, args.loadgen_procs) for k in kinds}
    if "noop" in out and "emulator" in out and out["noop"]["engine_cpu_us_per_token"]:
        out["emulator_over_noop_cpu_per_token"] = round(
            out["emulator"]["engine_cpu_us_per_token"] / out["noop"]["engine_cpu_us_per_token"], 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
