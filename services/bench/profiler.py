"""`greenserve bench profiler`: simulator sweep speed, and (``--agreement``) engine-backend agreement.

Part 1 (always): a profiler started in-process (its own SQLite file in a temporary folder) runs one
SWEEP_BACKEND_SIMULATOR sweep of 17 LMCache DRAM sizes (0..16 GiB) x 10 request rates of one model through
StartSweep/WatchSweep, every point persisted (cache sizes pre-filled first). Figures: points, seconds (StartSweep
to the last event), points_per_second, cpu_seconds (of this process; wall time on a shared machine is
inflated by other jobs).

Part 2 (``--agreement``): a real emulated engine (``greenserve-engine-sim`` in its own process, time scale 0.25)
is swept by the ENGINE backend over a rate ladder, and the same configuration by the SIMULATOR backend.
Figures: at the lowest rate, client-side mean TTFT/TPOT vs the emulator's own ``vllm:`` histograms over the
window (target: within 10 %); over the ladder, engine vs simulator mean TTFT/TPOT (target: within 15 %), the
emulator's own histograms vs the simulator (same arrivals, same step cost: what differs is real-time pacing on
this host), and the engine point's power (the emulator's modelled energy counter; NVML is off) vs the
simulator's. Per point: the client's and the emulator's CPU share and the load average, since both processes
share the host with whatever else runs there.
Progress goes to stderr; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from greenserve.common import strict_json
from greenserve.common.cli_parser import Parser
from greenserve.common.parent_death import dies_with_parent
from greenserve.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc

GIB = 1 << 30


def _parser(prog: str) -> argparse.ArgumentParser:
    p = Parser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="accepted for symmetry; the last line is always JSON")
    p.add_argument("--model", default="llama3-8b", help="simulator model (default llama3-8b)")
    p.add_argument("--hardware", default="H100-80GB", help="hardware (default H100-80GB)")
    p.add_argument("--workload", default="multiturn", help="sweep workload (default multiturn)")
    p.add_argument("--cache-sizes", type=int, default=17, help="DRAM sizes 0, 1, ... GiB (default 17)")
    p.add_argument("--rates", type=int, default=10, help="rates 0.5, 1.0, ... req/s (default 10)")
    p.add_argument("--point-duration-s", type=float, default=120.0, help="virtual seconds per point (default 120)")
    p.add_argument("--stop-rule", choices=["full", "stop"], default="full",
                   help="full: every point measured (default); stop: ladders stop below the SLO target")
    p.add_argument("--agreement", action="store_true", help="also run part 2 (engine vs emulator vs simulator)")
    p.add_argument("--agreement-workloads", default="sharegpt,longbench",
                   help="workloads of part 2, comma-separated (default sharegpt,longbench: GreenLLM Table II P50 sizes)")
    p.add_argument("--agreement-rates", default="1,2,4,8,16", help="rates of part 2, req/s (default 1,2,4,8,16)")
    p.add_argument("--agreement-duration-s", type=float, default=10.0,
                   help="modelled seconds per engine point after a 2 s warm-up (default 10)")
    p.add_argument("--agreement-min-requests", type=int, default=40,
                   help="measured requests per point at least: a low rate's window is lengthened (default 40)")
    p.add_argument("--agreement-time-scale", type=float, default=0.25,
                   help="emulator time scale of part 2 (default 0.25: the modelled engine runs 4x slower than real "
                        "time, so the host's own milliseconds per request, the HTTP round trip between two Python "
                        "processes on a shared machine, weigh a quarter as much; see docs/profiler.md)")
    return p


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def _serve(data_dir: Path) -> Any:
    from greenserve.common.app import start_service
    from greenserve.common.telemetry import setup_telemetry
    from greenserve.profiler.service import ProfilerSettings, build

    settings = ProfilerSettings.model_validate({"host": "127.0.0.1", "port": 0, "data_dir": data_dir,
                                                "import_published": False, "log_level": "WARNING"})
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    telemetry = setup_telemetry("profiler", span_exporter=InMemorySpanExporter(), install_global=False)
    return await start_service(settings, build, telemetry=telemetry)


async def _sweep(stub: Any, spec: profiler_pb2.SweepSpec) -> tuple[profiler_pb2.Sweep, list[Any], float]:
    started = time.perf_counter()
    sweep = (await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))).sweep
    points = []
    async for event in stub.WatchSweep(profiler_pb2.WatchSweepRequest(sweep_id=sweep.id)):
        if event.HasField("point"):
            points.append(event.point)
            if len(points) % 20 == 0:
                _log(f"  {len(points)}/{event.sweep.total_points} points, eta {event.sweep.eta_s:.1f} s")
        sweep = event.sweep
    return sweep, points, time.perf_counter() - started


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rel(a: float, b: float) -> float:
    return (a - b) / b if b else math.nan


SLOS = {  # GreenLLM Table II
    "sharegpt": common_pb2.Slo(ttft_s=0.2, tpot_s=0.08, attainment_fraction=0.9),
    "humaneval": common_pb2.Slo(ttft_s=0.125, tpot_s=0.2, attainment_fraction=0.9),
    "longbench": common_pb2.Slo(ttft_s=15.0, tpot_s=0.15, attainment_fraction=0.9),
}


def _cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) a process has used so far (Linux /proc), None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


async def _agreement_one(stub: Any, ns: argparse.Namespace, url: str, workload: str, emulator_pid: int) -> dict[str, Any]:
    from greenserve.profiler.engine_backend import EngineBackend
    from greenserve.profiler.method import resolve
    from greenserve.profiler.settings_view import EngineSettingsView

    rates = [float(r) for r in ns.agreement_rates.split(",")]
    slo = SLOS.get(workload, common_pb2.Slo(ttft_s=1.0, tpot_s=0.1, attainment_fraction=0.9))

    def specs(rate: float) -> tuple[profiler_pb2.SweepSpec, profiler_pb2.SweepSpec]:
        # a window long enough for --agreement-min-requests: a request's TTFT depends on where in a step it arrives
        # (up to one step of wait), so a mean over 10 requests is several per cent off by chance alone
        base = dict(configs=[common_pb2.ProfileConfig(model=ns.model, hardware=ns.hardware)],
                    request_rates_per_s=[rate], workload=workload, slo=slo, seed=7,
                    point_duration_s=max(ns.agreement_duration_s, ns.agreement_min_requests / rate),
                    method=common_pb2.ProfileMethod(warmup_s=2.0, stop_rule=common_pb2.LADDER_STOP_RULE_FULL_LADDER))
        return (profiler_pb2.SweepSpec(backend=profiler_pb2.SWEEP_BACKEND_ENGINE, engine_url=url,
                                       engine_modelled_s_per_wall_s=ns.agreement_time_scale, **base),
                profiler_pb2.SweepSpec(backend=profiler_pb2.SWEEP_BACKEND_SIMULATOR, **base))

    # the engine points are measured here with the backend object itself, to read its /metrics windows
    backend = EngineBackend(EngineSettingsView(nvml_power="off"))
    _log(f"part 2: {workload} on the emulated engine (time scale {ns.agreement_time_scale:g}), rates {rates}")
    engine_points, windows, cpu, emu_cpu, loads = [], [], [], [], []
    try:
        for rate in rates:
            engine_spec = specs(rate)[0]
            c0, t0 = _cpu_s(emulator_pid), time.monotonic()
            point = await backend.measure(engine_spec, engine_spec.configs[0], rate, resolve(engine_spec))
            c1, t1 = _cpu_s(emulator_pid), time.monotonic()
            engine_points.append(point)
            windows.append(backend.last_window)
            cpu.append(backend.last_client_cpu_fraction)
            # the emulator's CPU share over the point (warm-up included): near 1 it cannot keep its pacing
            emu_cpu.append((c1 - c0) / (t1 - t0) if c0 is not None and c1 is not None and t1 > t0 else None)
            loads.append(os.getloadavg()[0])
            _log(f"  {rate:g} req/s: ttft mean {point.ttft_mean_s * 1e3:.1f} ms, tpot mean {point.tpot_mean_s * 1e3:.2f}"
                 f" ms, attainment {point.slo_attainment_fraction:.3f}, client cpu {cpu[-1]:.2f}, emulator cpu "
                 f"{emu_cpu[-1] if emu_cpu[-1] is not None else math.nan:.2f}, power {point.power_w:.0f} W "
                 f"({point.power_source}), load average {loads[-1]:.1f}")
    finally:
        await backend.close()
    sim_points = [(await _sweep(stub, specs(rate)[1]))[1][0] for rate in rates]
    rows = []
    for e, s, w, c, ec, load in zip(engine_points, sim_points, windows, cpu, emu_cpu, loads, strict=True):
        rows.append({
            "rate_per_s": e.request_rate_per_s, "requests": e.requests, "client_cpu_fraction": c,
            "emulator_cpu_fraction": ec, "load_average_1m": load,
            "client_ttft_mean_s": e.ttft_mean_s, "emulator_ttft_mean_s": w.ttft_mean_s if w else None,
            "simulator_ttft_mean_s": s.ttft_mean_s,
            "client_tpot_mean_s": e.tpot_mean_s, "emulator_tpot_mean_s": w.tpot_mean_s if w else None,
            "simulator_tpot_mean_s": s.tpot_mean_s,
            "ttft_rel_vs_emulator": _rel(e.ttft_mean_s, w.ttft_mean_s) if w and w.ttft_mean_s else None,
            "tpot_rel_vs_emulator": _rel(e.tpot_mean_s, w.tpot_mean_s) if w and w.tpot_mean_s else None,
            "ttft_rel_vs_simulator": _rel(e.ttft_mean_s, s.ttft_mean_s),
            "tpot_rel_vs_simulator": _rel(e.tpot_mean_s, s.tpot_mean_s),
            "client_attainment": e.slo_attainment_fraction, "simulator_attainment": s.slo_attainment_fraction,
            # power: the emulator's modelled energy counter over the window (no NVML here) vs the replay's model
            "engine_power_w": e.power_w, "engine_power_source": e.power_source, "simulator_power_w": s.power_w,
            "power_rel_vs_simulator": _rel(e.power_w, s.power_w) if e.power_source else None,
        })

    def worst(key: str) -> float | None:
        vals = [abs(r[key]) for r in rows if r[key] is not None and math.isfinite(r[key])]
        return max(vals) if vals else None

    low = rows[0]
    return {
        "workload": workload, "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        "low_load_ttft_rel_vs_emulator": low["ttft_rel_vs_emulator"],
        "low_load_tpot_rel_vs_emulator": low["tpot_rel_vs_emulator"],
        "ladder_max_abs_ttft_rel_vs_simulator": worst("ttft_rel_vs_simulator"),
        "ladder_max_abs_tpot_rel_vs_simulator": worst("tpot_rel_vs_simulator"),
        "ladder_max_abs_emulator_ttft_rel_vs_simulator": max(
            (abs(_rel(r["emulator_ttft_mean_s"], r["simulator_ttft_mean_s"])) for r in rows
             if r["emulator_ttft_mean_s"]), default=None),
        "ladder_max_abs_power_rel_vs_simulator": worst("power_rel_vs_simulator"),
        "ladder": rows,
    }


async def _agreement(stub: Any, ns: argparse.Namespace) -> dict[str, Any]:
    import httpx

    profile = f"{ns.model}@{ns.hardware}"
    port = _free_port()
    # Its own session, so it dies with the bench only by the parent-death signal: else it outlives kill -9.
    emu = subprocess.Popen(dies_with_parent([sys.executable, "-m", "greenserve.simulator.emulator", "--port", str(port),
                                             "--profile", profile, "--time-scale", str(ns.agreement_time_scale)]),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
        results = [await _agreement_one(stub, ns, url, w, emu.pid) for w in ns.agreement_workloads.split(",")]
    finally:
        os.killpg(emu.pid, signal.SIGTERM)
        emu.wait(timeout=30)
    return {"profile": profile, "time_scale": ns.agreement_time_scale, "workloads": results}


async def _run(ns: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        server = await _serve(Path(tmp))
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = profiler_pb2_grpc.ProfilerServiceStub(channel)
                rates = [0.5 * (i + 1) for i in range(ns.rates)]
                spec = profiler_pb2.SweepSpec(
                    backend=profiler_pb2.SWEEP_BACKEND_SIMULATOR, workload=ns.workload, request_rates_per_s=rates,
                    slo=common_pb2.Slo(ttft_s=1.0, tpot_s=0.1, attainment_fraction=0.9),
                    point_duration_s=ns.point_duration_s,
                    configs=[common_pb2.ProfileConfig(model=ns.model, hardware=ns.hardware, cache_dram_bytes=g * GIB)
                             for g in range(ns.cache_sizes)],
                    method=common_pb2.ProfileMethod(stop_rule=(common_pb2.LADDER_STOP_RULE_FULL_LADDER
                                                               if ns.stop_rule == "full"
                                                               else common_pb2.LADDER_STOP_RULE_STOP_BELOW_TARGET)))
                _log(f"part 1: simulator sweep, {ns.cache_sizes} cache sizes x {ns.rates} rates of "
                     f"{ns.model}@{ns.hardware}, workload {ns.workload}")
                cpu0 = time.process_time()
                sweep, points, seconds = await _sweep(stub, spec)
                cpu_s = time.process_time() - cpu0
                out: dict[str, Any] = {
                    "bench": "profiler", "points": len(points), "seconds": round(seconds, 3),
                    "points_per_second": round(len(points) / seconds, 2) if seconds else None,
                    "state": profiler_pb2.SweepState.Name(sweep.state), "skipped_points": sweep.skipped_points,
                    "profiles": len(sweep.profile_ids), "workload": ns.workload,
                    "requests_measured": int(sum(p.requests for p in points)),
                    "cpu_seconds": round(cpu_s, 3),  # this process (client and profiler): what the load cannot inflate
                    "within_30_s": seconds <= 30.0,
                }
                if ns.agreement:
                    out["agreement"] = await _agreement(stub, ns)
        finally:
            await server.stop(0)
    return out


def _check_flags(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """parser.error (exit 2) naming the first bad flag: else it ends as a traceback midway through the bench."""
    if ns.cache_sizes < 1 or ns.rates < 1:
        parser.error("--cache-sizes and --rates: must be >= 1")
    if not (math.isfinite(ns.point_duration_s) and 0 < ns.point_duration_s <= 3600):
        parser.error(f"--point-duration-s: must be in (0, 3600] virtual seconds, got {ns.point_duration_s}")
    if not ns.agreement:
        return
    try:
        rates = [float(r) for r in ns.agreement_rates.split(",")]
    except ValueError:
        rates = []
    if not rates or not all(math.isfinite(r) and r > 0 for r in rates) or rates != sorted(set(rates)):
        parser.error(f"--agreement-rates: ascending rates > 0 req/s, comma-separated, got {ns.agreement_rates!r}")
    if not (math.isfinite(ns.agreement_duration_s) and 0 < ns.agreement_duration_s <= 3600):
        parser.error(f"--agreement-duration-s: must be in (0, 3600] s, got {ns.agreement_duration_s}")
    if not 1 <= ns.agreement_min_requests <= 1_000_000:
        parser.error(f"--agreement-min-requests: must be in 1..1000000, got {ns.agreement_min_requests}")
    if not (math.isfinite(ns.agreement_time_scale) and 0 < ns.agreement_time_scale <= 1000):
        parser.error(f"--agreement-time-scale: must be in (0, 1000], got {ns.agreement_time_scale}")


def main(argv: list[str], prog: str = "greenserve bench profiler") -> int:
    parser = _parser(prog)
    ns = parser.parse_args(argv)
    _check_flags(parser, ns)
    try:
        out = asyncio.run(_run(ns))
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:  # the profiler refused the sweep the flags make
            raise
        parser.error(exc.details() or "the profiler refused the sweep")
    print(strict_json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
