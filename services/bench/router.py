"""``greenserve bench router``: added TTFT and throughput through the router vs straight to the engines.

Processes: ``--engines`` emulated engines (the simulator's ``greenserve-engine-sim``, one process
each), the router (``python -m greenserve.router``, uvloop), optionally ``vllm-router`` (PyPI
``vllm-router``, Rust, installed into ``.venv-vllm-router`` at the repository root when missing; skipped
with the reason when it cannot be installed or started), and the load generator in
``--loadgen-procs`` processes per run. Unless ``--no-pin``, the router (and vllm-router) run alone on
the last CPU and the engines and load generator on the others, in the direct and routed runs alike
(``cpu_pinning`` in the JSON), so that the system under test neither steals CPU from the engines it
is compared with nor is slowed by them. Rows also carry the router's CPU per request, its run-queue
wait per request (time other jobs on the machine cost it), the load generator's CPU and the engines'
own TTFT; ``host_load`` records the machine's load average and CPU pressure.

At each concurrency level the load generator keeps that many streams open in a closed loop (each
worker sends its next request when the previous one ends) against, in turn: the engines directly
(requests spread round-robin by the client), the router over HTTP, the router over gRPC (Generate), and
vllm-router over HTTP. TTFT is the time from sending a request to its first body bytes (completions
send no bytes before the first token, through any of these paths); E2E is to the end of the stream.

Streams are desynchronised, as real traffic is: each asks for ``--max-tokens`` x (1 +/-
``--max-tokens-spread``) tokens (uniform, seeded, the same sequence for every target), each stream's
first request starts at a random instant of the ``--stagger-s`` ramp, and requests sent during the ramp
are not measured. Without this (``--synchronized``), N identical streams that start together finish
together and restart together, round after round: every proxy then has to take N requests in the same
millisecond, and the percentiles measure that thundering herd (at 256 streams each hop queues the
whole burst behind itself: +100 ms of TTFT for the router, and the engines' own burst for direct),
not the per-request latency that a router adds. The default output (128 tokens, 64..192) keeps the
emulated engines' CPU below saturation at 256 streams, as the GPUs of real engines would be; short
outputs go to the throughput phase (``--throughput-max-tokens``, 16), run after the levels at the
highest level for direct, the router and vllm-router over HTTP, where per-request work bounds the rate
and ``max_rps`` is taken.

Added TTFT = TTFT percentile through a router - the same percentile direct, at the same level. It is a
difference of two runs, so the emulated engines' own TTFT variance shows in it (it can come out
negative). The router also measures itself: ``router_overhead_p50_ms_le``/``_p99_ms_le`` are the upper
bounds of the buckets of its ``greenserve_router_overhead_seconds`` histogram (arrival to first byte
written, minus the engine's time to first token) that hold the 50th/99th percentile over the run. The last
line is one JSON object; ``added_ttft_p50_ms``/``added_ttft_p99_ms``/``concurrency`` are for 256
streams over HTTP (or the largest level run when 256 is not), ``max_rps`` is the router's best HTTP
throughput over the levels, ``levels`` holds every (level, target) and ``peers`` vllm-router's figures.
``grpc_cpu_ms_per_request``, ``http_cpu_ms_per_request`` and ``vllm_router_cpu_ms_per_request`` are the
router's CPU per request over gRPC and HTTP and vllm-router's, from the sequential phase at the headline
level (the same load for each, one after another); ``--grpc-stream-interval-s`` sets the router's. gRPC
rows carry ``grpc_messages_per_request`` (the mean number of Generate messages a measured request got).

Where the parts live: the load generator (its own processes) in bench_loadgen.py; process launching
(pinning, ``--nice``, the engines, the router and vllm-router under test, the CPU plan) in bench_launch.py;
the measurement of a run (load runs, summaries, the router's CPU and overhead histogram) in bench_measure.py.
This module keeps the command line and its phases (``main``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
from typing import Any

from greenserve.common.cli_parser import Parser
from greenserve.bench import router_launch as bench_launch
from greenserve.bench.router_launch import (
    VLLM_ROUTER_VERSION,
    Procs,
    cpu_plan,
    exit_on_sigterm,
    log,
    start_engine,
    start_router,
    start_vllm_router,
    vllm_router_bin,
    wait_http,
)
from greenserve.bench.router_measure import (
    RunMeter,
    engine_ttft_totals,
    host_load,
    run_load,
    run_loads,
    run_summary,
)


def main(argv: list[str], prog: str = "greenserve bench router") -> int:
    p = Parser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="(default) print the result as one JSON line")
    p.add_argument("--quick", action="store_true", help="smoke test: levels 1 and 8, few requests, no peer")
    p.add_argument("--levels", default=None, help="concurrency levels, comma-separated (default 1,16,64,256,1000)")
    p.add_argument("--requests-per-stream", type=int, default=4, help="requests each stream sends per run")
    p.add_argument("--min-requests", type=int, default=None, help="at least this many requests per run (default 200)")
    p.add_argument("--duration-s", type=float, default=None,
                   help="time-bounded runs: each (level, target) runs this long (closed loop) instead of a "
                        "request count")
    p.add_argument("--engines", type=int, default=2, help="emulated engines (processes)")
    p.add_argument("--engine", choices=("emulator", "noop"), default="emulator",
                   help="emulator: the simulator's engine (the figures so far); noop: bench_engine.py, a token "
                        "every --noop-tpot-s at a few us of CPU each, so that the router is the bottleneck")
    p.add_argument("--noop-tpot-s", type=float, default=0.02, help="seconds between tokens of --engine noop")
    p.add_argument("--time-scale", type=float, default=1.0, help="emulator speed-up (1 = modelled real time)")
    p.add_argument("--max-num-seqs", type=int, default=1024, help="emulated engines' --max-num-seqs")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="mean tokens generated per request (each asks for max_tokens x (1 +/- spread)); "
                        "default 128, 16 with --quick")
    p.add_argument("--max-tokens-spread", type=float, default=0.5,
                   help="relative spread of max_tokens between requests, 0..1 (0: all the same)")
    p.add_argument("--stagger-s", type=float, default=2.0,
                   help="ramp: each stream's first request starts at a random instant in [0, stagger); "
                        "requests sent during the ramp are not measured")
    p.add_argument("--throughput-max-tokens", type=int, default=None,
                   help="after the levels, a throughput phase at the highest level with this many tokens per "
                        "request (short outputs: the routers' per-request work bounds the rate); 0 skips it; "
                        "default 16, 0 with --quick")
    p.add_argument("--synchronized", action="store_true",
                   help="the thundering-herd variant: no stagger, identical max_tokens (every stream restarts "
                        "at the same instant, round after round)")
    p.add_argument("--prompt-chars", type=int, default=1024, help="prompt length in characters")
    p.add_argument("--model", default=None, help="served model name of the emulated engines")
    p.add_argument("--protocols", default="http,grpc", help="router protocols to measure")
    p.add_argument("--router-args", default="", help="extra flags for the router under test, e.g. "
                   "'--affinity-weight 0' (one string, split as a shell would)")
    p.add_argument("--no-peer", action="store_true", help="skip vllm-router")
    p.add_argument("--front", action="append", choices=["envoy"], default=[],
                   help="also measure this front: envoy = the pinned Envoy with the router as its endpoint picker "
                        "(router/envoy/; CPU per request of Envoy and the router together, receipts issued)")
    p.add_argument("--envoy-usage-reader", choices=["lua", "ext_proc", "none"], default="lua",
                   help="with --front envoy: how receipts get the engine's token counts (router/envoy/usage_filter.py): "
                        "lua = a Lua filter in Envoy (default), ext_proc = every response chunk through the picker, "
                        "none = not read")
    p.add_argument("--envoy-alone", action="store_true",
                   help="with --front envoy: also measure Envoy alone (target envoy-alone: the same binary and "
                        "bootstrap without ext_proc, access log and Lua filter, round-robin over the engines): "
                        "the floor of Envoy's own CPU per request, in the sequential and throughput phases")
    p.add_argument("--paired-grpc", action="store_true",
                   help="also run the paired phase for the router over gRPC (default: HTTP and vllm-router)")
    p.add_argument("--no-install-peer", action="store_true", help="use .venv-vllm-router only if it exists")
    p.add_argument("--no-pin", action="store_true",
                   help="do not pin processes to CPUs (default: router alone on the last CPU, the rest elsewhere)")
    p.add_argument("--loadgen-procs", type=int, default=0,
                   help="load-generator processes per run (0: one per 128 streams, at most the CPUs it has)")
    p.add_argument("--nice", type=int, default=0,
                   help="niceness of every process the bench starts (negative needs root: shields the run "
                        "from other jobs on a shared machine; reported)")
    p.add_argument("--grpc-stream-interval-s", type=float, default=None,
                   help="the router's --grpc-stream-interval-s (default: the router's own default)")
    p.add_argument("--profile-router", default=None, metavar="PATH",
                   help="run the router under cProfile and write its stats to PATH (distorts timings)")
    p.add_argument("--replicas-phase", action="store_true",
                   help="then the replicas phase (bench_replicas.py: registration propagation and prefix hit rate, "
                        "1 vs 4 replicas on one database; its options are the --replicas-* ones)")
    p.add_argument("--workers-phase", type=int, default=0, metavar="N",
                   help="then the workers phase (bench_workers.py: workers_speedup, throughput with --workers N "
                        "over --workers 1 against a no-op engine); 0 skips it")
    from greenserve.bench import router_replicas as bench_replicas

    bench_replicas.add_arguments(p, prefix="replicas-")
    args = p.parse_args(argv)
    exit_on_sigterm()
    if args.quick:
        args.requests_per_stream, args.no_peer = 2, True
    if args.max_tokens is None:
        args.max_tokens = 16 if args.quick else 128
    if args.throughput_max_tokens is None:
        args.throughput_max_tokens = 0 if args.quick else 16
    if args.synchronized or args.quick:
        args.stagger_s, args.max_tokens_spread = 0.0, 0.0
    if args.levels is None:
        args.levels = "1,8" if args.quick else "1,16,64,256,1000"
    if args.min_requests is None:
        args.min_requests = 20 if args.quick else 12
    if args.envoy_alone and "envoy" not in args.front:
        p.error("--envoy-alone: needs --front envoy")
    if args.min_requests < 1:
        p.error("--min-requests: must be >= 1")
    if args.max_tokens < 1:
        p.error("--max-tokens: must be >= 1")
    if not 0.0 <= args.max_tokens_spread <= 1.0:
        p.error("--max-tokens-spread: must be in [0, 1]")
    if args.throughput_max_tokens < 0:
        p.error("--throughput-max-tokens: must be >= 0")
    if args.stagger_s < 0:
        p.error("--stagger-s: must be >= 0")
    if args.duration_s is not None and not args.duration_s > 0:
        p.error("--duration-s: must be > 0")
    if args.loadgen_procs < 0:
        p.error("--loadgen-procs: must be >= 0")
    if not args.noop_tpot_s >= 0:
        p.error("--noop-tpot-s: must be >= 0")
    try:
        levels = [int(x) for x in args.levels.split(",") if x.strip()]
    except ValueError:
        p.error("--levels: comma-separated integers expected")
    if not levels or min(levels) < 1:
        p.error("--levels: every level must be >= 1")
    protocols = [x.strip() for x in args.protocols.split(",") if x.strip()]
    if set(protocols) - {"http", "grpc"}:
        p.error("--protocols: http and/or grpc")
    pinning = cpu_plan(not args.no_pin)
    bench_launch.NICE = args.nice
    host_before = host_load()
    side = pinning.get("engines")  # None when not pinned
    router_cpus = pinning.get("router")

    procs = Procs()
    data_dir = tempfile.mkdtemp(prefix="gs-bench-router-")
    result: dict[str, Any] = {}
    try:
        log(f"starting {args.engines} emulated engine(s); CPU pinning: {json.dumps(pinning)}")
        engines = [start_engine(procs, args, side) for _ in range(args.engines)]
        for url in engines:
            wait_http(url + "/health", 30)
        import urllib.request

        with urllib.request.urlopen(engines[0] + "/v1/models", timeout=5) as resp:
            model = json.loads(resp.read())["data"][0]["id"]
        log("starting the router" + (" under cProfile" if args.profile_router else ""))
        router_args = [] if args.grpc_stream_interval_s is None else \
            ["--grpc-stream-interval-s", str(args.grpc_stream_interval_s)]
        router_args += shlex.split(args.router_args)
        if "envoy" in args.front:
            router_args.append("--envoy-picker")
        router_http, router_grpc, router_proc = start_router(procs, engines, data_dir, router_cpus,
                                                              args.profile_router, extra=router_args)
        peer_url, peer_reason, peer_proc = None, "", None
        if not args.no_peer:
            exe, peer_reason = vllm_router_bin(not args.no_install_peer)
            if exe is not None:
                try:
                    peer_url, peer_proc = start_vllm_router(procs, exe, engines, data_dir, pinning.get("vllm_router"))
                except (RuntimeError, OSError) as exc:
                    peer_reason = f"vllm-router did not start: {exc}"
        else:
            peer_reason = "skipped (--no-peer or --quick)"
        envoy_url, envoy_proc = None, None
        if "envoy" in args.front:
            from greenserve.bench.router_envoy_front import PathMeter, start_envoy_front

            log("starting Envoy (the router its endpoint picker)")
            envoy_url, envoy_proc = start_envoy_front(procs, router_grpc, data_dir, pinning.get("vllm_router"),
                                                      usage_reader=args.envoy_usage_reader)
        alone_url, alone_proc = None, None
        if args.envoy_alone:
            from greenserve.bench.router_envoy_front import start_envoy_alone

            log("starting Envoy alone (no picker, round-robin)")
            alone_url, alone_proc = start_envoy_alone(procs, engines, data_dir, pinning.get("vllm_router"))
        prompt = ("You are a helpful assistant answering questions about carbon-aware serving. " * 64)[
            : args.prompt_chars]
        base = {"model": model, "max_tokens": args.max_tokens, "prompt": prompt, "stagger_s": args.stagger_s,
                "max_tokens_spread": args.max_tokens_spread}
        targets: list[tuple[str, str, dict[str, Any]]] = [("direct", "http", {"targets": engines})]
        if "http" in protocols:
            targets.append(("router", "http", {"targets": [router_http]}))
        if "grpc" in protocols:
            targets.append(("router", "grpc", {"targets": [router_grpc]}))
        if peer_url:
            targets.append(("vllm-router", "http", {"targets": [peer_url]}))
        if envoy_url:
            targets.append(("envoy", "http", {"targets": [envoy_url]}))
        if alone_url:
            targets.append(("envoy-alone", "http", {"targets": [alone_url]}))
        pid_of = {"router": router_proc.pid, "vllm-router": peer_proc.pid if peer_proc else None,
                  "envoy-alone": alone_proc.pid if alone_proc else None}

        def meter_of(name: str, proto: str) -> Any:
            if name == "envoy" and envoy_proc is not None:  # Envoy and the router (the picker) both on the path
                return PathMeter(router_proc.pid, envoy_proc.pid, router_http)
            return RunMeter(pid_of.get(name), router_http if (name, proto) == ("router", "http") else None)
        loadgen_cpus = len(side) if side else len(os.sched_getaffinity(0))
        # warm-up: connections, caches and pools
        for _name, proto, t in targets:
            run_load({**base, **t, "protocol": proto, "concurrency": 4, "requests": 16, "stagger_s": 0.0}, 120, 1,
                      side)
        rows: list[dict[str, Any]] = []
        paired_rows: list[dict[str, Any]] = []
        paired_targets = {("router", "http"), ("vllm-router", "http"), ("envoy", "http")}
        if args.paired_grpc or "http" not in protocols:
            paired_targets.add(("router", "grpc"))
        def requests_at(level: int) -> int:
            """Requests of a count-bounded run; about one per stream falls in the ramp, unmeasured."""
            return max(args.min_requests, level * args.requests_per_stream) + (level if args.stagger_s > 0 else 0)

        def procs_at(level: int) -> int:
            return args.loadgen_procs or max(1, min(loadgen_cpus, (level + 127) // 128))

        for level in levels:
            n = 10**9 if args.duration_s else requests_at(level)
            nprocs = procs_at(level)
            direct: dict[str, Any] | None = None
            what = f"{args.duration_s:g} s" if args.duration_s else f"{n} requests"
            for name, proto, t in targets:
                log(f"level {level}: {name} over {proto} ({what}, {nprocs} load process(es))")
                meter = meter_of(name, proto)
                eng0 = engine_ttft_totals(engines)
                load = {**base, **t, "protocol": proto, "concurrency": level, "requests": n}
                if args.duration_s:
                    load["duration_s"] = args.duration_s
                summary = run_summary(run_load(load, 600, nprocs, side))
                row = {"target": name, "protocol": proto, "concurrency": level, **summary}
                eng1 = engine_ttft_totals(engines)
                if eng1[1] > eng0[1]:
                    row["engine_ttft_mean_ms"] = round(1000.0 * (eng1[0] - eng0[0]) / (eng1[1] - eng0[1]), 3)
                    row["ttft_mean_ms"] = summary.pop("_ttft_mean_ms")
                summary.pop("_ttft_mean_ms", None)
                row.pop("_ttft_mean_ms", None)
                row.update(meter.figures(summary["requests"]))
                if name == "direct":
                    direct = summary
                elif direct is not None:
                    row["added_ttft_p50_ms"] = round(summary["ttft_p50_ms"] - direct["ttft_p50_ms"], 3)
                    row["added_ttft_p99_ms"] = round(summary["ttft_p99_ms"] - direct["ttft_p99_ms"], 3)
                    row["added_e2e_p50_ms"] = round(summary["e2e_p50_ms"] - direct["e2e_p50_ms"], 3)
                rows.append(row)
                log(json.dumps(row))
            # paired phase: ``level`` streams through the router and ``level`` streams straight to the
            # engines at the same time; the direct group is the control (same engines, same instant)
            for name, proto, t in targets:
                if name == "direct" or (name, proto) not in paired_targets:
                    continue
                log(f"level {level}: paired {name} over {proto} + direct ({what} each, {nprocs} load "
                     "process(es) each)")
                meter = meter_of(name, proto)
                eng0 = engine_ttft_totals(engines)
                routed_cfg = {**base, **t, "protocol": proto, "concurrency": level, "requests": n}
                # the control group's prompts come from another index range: no identical prompt in both
                direct_cfg = {**base, "targets": engines, "protocol": "http", "concurrency": level, "requests": n,
                              "index_offset": 10**12}
                if args.duration_s:
                    routed_cfg["duration_s"] = direct_cfg["duration_s"] = args.duration_s
                routed_res, direct_res = run_loads([(routed_cfg, nprocs), (direct_cfg, nprocs)], 600, side)
                rs, ds = run_summary(routed_res), run_summary(direct_res)
                rs.pop("_ttft_mean_ms", None)
                ds.pop("_ttft_mean_ms", None)
                prow: dict[str, Any] = {
                    "target": name, "protocol": proto, "concurrency": level, **rs,
                    "added_ttft_p50_ms": round(rs["ttft_p50_ms"] - ds["ttft_p50_ms"], 3),
                    "added_ttft_p99_ms": round(rs["ttft_p99_ms"] - ds["ttft_p99_ms"], 3),
                    "added_e2e_p50_ms": round(rs["e2e_p50_ms"] - ds["e2e_p50_ms"], 3),
                    "routed_rps": rs["rps"], "direct_rps": ds["rps"], "direct": ds,
                }
                eng1 = engine_ttft_totals(engines)
                if eng1[1] > eng0[1]:  # both groups together: the engines cannot tell them apart
                    prow["engine_ttft_mean_ms"] = round(1000.0 * (eng1[0] - eng0[0]) / (eng1[1] - eng0[1]), 3)
                prow.update(meter.figures(rs["requests"]))
                paired_rows.append(prow)
                log("paired " + json.dumps(prow))
        # throughput phase: short outputs at the highest level, where per-request work (not streaming)
        # bounds the rate, so the routers themselves are the bottleneck
        tp_rows: list[dict[str, Any]] = []
        if args.throughput_max_tokens > 0:
            level = max(levels)
            n, nprocs = requests_at(level), procs_at(level)
            for name, proto, t in targets:
                if proto != "http":
                    continue
                log(f"throughput: {name} over http, {level} streams, max_tokens {args.throughput_max_tokens}")
                meter = meter_of(name, "throughput")
                load = {**base, **t, "protocol": "http", "concurrency": level, "requests": n,
                        "max_tokens": args.throughput_max_tokens, "stagger_s": min(args.stagger_s, 1.0)}
                summary = run_summary(run_load(load, 600, nprocs, side))
                summary.pop("_ttft_mean_ms", None)
                row = {"target": name, "protocol": "http", "concurrency": level,
                       "max_tokens": args.throughput_max_tokens, **summary}
                row.update(meter.figures(summary["requests"]))
                tp_rows.append(row)
                log("throughput " + json.dumps(row))

        def tp_rps(target: str) -> float | None:
            return next((r["rps"] for r in tp_rows if r["target"] == target), None)

        def at_256(of: list[dict[str, Any]]) -> dict[str, Any] | None:
            return next((r for r in of if r["concurrency"] == 256), of[-1] if of else None)

        def router_rows(of: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [r for r in of if r["target"] == "router" and r["protocol"] == "http"] or \
                [r for r in of if r["target"] == "router"]

        seq_ours = router_rows(rows)
        seq_head = at_256(seq_ours)
        ours = router_rows(paired_rows)
        head = at_256(ours)
        seq_peer_rows = [r for r in rows if r["target"] == "vllm-router"]
        seq_peer_head = at_256(seq_peer_rows)
        peer_rows = [r for r in paired_rows if r["target"] == "vllm-router"]
        peer_head = at_256(peer_rows)

        def seq_cpu(target: str, proto: str) -> float | None:
            """CPU per request of one target in the sequential phase at the headline level (every target
            ran the same load there, one after another)."""
            level = seq_head["concurrency"] if seq_head else None
            row = next((r for r in rows if (r["target"], r["protocol"], r["concurrency"]) == (target, proto, level)),
                       None)
            return row.get("router_cpu_ms_per_request") if row else None

        result = {
            "design": "paired",
            "design_note": "added TTFT = routed TTFT percentile - direct TTFT percentile of N streams through "
                           "the router and N streams straight to the same engines run at the same time "
                           "(the control group); max_rps is from the sequential phase, where the router has "
                           "the engines alone; the sequential phases' differences are under 'sequential'",
            "added_ttft_p50_ms": head["added_ttft_p50_ms"] if head else None,
            "added_ttft_p99_ms": head["added_ttft_p99_ms"] if head else None,
            "concurrency": head["concurrency"] if head else None,
            "protocol": head["protocol"] if head else None,
            "routed_rps": head["routed_rps"] if head else None,
            "direct_rps": head["direct_rps"] if head else None,
            "max_rps": max([r["rps"] for r in seq_ours] + [x for x in [tp_rps("router")] if x is not None],
                           default=None),
            "throughput": tp_rows,
            "router_overhead_p50_ms_le": head.get("router_overhead_p50_ms_le") if head else None,
            "router_overhead_p99_ms_le": head.get("router_overhead_p99_ms_le") if head else None,
            "router_cpu_ms_per_request": head.get("router_cpu_ms_per_request") if head else None,
            # CPU per request of each front and of vllm-router, sequential phase at the headline level
            "grpc_cpu_ms_per_request": seq_cpu("router", "grpc"),
            "http_cpu_ms_per_request": seq_cpu("router", "http"),
            "vllm_router_cpu_ms_per_request": seq_cpu("vllm-router", "http"),
            "grpc_stream_interval_s": args.grpc_stream_interval_s,
            "direct_max_rps": max([r["rps"] for r in rows if r["target"] == "direct"]
                                  + [x for x in [tp_rps("direct")] if x is not None], default=None),
            "levels": paired_rows,
            "sequential": {
                "note": "direct, then each router, one after another at each level: the engines' queueing "
                        "differs between the runs and shows in these differences",
                "added_ttft_p50_ms": seq_head.get("added_ttft_p50_ms") if seq_head else None,
                "added_ttft_p99_ms": seq_head.get("added_ttft_p99_ms") if seq_head else None,
                "concurrency": seq_head["concurrency"] if seq_head else None,
                "levels": rows,
            },
            "peers": {"vllm-router": (
                {"version": VLLM_ROUTER_VERSION, "policy": "round_robin", "design": "paired",
                 "added_ttft_p50_ms": peer_head["added_ttft_p50_ms"], "added_ttft_p99_ms": peer_head["added_ttft_p99_ms"],
                 "concurrency": peer_head["concurrency"], "routed_rps": peer_head["routed_rps"],
                 "direct_rps": peer_head["direct_rps"],
                 "max_rps": max([r["rps"] for r in seq_peer_rows]
                                + [x for x in [tp_rps("vllm-router")] if x is not None], default=None),
                 "cpu_ms_per_request": peer_head.get("router_cpu_ms_per_request"),
                 "e2e_p50_ms": peer_head["e2e_p50_ms"],
                 "sequential": ({"added_ttft_p50_ms": seq_peer_head.get("added_ttft_p50_ms"),
                                 "added_ttft_p99_ms": seq_peer_head.get("added_ttft_p99_ms"),
                                 "rps_at_concurrency": seq_peer_head["rps"]} if seq_peer_head else None)}
                if peer_head else {"skipped": peer_reason or "not run"})},
            "fronts": {"envoy": {**_envoy_summary(rows, paired_rows, tp_rows, seq_head),
                                 "usage_reader": args.envoy_usage_reader,
                                 "alone_cpu_ms_per_request": seq_cpu("envoy-alone", "http") if alone_url else None}
                       if envoy_url else
                       {"skipped": "not asked (--front envoy)"}},
            "cpu_pinning": pinning,
            "engine": args.engine if args.engine == "emulator" else f"noop (tpot {args.noop_tpot_s:g} s)",
            "nice": args.nice,
            "host_load": {"before": host_before, "after": host_load()},
            "setup": {"engines": args.engines, "time_scale": args.time_scale, "max_tokens": args.max_tokens,
                      "max_tokens_spread": args.max_tokens_spread, "stagger_s": args.stagger_s,
                      "prompt_chars": args.prompt_chars, "cpu_count": os.cpu_count(), "model": model,
                      "quick": args.quick, "duration_s": args.duration_s,
                      "loadgen_procs": args.loadgen_procs or "auto",
                      "profiled": bool(args.profile_router)},
        }
    except Exception as exc:  # noqa: BLE001 - the bench reports its failure as JSON too
        log(f"failed: {exc}")
        print(json.dumps({"error": str(exc), **result}))
        return 1
    finally:
        procs.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    if args.replicas_phase:  # its own processes, after the other phases' are gone
        try:
            result.update(bench_replicas.phase_result(args))
        except Exception as exc:  # noqa: BLE001 - the figures of the other phases are still printed
            log(f"replicas phase failed: {type(exc).__name__}: {exc}")
            result["replicas_phase"] = {"error": f"{type(exc).__name__}: {exc}"}
    if args.workers_phase > 1:  # its own processes too
        from greenserve.bench.router_workers import phase_or_error

        result.update(phase_or_error(args.workers_phase))
    print(json.dumps(result))
    return 0


def _envoy_summary(rows: list[dict[str, Any]], paired: list[dict[str, Any]], tp_rows: list[dict[str, Any]],
                   seq_head: dict[str, Any] | None) -> dict[str, Any]:
    """The Envoy front's headline: paired added TTFT at 256 streams (else the highest level), CPU per request of
    Envoy + picker in the sequential phase at the same level, receipts per request over every run."""
    mine = [r for r in paired if r["target"] == "envoy"]
    head = next((r for r in mine if r["concurrency"] == 256), mine[-1] if mine else None)
    level = seq_head["concurrency"] if seq_head else None
    seq = next((r for r in rows if r["target"] == "envoy" and r["concurrency"] == level), None)
    every = [r for r in [*rows, *paired, *tp_rows] if r["target"] == "envoy"]
    return {
        "added_ttft_p50_ms": head["added_ttft_p50_ms"] if head else None,
        "added_ttft_p99_ms": head["added_ttft_p99_ms"] if head else None,
        "concurrency": head["concurrency"] if head else None,
        "routed_rps": head["routed_rps"] if head else None,
        "cpu_ms_per_request": seq.get("router_cpu_ms_per_request") if seq else None,
        "envoy_cpu_ms_per_request": seq.get("envoy_cpu_ms_per_request") if seq else None,
        "picker_cpu_ms_per_request": seq.get("picker_cpu_ms_per_request") if seq else None,
        "max_rps": max([r["rps"] for r in every], default=None),
        "requests": sum(r["requests"] for r in every),
        "receipts": sum(r.get("receipts", 0) for r in every),
    }


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
