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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from greenserve.common.parent_death import on_parent_death

REPO = Path(__file__).resolve().parents[2]
VLLM_ROUTER_VERSION = "0.1.17"


def _log(msg: str) -> None:
    print(f"[bench router] {msg}", file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    k = min(len(v) - 1, max(0, round(q / 100.0 * (len(v) - 1))))
    return v[k]


# ------------------------------------------------------------------------------------------------------
# load generator (runs in its own process)
# ------------------------------------------------------------------------------------------------------


def _token_counts(seed: int, stream: int, lo: int, hi: int) -> Iterator[int]:
    """max_tokens of one stream's successive requests, uniform in [lo, hi]: seeded by (seed, stream),
    so every target of a run gets the same sequence."""
    rng = random.Random(seed * 1_000_003 + stream)
    while True:
        yield rng.randint(lo, hi)


async def _loadgen(cfg: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    concurrency = cfg["concurrency"]
    total = cfg["requests"]
    ttfts: list[float] = []
    e2es: list[float] = []
    ends: list[float] = []
    errors = 0
    counter = {"next": 0}
    prompt_base = cfg["prompt"]
    body_tpl = {"model": cfg["model"], "stream": True}
    # Desynchronised streams (see the module docstring): each stream's first request waits a random
    # fraction of ``stagger_s``, every request asks for a random number of tokens in max_tokens x
    # (1 +/- spread), and requests sent before ``stagger_s`` has passed are the ramp, not measured.
    stagger_s = float(cfg.get("stagger_s", 0.0))
    spread = float(cfg.get("max_tokens_spread", 0.0))
    lo_tokens = max(1, round(cfg["max_tokens"] * (1.0 - spread)))
    hi_tokens = max(lo_tokens, round(cfg["max_tokens"] * (1.0 + spread)))
    seed = int(cfg.get("seed", 0))

    # Time-bounded runs (``duration_s``): no new request starts after the deadline; every process of a
    # run starts at the same wall-clock instant (``start_at``) so that their loads overlap.
    duration_s = cfg.get("duration_s")
    start_at = cfg.get("start_at")
    if start_at:
        await asyncio.sleep(max(0.0, start_at - time.time()))
    begin = time.perf_counter()
    measure_from = begin + stagger_s
    stop_at = measure_from + duration_s if duration_s else None
    last_start = {"t": begin}
    cpu0 = time.process_time()
    offset = cfg.get("index_offset", 0)

    def next_index() -> int | None:
        i = counter["next"]
        if i >= total or (stop_at is not None and time.perf_counter() >= stop_at):
            return None
        counter["next"] = i + 1
        last_start["t"] = time.perf_counter()
        return i + offset

    def record(t0: float, first: float | None) -> None:
        """One finished request: a stream that never produced a first chunk counts as an error;
        requests of the ramp (sent before ``measure_from``) are not measured."""
        nonlocal errors
        if first is None:
            errors += 1
            return
        if t0 < measure_from:
            return
        now = time.perf_counter()
        ttfts.append(first - t0)
        e2es.append(now - t0)
        ends.append(now)

    def token_counts(w: int) -> Iterator[int]:
        return _token_counts(seed, offset + w, lo_tokens, hi_tokens)

    async def run_workers(worker: Any) -> float:
        async def delayed(w: int) -> None:
            if stagger_s > 0:
                await asyncio.sleep(random.Random(seed * 7919 + offset + w).uniform(0.0, stagger_s))
            await worker(w)

        await asyncio.gather(*(delayed(w) for w in range(concurrency)))
        # steady-state throughput: requests completed between the end of the ramp and the last
        # request sent (after it, streams only drain)
        done = [t for t in ends if t <= last_start["t"]]
        window = last_start["t"] - measure_from
        if len(done) >= 10 and window > 0:
            return window * len(ttfts) / len(done)
        return max(1e-9, (max(ends) if ends else time.perf_counter()) - measure_from)

    grpc_messages: list[int] = []  # messages per measured gRPC request
    if cfg["protocol"] == "grpc":
        import grpc
        from greenserve.v1 import router_pb2, router_pb2_grpc

        channels = [grpc.aio.insecure_channel(cfg["targets"][0], options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(max(1, min(8, concurrency // 64)))]
        stubs = [router_pb2_grpc.RouterServiceStub(c) for c in channels]

        async def worker(w: int) -> None:
            nonlocal errors
            stub = stubs[w % len(stubs)]
            tokens = token_counts(w)
            while (i := next_index()) is not None:
                req = router_pb2.GenerateRequest(
                    request=router_pb2.RequestDescriptor(model=cfg["model"], completion=router_pb2.CompletionInput(
                        prompt=f"{prompt_base} #{i}")),
                    sampling=router_pb2.SamplingParams(max_tokens=next(tokens)))
                t0 = time.perf_counter()
                first = None
                n = 0
                try:
                    async for msg in stub.Generate(req):
                        n += 1
                        if first is None and msg.text_delta:
                            first = time.perf_counter()
                except grpc.aio.AioRpcError:
                    errors += 1
                    continue
                record(t0, first)
                if first is not None and t0 >= measure_from:
                    grpc_messages.append(n)  # a message carries one or more tokens (the router's interval)

        elapsed = await run_workers(worker)
        for c in channels:
            await c.close()
    else:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
            targets = cfg["targets"]

            async def worker(w: int) -> None:
                nonlocal errors
                tokens = token_counts(w)
                while (i := next_index()) is not None:
                    url = targets[i % len(targets)] + "/v1/completions"
                    body = dict(body_tpl, prompt=f"{prompt_base} #{i}", max_tokens=next(tokens))
                    t0 = time.perf_counter()
                    first = None
                    try:
                        async with session.post(url, json=body) as resp:
                            if resp.status != 200:
                                await resp.read()
                                errors += 1
                                continue
                            async for chunk in resp.content.iter_any():
                                if first is None and chunk:
                                    first = time.perf_counter()
                    except (TimeoutError, aiohttp.ClientError, OSError):
                        errors += 1
                        continue
                    record(t0, first)

            elapsed = await run_workers(worker)
    return {"ttfts": ttfts, "e2es": e2es, "errors": errors, "elapsed_s": elapsed, "cpu_s": time.process_time() - cpu0,
            "wall_s": time.perf_counter() - begin, "grpc_messages": grpc_messages}


def _loadgen_entry() -> None:
    """Entry of the load-generator process: config JSON in the file named by argv[1] (or on stdin);
    the result JSON goes to the file the config names."""
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    cfg = json.loads(Path(sys.argv[1]).read_text() if len(sys.argv) > 1 else sys.stdin.read())
    result = asyncio.run(_loadgen(cfg))
    with open(cfg["out"], "w") as fh:  # a file, not a pipe: thousands of samples make a large object
        json.dump(result, fh)


_NICE = 0  # niceness given to every process the bench starts (--nice; 0 = inherit)


_LAUNCH = """
import os, sys
cpus, nice = sys.argv[1], int(sys.argv[2])
if cpus:
    os.sched_setaffinity(0, map(int, cpus.split(",")))
if nice:
    os.nice(nice)
    try:  # Linux autogroup: nice only ranks a process inside its session's group, so it gets a group of its own
        os.setsid()
        with open("/proc/self/autogroup", "w") as fh:
            fh.write(str(nice))
    except OSError:
        pass  # no autogroup (or no right to a negative group nice): the process nice still applies
os.execvp(sys.argv[3], sys.argv[3:])
"""


def _pinned(cmd: list[str], cpus: list[int] | None) -> list[str]:
    """``cmd`` started through a tiny launcher that pins itself to ``cpus``, applies ``--nice`` and
    execs ``cmd``: every thread the program starts later inherits both (a Rust router starts its
    threads at once, so pinning its pid after the start would miss them). With ``--nice`` the process
    also gets a session, hence a scheduler autogroup, of its own with that nice: where the kernel groups
    by session (``sched_autogroup_enabled``, the development VM), a process nice ranks a process only
    inside its group, and the router's group, its load all on one CPU, lost that CPU to other sessions'
    jobs (issue 22: the HTTP front's hidden TTFT; docs/router.md)."""
    if not cpus and not _NICE:
        return cmd
    return [sys.executable, "-c", _LAUNCH, ",".join(map(str, cpus or [])), str(_NICE), *cmd]


def bench_popen(cmd: list[str], cpus: list[int] | None = None, **kwargs: Any) -> subprocess.Popen[Any]:
    """Starts a process of a bench (engine, router, load generator), pinned and niced by ``_pinned``, that
    dies with the bench: the kernel sends it SIGTERM when the bench process dies, however it dies
    (``kill -9`` included), so a stopped bench leaves no engine or router behind (a router stops its
    own workers on SIGTERM). Start it from the bench's main thread (``parent_death``)."""
    return subprocess.Popen(_pinned(cmd, cpus), preexec_fn=on_parent_death(signal.SIGTERM), **kwargs)


def exit_on_sigterm() -> None:
    """SIGTERM ends a bench like Ctrl-C: its ``finally`` blocks stop the processes it started and remove its
    files (without this the default action killed it on the spot; ``bench_popen``'s children then got
    only their parent-death signal)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def _runqueue_wait_s(pid: int) -> float:
    """Seconds the process's threads have spent runnable but waiting for a CPU (Linux schedstat): how
    much the machine's other load delayed it."""
    total = 0.0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return float("nan")
    return total


def _host_load() -> dict[str, Any]:
    """Load average and CPU pressure (PSI) of the machine: other jobs on a shared host show here."""
    out: dict[str, Any] = {}
    try:
        out["loadavg_1m"] = float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError):
        pass
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0].split()
        out["cpu_pressure_some_avg60_percent"] = float(some[2].split("=")[1])
    except (OSError, ValueError, IndexError):
        pass
    return out


def _run_load(cfg: dict[str, Any], timeout_s: float, procs: int = 1, cpus: list[int] | None = None) -> dict[str, Any]:
    """Runs the load generator in ``procs`` processes (streams and requests split among them, all
    starting at the same instant) and merges their samples; ``loadgen_cpu_percent`` is their CPU time
    over the run's wall time (100 = one core busy), so a saturated generator shows."""
    return _run_loads([(cfg, procs)], timeout_s, cpus)[0]


def _run_loads(groups: list[tuple[dict[str, Any], int]], timeout_s: float,
               cpus: list[int] | None = None) -> list[dict[str, Any]]:
    """Runs several load groups at once (each ``(config, processes)``): every process of every group
    starts at the same wall-clock instant, so the groups share the same engines at the same time (the
    paired design: routed streams and their direct control group). One merged result per group."""
    code = "from greenserve.router.bench import _loadgen_entry; _loadgen_entry()"
    nprocs = [max(1, min(procs, cfg["concurrency"])) for cfg, procs in groups]
    with tempfile.TemporaryDirectory(prefix="gs-loadgen-") as tmp:
        running: list[list[tuple[subprocess.Popen[str], Path]]] = []
        start_at = time.time() + 1.0 + 0.3 * sum(nprocs)  # after every process has imported aiohttp/grpc
        for g, ((cfg, _), procs) in enumerate(zip(groups, nprocs)):
            mine = []
            for k in range(procs):
                share = {
                    **cfg, "out": str(Path(tmp) / f"result-{g}-{k}.json"), "start_at": start_at,
                    "concurrency": cfg["concurrency"] // procs + (1 if k < cfg["concurrency"] % procs else 0),
                    "requests": cfg["requests"] // procs + (1 if k < cfg["requests"] % procs else 0),
                    "index_offset": cfg.get("index_offset", 0) + k * (cfg["requests"] + 1),
                }
                cfg_file = Path(tmp) / f"config-{g}-{k}.json"
                cfg_file.write_text(json.dumps(share))
                proc = bench_popen([sys.executable, "-c", code, str(cfg_file)], cpus,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
                mine.append((proc, Path(share["out"])))
            running.append(mine)
        results = []
        for mine in running:
            merged: dict[str, Any] = {"ttfts": [], "e2es": [], "errors": 0, "elapsed_s": 0.0, "cpu_s": 0.0,
                                      "wall_s": 0.0, "grpc_messages": []}
            for proc, out in mine:
                try:
                    _, err = proc.communicate(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    for other in (q for group in running for q, _ in group):
                        if other.poll() is None:
                            other.kill()
                    raise RuntimeError("load generator timed out") from None
                if proc.returncode != 0 or not out.exists():
                    raise RuntimeError(f"load generator failed ({proc.returncode}): {(err or '')[-2000:]}")
                res = json.loads(out.read_text())
                merged["ttfts"] += res["ttfts"]
                merged["e2es"] += res["e2es"]
                merged["errors"] += res["errors"]
                merged["grpc_messages"] += res.get("grpc_messages", [])
                merged["elapsed_s"] = max(merged["elapsed_s"], res["elapsed_s"])
                merged["cpu_s"] += res["cpu_s"]
                merged["wall_s"] = max(merged["wall_s"], res["wall_s"])
            results.append(merged)
        return results


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _summary(res: dict[str, Any]) -> dict[str, Any]:
    ttft = [t * 1000 for t in res["ttfts"]]
    e2e = [t * 1000 for t in res["e2es"]]
    return {
        "requests": len(ttft), "errors": res["errors"],
        "ttft_p50_ms": round(_pct(ttft, 50), 3), "ttft_p99_ms": round(_pct(ttft, 99), 3),
        "e2e_p50_ms": round(_pct(e2e, 50), 3), "e2e_p99_ms": round(_pct(e2e, 99), 3),
        "rps": round(len(ttft) / res["elapsed_s"], 1) if res["elapsed_s"] > 0 else 0.0,
        "_ttft_mean_ms": round(sum(ttft) / len(ttft), 3) if ttft else None,
        "loadgen_cpu_percent": round(100.0 * res["cpu_s"] / res["wall_s"], 1) if res["wall_s"] > 0 else None,
        **({"grpc_messages_per_request": round(sum(m) / len(m), 1)} if (m := res.get("grpc_messages")) else {}),
    }


def _overhead_buckets(router_http: str) -> dict[float, float]:
    """Cumulative buckets of the router's own greenserve_router_overhead_seconds histogram."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(router_http + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "greenserve_router_overhead_seconds":
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    out[float(sample.labels["le"])] = sample.value
    return out


def _engine_ttft_totals(engines: list[str]) -> tuple[float, float]:
    """(sum of seconds, count) of the engines' own ``vllm:time_to_first_token_seconds`` histograms: the
    TTFT the engines measure themselves (arrival at the engine to first token), to tell queueing in
    the engines from time spent in the router."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    total_s, count = 0.0, 0.0
    for url in engines:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
        for family in text_string_to_metric_families(text):
            if family.name == "vllm:time_to_first_token_seconds":
                for sample in family.samples:
                    if sample.name.endswith("_sum"):
                        total_s += sample.value
                    elif sample.name.endswith("_count"):
                        count += sample.value
    return total_s, count


def _bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """Upper bound (ms) of the bucket holding quantile q of the observations between two readings."""
    les = sorted(after)
    deltas = [after[le] - before.get(le, 0.0) for le in les]
    if not deltas or deltas[-1] <= 0:
        return None
    target = q / 100.0 * deltas[-1]
    for le, cum in zip(les, deltas):
        if cum >= target:
            return le * 1000.0
    return None


class _RunMeter:
    """What one run cost a router process and what its own histogram saw: readings taken at the start
    of the run (``pid`` None: a direct run, nothing to read; ``router_http`` None: no histogram)."""

    def __init__(self, pid: int | None, router_http: str | None = None) -> None:
        self.pid = pid
        self.router_http = router_http
        self.cpu0 = _proc_cpu_s(pid) if pid else 0.0
        self.wait0 = _runqueue_wait_s(pid) if pid else 0.0
        self.buckets0 = _overhead_buckets(router_http) if router_http else {}

    def figures(self, requests: int) -> dict[str, Any]:
        """Per request served: the process's CPU (all threads; includes idle background work such as
        scrapes, small at these rates) and run-queue wait; the overhead histogram's p50/p99 buckets."""
        out: dict[str, Any] = {}
        if self.pid and requests:
            out["router_cpu_ms_per_request"] = round(1000.0 * (_proc_cpu_s(self.pid) - self.cpu0) / requests, 3)
            out["router_runqueue_wait_ms_per_request"] = round(
                1000.0 * (_runqueue_wait_s(self.pid) - self.wait0) / requests, 3)
        if self.router_http:
            after = _overhead_buckets(self.router_http)
            out["router_overhead_p50_ms_le"] = _bucket_quantile(self.buckets0, after, 50)
            out["router_overhead_p99_ms_le"] = _bucket_quantile(self.buckets0, after, 99)
        return out


# ------------------------------------------------------------------------------------------------------
# processes under test
# ------------------------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GREENSERVE_")}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    return env


class _Procs:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def add(self, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def _start_engine(procs: _Procs, args: argparse.Namespace, cpus: list[int] | None) -> str:
    cmd = [sys.executable, "-m", "greenserve.simulator.emulator", "--port", "0", "--time-scale", str(args.time_scale),
           "--max-num-seqs", str(args.max_num_seqs)]
    if args.model:
        cmd += ["--model", args.model]
    if args.engine == "noop":  # bench_engine.py: a token per --noop-tpot-s, the router the bottleneck
        from greenserve.router.bench_engine import DEFAULT_MODEL, serve_args

        cmd = [sys.executable, *serve_args(model=args.model or DEFAULT_MODEL, tpot_s=args.noop_tpot_s)]
    return _spawn_engine(procs, cmd, cpus, "engine emulator")


def _spawn_engine(procs: _Procs, cmd: list[str], cpus: list[int] | None, what: str) -> str:
    """Starts an engine that prints "... listening on URL" as its first line; its URL."""
    proc = procs.add(bench_popen(cmd, cpus, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env()))
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if "listening on" not in line:
        raise RuntimeError(f"{what} did not start: {line!r}")
    return line.strip().rsplit(" ", 1)[-1]


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except Exception as exc:  # noqa: BLE001
            last = str(exc)
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout_s:g}s ({last})")


_PROFILED_ROUTER = (
    "import cProfile, sys; from greenserve.router.__main__ import main; prof = cProfile.Profile(); "
    "prof.enable(); rc = main(sys.argv[2:]); prof.disable(); prof.dump_stats(sys.argv[1]); raise SystemExit(rc)"
)


def _start_router(procs: _Procs, engines: list[str], data_dir: str, cpus: list[int] | None,
                  profile: str | None = None, workers: int = 1, extra: list[str] | None = None
                  ) -> tuple[str, str, subprocess.Popen[bytes]]:
    """The router in a process of its own (``workers`` > 1: a supervisor and its workers, bench_workers.py);
    with ``profile``, under cProfile (stats written at exit)."""
    grpc_port, http_port = _free_port(), _free_port()
    entry = ["-c", _PROFILED_ROUTER, profile] if profile else ["-m", "greenserve.router"]
    cmd = [sys.executable, *entry, "--host", "127.0.0.1", "--port", str(grpc_port),
           "--http-port", str(http_port), "--engines", ",".join(engines), "--data-dir", data_dir,
           "--no-watch-plans", "--no-feeds", "--log-level", "WARNING", "--max-in-flight", "100000",
           "--workers", str(workers), *(extra or [])]
    log_file = open(Path(data_dir) / "router.log", "wb")  # noqa: SIM115 - closed with the process
    proc = procs.add(bench_popen(cmd, cpus, stdout=log_file, stderr=subprocess.STDOUT, env=_env()))
    url = f"http://127.0.0.1:{http_port}"
    _wait_http(url + "/health", 60, proc)
    return url, f"127.0.0.1:{grpc_port}", proc


def _vllm_router_bin(install: bool) -> tuple[Path | None, str]:
    venv = REPO / ".venv-vllm-router"
    exe = venv / "bin" / "vllm-router"
    if exe.exists():
        return exe, ""
    if not install:
        return None, "not installed and --no-install-peer given"
    _log(f"installing vllm-router=={VLLM_ROUTER_VERSION} into {venv.name} ...")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"vllm-router=={VLLM_ROUTER_VERSION}"],
                       check=True, capture_output=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        shutil.rmtree(venv, ignore_errors=True)
        return None, f"pip install vllm-router=={VLLM_ROUTER_VERSION} failed: {str(exc)[:200]} {detail[-300:]!r}"
    return (exe, "") if exe.exists() else (None, "vllm-router installed but its executable is missing")


def _start_vllm_router(procs: _Procs, exe: Path, engines: list[str], data_dir: str,
                       cpus: list[int] | None) -> tuple[str, subprocess.Popen[bytes]]:
    port = _free_port()
    cmd = [str(exe), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *engines,
           "--policy", "round_robin", "--log-level", "warning", "--disable-retries"]
    log_file = open(Path(data_dir) / "vllm-router.log", "wb")  # noqa: SIM115
    proc = procs.add(bench_popen(cmd, cpus, stdout=log_file, stderr=subprocess.STDOUT, env=_env()))
    url = f"http://127.0.0.1:{port}"
    _wait_http(url + "/health", 60, proc)
    return url, proc


# ------------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------------


def _cpu_plan(pin: bool) -> dict[str, Any]:
    """Which CPUs each part runs on. Pinned: the router (and, in its turn, vllm-router) alone on the
    last CPU; engines and load generator on the others, the same in direct and routed runs, so that the
    system under test neither steals from nor is slowed by the engines it is compared with."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return {"enabled": False, "reason": "--no-pin" if not pin else "fewer than 2 CPUs", "cpus": cpus}
    return {"enabled": True, "router": cpus[-1:], "vllm_router": cpus[-1:], "engines": cpus[:-1],
            "loadgen": cpus[:-1]}


def main(argv: list[str], prog: str = "greenserve bench router") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
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
    from greenserve.router import bench_replicas

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
    pinning = _cpu_plan(not args.no_pin)
    global _NICE
    _NICE = args.nice
    host_before = _host_load()
    side = pinning.get("engines")  # None when not pinned
    router_cpus = pinning.get("router")

    procs = _Procs()
    data_dir = tempfile.mkdtemp(prefix="gs-bench-router-")
    result: dict[str, Any] = {}
    try:
        _log(f"starting {args.engines} emulated engine(s); CPU pinning: {json.dumps(pinning)}")
        engines = [_start_engine(procs, args, side) for _ in range(args.engines)]
        for url in engines:
            _wait_http(url + "/health", 30)
        import urllib.request

        with urllib.request.urlopen(engines[0] + "/v1/models", timeout=5) as resp:
            model = json.loads(resp.read())["data"][0]["id"]
        _log("starting the router" + (" under cProfile" if args.profile_router else ""))
        router_args = [] if args.grpc_stream_interval_s is None else \
            ["--grpc-stream-interval-s", str(args.grpc_stream_interval_s)]
        router_args += shlex.split(args.router_args)
        router_http, router_grpc, router_proc = _start_router(procs, engines, data_dir, router_cpus,
                                                              args.profile_router, extra=router_args)
        peer_url, peer_reason, peer_proc = None, "", None
        if not args.no_peer:
            exe, peer_reason = _vllm_router_bin(not args.no_install_peer)
            if exe is not None:
                try:
                    peer_url, peer_proc = _start_vllm_router(procs, exe, engines, data_dir, pinning.get("vllm_router"))
                except (RuntimeError, OSError) as exc:
                    peer_reason = f"vllm-router did not start: {exc}"
        else:
            peer_reason = "skipped (--no-peer or --quick)"
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
        pid_of = {"router": router_proc.pid, "vllm-router": peer_proc.pid if peer_proc else None}
        loadgen_cpus = len(side) if side else len(os.sched_getaffinity(0))
        # warm-up: connections, caches and pools
        for name, proto, t in targets:
            _run_load({**base, **t, "protocol": proto, "concurrency": 4, "requests": 16, "stagger_s": 0.0}, 120, 1,
                      side)
        rows: list[dict[str, Any]] = []
        paired_rows: list[dict[str, Any]] = []
        paired_targets = {("router", "http"), ("vllm-router", "http")}
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
                _log(f"level {level}: {name} over {proto} ({what}, {nprocs} load process(es))")
                meter = _RunMeter(pid_of.get(name), router_http if (name, proto) == ("router", "http") else None)
                eng0 = _engine_ttft_totals(engines)
                load = {**base, **t, "protocol": proto, "concurrency": level, "requests": n}
                if args.duration_s:
                    load["duration_s"] = args.duration_s
                summary = _summary(_run_load(load, 600, nprocs, side))
                row = {"target": name, "protocol": proto, "concurrency": level, **summary}
                eng1 = _engine_ttft_totals(engines)
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
                _log(json.dumps(row))
            # paired phase: ``level`` streams through the router and ``level`` streams straight to the
            # engines at the same time; the direct group is the control (same engines, same instant)
            for name, proto, t in targets:
                if name == "direct" or (name, proto) not in paired_targets:
                    continue
                _log(f"level {level}: paired {name} over {proto} + direct ({what} each, {nprocs} load "
                     "process(es) each)")
                meter = _RunMeter(pid_of.get(name), router_http if (name, proto) == ("router", "http") else None)
                eng0 = _engine_ttft_totals(engines)
                routed_cfg = {**base, **t, "protocol": proto, "concurrency": level, "requests": n}
                # the control group's prompts come from another index range: no identical prompt in both
                direct_cfg = {**base, "targets": engines, "protocol": "http", "concurrency": level, "requests": n,
                              "index_offset": 10**12}
                if args.duration_s:
                    routed_cfg["duration_s"] = direct_cfg["duration_s"] = args.duration_s
                routed_res, direct_res = _run_loads([(routed_cfg, nprocs), (direct_cfg, nprocs)], 600, side)
                rs, ds = _summary(routed_res), _summary(direct_res)
                rs.pop("_ttft_mean_ms", None)
                ds.pop("_ttft_mean_ms", None)
                prow: dict[str, Any] = {
                    "target": name, "protocol": proto, "concurrency": level, **rs,
                    "added_ttft_p50_ms": round(rs["ttft_p50_ms"] - ds["ttft_p50_ms"], 3),
                    "added_ttft_p99_ms": round(rs["ttft_p99_ms"] - ds["ttft_p99_ms"], 3),
                    "added_e2e_p50_ms": round(rs["e2e_p50_ms"] - ds["e2e_p50_ms"], 3),
                    "routed_rps": rs["rps"], "direct_rps": ds["rps"], "direct": ds,
                }
                eng1 = _engine_ttft_totals(engines)
                if eng1[1] > eng0[1]:  # both groups together: the engines cannot tell them apart
                    prow["engine_ttft_mean_ms"] = round(1000.0 * (eng1[0] - eng0[0]) / (eng1[1] - eng0[1]), 3)
                prow.update(meter.figures(rs["requests"]))
                paired_rows.append(prow)
                _log("paired " + json.dumps(prow))
        # throughput phase: short outputs at the highest level, where per-request work (not streaming)
        # bounds the rate, so the routers themselves are the bottleneck
        tp_rows: list[dict[str, Any]] = []
        if args.throughput_max_tokens > 0:
            level = max(levels)
            n, nprocs = requests_at(level), procs_at(level)
            for name, proto, t in targets:
                if proto != "http":
                    continue
                _log(f"throughput: {name} over http, {level} streams, max_tokens {args.throughput_max_tokens}")
                meter = _RunMeter(pid_of.get(name))
                load = {**base, **t, "protocol": "http", "concurrency": level, "requests": n,
                        "max_tokens": args.throughput_max_tokens, "stagger_s": min(args.stagger_s, 1.0)}
                summary = _summary(_run_load(load, 600, nprocs, side))
                summary.pop("_ttft_mean_ms", None)
                row = {"target": name, "protocol": "http", "concurrency": level,
                       "max_tokens": args.throughput_max_tokens, **summary}
                row.update(meter.figures(summary["requests"]))
                tp_rows.append(row)
                _log("throughput " + json.dumps(row))

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
            "cpu_pinning": pinning,
            "engine": args.engine if args.engine == "emulator" else f"noop (tpot {args.noop_tpot_s:g} s)",
            "nice": args.nice,
            "host_load": {"before": host_before, "after": _host_load()},
            "setup": {"engines": args.engines, "time_scale": args.time_scale, "max_tokens": args.max_tokens,
                      "max_tokens_spread": args.max_tokens_spread, "stagger_s": args.stagger_s,
                      "prompt_chars": args.prompt_chars, "cpu_count": os.cpu_count(), "model": model,
                      "quick": args.quick, "duration_s": args.duration_s,
                      "loadgen_procs": args.loadgen_procs or "auto",
                      "profiled": bool(args.profile_router)},
        }
    except Exception as exc:  # noqa: BLE001 - the bench reports its failure as JSON too
        _log(f"failed: {exc}")
        print(json.dumps({"error": str(exc), **result}))
        return 1
    finally:
        procs.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    if args.replicas_phase:  # its own processes, after the other phases' are gone
        try:
            result.update(bench_replicas.phase_result(args))
        except Exception as exc:  # noqa: BLE001 - the figures of the other phases are still printed
            _log(f"replicas phase failed: {type(exc).__name__}: {exc}")
            result["replicas_phase"] = {"error": f"{type(exc).__name__}: {exc}"}
    if args.workers_phase > 1:  # its own processes too
        from greenserve.router.bench_workers import phase_or_error

        result.update(phase_or_error(args.workers_phase))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
