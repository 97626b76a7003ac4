"""The workers phase of ``greenserve bench router`` (``--workers-phase N``): ``workers_speedup``.

Throughput through the router with ``--workers N`` over the same with ``--workers 1``, the engine made
so cheap that the router is the bottleneck: the no-op engine of ``bench_engine.py`` (uvloop, a raw
protocol, prebuilt SSE in the emulator's format), by default writing each stream whole at once
(``--engine-tpot-s`` 0; > 0 streams a token per tick). Each run is a closed loop of ``--concurrency``
streams over HTTP for ``--duration-s`` after a ramp, short outputs (``--max-tokens``), the same load for
both worker counts; both routers run at once and are loaded in turn, ``--rounds`` times, and the
speedup is the median of the rounds' ratios (other load on a shared machine drifts). The router is
pinned to its CPUs (the last N the bench may use; on a machine with fewer than 2N CPUs it shares all of
them with the engine and the load generator, which is then said in ``cpu_pinning``). Also reported per run: the router's CPU per request (supervisor and workers summed),
the load generator's CPU, and the worker pids that served (``x-greenserve-worker-pid``).

Alone: ``python -m greenserve.bench.router_workers --workers 2`` (last line: one JSON object).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from greenserve.common.cli_parser import Parser
from greenserve.bench.router_engine import DEFAULT_MODEL, serve_args

NOOP_MODEL = DEFAULT_MODEL


# -- the no-op engine: bench_engine.py ------------------------------------------------------------------


def _start_noop_engine(procs: Any, cpus: list[int] | None, tpot_s: float = 0.0) -> tuple[str, int]:
    """A bench_engine.py engine in a process of its own (``tpot_s`` 0: each stream written at once)."""
    from greenserve.bench.router_launch import bench_popen, env, wait_http

    proc = procs.add(bench_popen([sys.executable, *serve_args(tpot_s=tpot_s)], cpus,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env()))
    line = proc.stdout.readline().decode()
    if "listening on" not in line:
        raise RuntimeError(f"no-op engine did not start: {line!r}")
    url = line.strip().rsplit(" ", 1)[-1]
    wait_http(url + "/health", 30, proc)
    return url, proc.pid


# -- the phase ------------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _worker_pids_answering(url: str, want: int, timeout_s: float) -> set[int]:
    """Pids seen in x-greenserve-worker-pid over new connections until ``want`` distinct ones (or the time)."""
    import urllib.request

    from greenserve.router.workers import WORKER_HEADER

    seen: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while len(seen) < want and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                pid = resp.headers.get(WORKER_HEADER)
                if pid:
                    seen.add(int(pid))
        except OSError:
            pass
        time.sleep(0.02)
    return seen


def _cpu_of(pids: list[int]) -> float:
    from greenserve.bench.router_measure import proc_cpu_s

    return sum(proc_cpu_s(p) for p in pids)


def plan_cpus(workers: int) -> dict[str, Any]:
    """The router on the last ``workers`` CPUs, the engine and load generator on the others when there are
    enough; else everything shares every CPU (the router still pinned to them)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2 * workers:
        return {"shared": False, "router": cpus[-workers:], "others": cpus[:-workers]}
    return {"shared": True, "router": cpus, "others": None,
            "note": f"{len(cpus)} CPUs < 2 x {workers} workers: router, engine and load generator share them"}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def run_phase(workers: int, *, concurrency: int = 64, duration_s: float = 10.0, max_tokens: int = 16,
              loadgen_procs: int = 2, ramp_s: float = 1.0, rounds: int = 3, engine_tpot_s: float = 0.0
              ) -> dict[str, Any]:
    """Runs ``rounds`` rounds of (--workers 1, --workers ``workers``) under the same load, both routers
    started once and loaded in turn (the idle one only scrapes its engine), so that a machine whose
    other load drifts affects both alike; ``workers_speedup`` is the median over the rounds of the
    ratio of their rps. Returns the JSON keys ``workers_speedup`` and ``workers``."""
    from greenserve.bench import router_launch as bench_launch
    from greenserve.bench.router_launch import Procs, start_router
    from greenserve.bench.router_measure import host_load, run_load, run_summary

    pinning = plan_cpus(workers)
    procs = Procs()
    data_dir = tempfile.mkdtemp(prefix="gs-bench-workers-")
    runs: list[dict[str, Any]] = []
    ratios: list[float] = []
    host_before = host_load()
    try:
        engine, engine_pid = _start_noop_engine(procs, pinning["others"], engine_tpot_s)
        routers = {}
        for n in (1, workers):
            run_dir = Path(data_dir) / f"w{n}"
            run_dir.mkdir()
            router_http, _, proc = start_router(procs, [engine], str(run_dir), pinning["router"], workers=n)
            if n > 1 and len(_worker_pids_answering(router_http, n, 120)) < n:
                raise RuntimeError(f"--workers {n}: fewer than {n} workers answered within 120 s")
            routers[n] = (router_http, [proc.pid, *_children(proc.pid)])
        for r in range(rounds):
            rps = {}
            for n, (router_http, pids) in routers.items():
                load = {"model": NOOP_MODEL, "prompt": "a short prompt for the workers phase",
                        "max_tokens": max_tokens, "max_tokens_spread": 0.0, "targets": [router_http],
                        "protocol": "http", "concurrency": concurrency, "requests": 10**9, "stagger_s": ramp_s}
                if r == 0:  # warm-up: connections, pools
                    run_load({**load, "concurrency": 8, "requests": 200, "stagger_s": 0.0}, 120, 1, pinning["others"])
                cpu0, engine0 = _cpu_of(pids), _cpu_of([engine_pid])
                summary = run_summary(run_load({**load, "duration_s": duration_s}, 600, loadgen_procs,
                                               pinning["others"]))
                cpu1, engine1 = _cpu_of(pids), _cpu_of([engine_pid])
                summary.pop("_ttft_mean_ms", None)
                runs.append({"round": r, "workers": n, **summary, "router_pids": pids,
                             "router_cpu_ms_per_request": round(1000.0 * (cpu1 - cpu0) / summary["requests"], 3)
                             if summary["requests"] else None,
                             "router_cpu_percent": round(100.0 * (cpu1 - cpu0) / duration_s, 1),
                             "engine_cpu_ms_per_request": round(1000.0 * (engine1 - engine0) / summary["requests"], 3)
                             if summary["requests"] else None})
                rps[n] = summary["rps"]
            if rps[1]:
                ratios.append(rps[workers] / rps[1])
    finally:
        procs.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return {
        "workers_speedup": round(_median(ratios), 3) if ratios else None,
        "workers": {"ratios": [round(x, 3) for x in ratios], "runs": runs, "cpu_pinning": pinning,
                    "cpu_count": len(os.sched_getaffinity(0)), "concurrency": concurrency,
                    "duration_s": duration_s, "max_tokens": max_tokens, "loadgen_procs": loadgen_procs,
                    "rounds": rounds, "engine": f"no-op (bench_engine.py, tpot {engine_tpot_s:g} s)",
                    "nice": bench_launch.NICE,
                    "host_load": {"before": host_before, "after": host_load()}},
    }


def phase_or_error(workers: int) -> dict[str, Any]:
    """``run_phase`` for ``greenserve bench router --workers-phase N``: a failure is reported, not raised."""
    try:
        return run_phase(workers)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return {"workers_speedup": None, "workers": {"error": str(exc)}}


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m greenserve.bench.router_workers", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="workers of the run compared with --workers 1")
    p.add_argument("--concurrency", type=int, default=64, help="streams of the closed loop")
    p.add_argument("--duration-s", type=float, default=10.0, help="measured seconds per run (after the ramp)")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens per request")
    p.add_argument("--loadgen-procs", type=int, default=2, help="load-generator processes")
    p.add_argument("--rounds", type=int, default=3, help="rounds of (1 worker, N workers); the median ratio is taken")
    p.add_argument("--engine-tpot-s", type=float, default=0.0,
                   help="seconds between the no-op engine's tokens (0: each stream written at once)")
    p.add_argument("--nice", type=int, default=0,
                   help="niceness of every process started (as bench router's --nice; negative needs root)")
    p.add_argument("--json", action="store_true", help="(default) print the result as one JSON line")
    args = p.parse_args(argv)
    from greenserve.bench.router_launch import exit_on_sigterm

    exit_on_sigterm()
    if args.workers < 2:
        p.error("--workers: must be >= 2")
    for name in ("concurrency", "max_tokens", "loadgen_procs", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be >= 1")
    if not args.duration_s > 0:
        p.error("--duration-s: must be > 0")
    if not args.engine_tpot_s >= 0:
        p.error("--engine-tpot-s: must be >= 0")
    from greenserve.bench import router_launch as bench_launch

    bench_launch.NICE = args.nice  # the launcher every bench process starts through applies it
    try:
        result = run_phase(args.workers, concurrency=args.concurrency, duration_s=args.duration_s,
                           max_tokens=args.max_tokens, loadgen_procs=args.loadgen_procs, rounds=args.rounds,
                           engine_tpot_s=args.engine_tpot_s)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(json.dumps({"error": str(exc), "workers_speedup": None}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
