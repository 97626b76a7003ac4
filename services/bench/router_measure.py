"""Measurement of a run of ``greenserve bench router`` (bench.py): the load generator (bench_loadgen.py) run
in processes pinned beside the engines, its samples merged and summarised (percentiles, rps, its own CPU);
what a run cost the router process (CPU and run-queue wait per request) and what the router's and the
engines' own histograms saw; the machine's load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from greenserve.bench.router_launch import bench_popen, env


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    k = min(len(v) - 1, max(0, round(q / 100.0 * (len(v) - 1))))
    return v[k]

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


def host_load() -> dict[str, Any]:
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


def run_load(cfg: dict[str, Any], timeout_s: float, procs: int = 1, cpus: list[int] | None = None) -> dict[str, Any]:
    """Runs the load generator in ``procs`` processes (streams and requests split among them, all
    starting at the same instant) and merges their samples; ``loadgen_cpu_percent`` is their CPU time
    over the run's wall time (100 = one core busy), so a saturated generator shows."""
    return run_loads([(cfg, procs)], timeout_s, cpus)[0]


def run_loads(groups: list[tuple[dict[str, Any], int]], timeout_s: float,
               cpus: list[int] | None = None) -> list[dict[str, Any]]:
    """Runs several load groups at once (each ``(config, processes)``): every process of every group
    starts at the same wall-clock instant, so the groups share the same engines at the same time (the
    paired design: routed streams and their direct control group). One merged result per group."""
    code = "from greenserve.bench.router_loadgen import loadgen_entry; loadgen_entry()"
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
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env())
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


def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_summary(res: dict[str, Any]) -> dict[str, Any]:
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


def engine_ttft_totals(engines: list[str]) -> tuple[float, float]:
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


class RunMeter:
    """What one run cost a router process and what its own histogram saw: readings taken at the start
    of the run (``pid`` None: a direct run, nothing to read; ``router_http`` None: no histogram)."""

    def __init__(self, pid: int | None, router_http: str | None = None) -> None:
        self.pid = pid
        self.router_http = router_http
        self.cpu0 = proc_cpu_s(pid) if pid else 0.0
        self.wait0 = _runqueue_wait_s(pid) if pid else 0.0
        self.buckets0 = _overhead_buckets(router_http) if router_http else {}

    def figures(self, requests: int) -> dict[str, Any]:
        """Per request served: the process's CPU (all threads; includes idle background work such as
        scrapes, small at these rates) and run-queue wait; the overhead histogram's p50/p99 buckets."""
        out: dict[str, Any] = {}
        if self.pid and requests:
            out["router_cpu_ms_per_request"] = round(1000.0 * (proc_cpu_s(self.pid) - self.cpu0) / requests, 3)
            out["router_runqueue_wait_ms_per_request"] = round(
                1000.0 * (_runqueue_wait_s(self.pid) - self.wait0) / requests, 3)
        if self.router_http:
            after = _overhead_buckets(self.router_http)
            out["router_overhead_p50_ms_le"] = _bucket_quantile(self.buckets0, after, 50)
            out["router_overhead_p99_ms_le"] = _bucket_quantile(self.buckets0, after, 99)
        return out
