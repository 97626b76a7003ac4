"""Profile a real vLLM engine (CPU build, tiny random Llama), calibrate the simulator on part of the ladder and
predict the rest.

1. One real engine (``greenserve.vllm_cpu.engines``, ``--engine-omp-threads`` OpenMP threads), or the one at
   ``--engine-url``.
2. The profiler's own engine backend (``EngineBackend.measure``: open-loop Poisson arrivals, streamed
   ``/v1/completions``, client-side TTFT/TPOT, batch size from ``/metrics``) over ``--rates`` x ``--workloads``
   (fixed-size workloads: every request has the dataset's P50 prompt/output length), ``--rounds`` times
   interleaved (``profiler.rounds``: a point pools its rounds' requests). Each workload's ladder is one MEASURED
   ``common.Profile`` (validated as ``ProfileStore.put`` validates it), written as protobuf JSON into ``--out``
   (``profile-<workload>.json``; ``greenserve profile show``'s fields); ``result.json`` keeps each round's p50s
   and their spread.
3. Calibration: the points at ``--fit-rates`` of every workload give the prefill and decode points that
   ``greenserve profile calibrate`` takes (``profiler.calibrate.calibration_points``), fitted jointly to a base
   profile of the tiny model on this CPU (``base_profile``: the tiny model's shape; datasheet-free CPU numbers
   whose efficiencies and step overhead the fit replaces).
4. Prediction: the simulator backend's point (``sim_backend.simulate_point``, the same workload, seed, warm-up and
   window) with the calibrated profile at every rate; the rates not in ``--fit-rates`` are the held-back ones.
   TTFT p50 and TPOT p50 relative errors are printed as a Markdown table and written to ``result.json``.
5. The CPU step model (``profiler.step_fit``, what ``greenserve bench calibration`` fits): fitted at ``--fit-rates``
   on ``--target`` (the client-side p50s, or the engine's own TTFT/TPOT means), its table printed and each
   workload's profile with the fitted coefficients written as ``calibrated-<out folder>-<workload>.json`` (for
   ``greenserve evaluate --profile``). The load average at the sweep's start and end and the process's CPU
   scheduling policy go into ``result.json``.

Run with greenserve's interpreter from the repository root (vLLM's own virtualenv, ``.venv-vllm``, serves). On a
shared machine, run it (and so the engine it starts) in the real-time class, so that other work does not preempt
the engine or the client mid-request (docs/profiler.md, "Real engine")::

    chrt -r 20 .venv/bin/python scripts/real_engine_profile.py --out OUT --rates 1,2,3,4,5 --fit-rates 1,3,5 \
        --rounds 4 --duration-s 15 --warmup-s 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format

from greenserve.common.cli_parser import Parser
from greenserve.profiler.calibrate import calibration_points
from greenserve.profiler.engine_backend import EngineBackend
from greenserve.profiler.keys import config_key
from greenserve.profiler.method import as_proto, resolve
from greenserve.profiler.points import PointExtras, RequestSamples, summarize
from greenserve.profiler.rounds import pooled_samples, round_spread
from greenserve.profiler.settings_view import EngineSettingsView
from greenserve.profiler.sim_backend import simulate_point
from greenserve.profiler.store import validate_profile
from greenserve.simulator.calibration import calibrate
from greenserve.simulator import engine_profile
from greenserve.simulator.engine_profile import EngineProfile
from greenserve.v1 import common_pb2, profiler_pb2

MODEL = engine_profile.TINY_LLAMA
HARDWARE = engine_profile.CPU
TINY_VOCAB = 700  # the tiny model's tokenizer trains to 744 tokens (tiny_model.VOCAB_SIZE 1024 is its upper bound)


def base_profile() -> EngineProfile:
    """The tiny model on a CPU (engine_profile.tiny_llama_cpu_profile) with the batch limit this roofline calibration
    was run with."""
    return engine_profile.tiny_llama_cpu_profile().with_overrides(max_num_seqs=256)


def spec_for(workload: str, rates: list[float], args: argparse.Namespace, url: str,
             backend: int = profiler_pb2.SWEEP_BACKEND_ENGINE, seed: int | None = None) -> profiler_pb2.SweepSpec:
    return profiler_pb2.SweepSpec(
        backend=backend, engine_url=url if backend == profiler_pb2.SWEEP_BACKEND_ENGINE else "",
        workload=workload, request_rates_per_s=rates, point_duration_s=args.duration_s,
        seed=args.seed if seed is None else seed,
        slo=common_pb2.Slo(ttft_s=args.ttft_slo_s, tpot_s=args.tpot_slo_s, attainment_fraction=0.9),
        configs=[common_pb2.ProfileConfig(model=MODEL, hardware=HARDWARE, workload=workload)],
        method=common_pb2.ProfileMethod(warmup_s=args.warmup_s, stop_rule=common_pb2.LADDER_STOP_RULE_FULL_LADDER))


def _ms(value: float | None) -> str:
    return f"{value * 1e3:.1f}" if value is not None else "-"


async def sweep(url: str, args: argparse.Namespace,
                engine_side: dict[tuple[str, float], dict[str, Any]]) -> dict[str, common_pb2.Profile]:
    """One measured profile per workload, through the profiler's engine backend, in ``--rounds`` interleaved
    rounds (round k measures every workload and rate once, with seed ``--seed`` + k: new prompts and arrivals), so
    that a change of the machine's load over the sweep reaches every rate alike. A point is its rounds' requests
    pooled (client-side per-request timings: exact p50s). ``engine_side`` gets each point's mean of vLLM's own TTFT
    and per-request TPOT histograms over its windows (its /metrics), each round's p50s and the spread."""
    backend = EngineBackend(EngineSettingsView(nvml_power="off"), vocab_high=args.vocab_size)
    samples: dict[tuple[str, float], list[RequestSamples]] = {}
    per_round: dict[tuple[str, float], list[dict[str, Any]]] = {}
    specs: dict[str, profiler_pb2.SweepSpec] = {}
    try:
        for k in range(args.rounds):
            for workload in args.workloads:
                spec = spec_for(workload, args.rates, args, url, seed=args.seed + k)
                specs.setdefault(workload, spec)
                await backend.prepare(spec)
                method = resolve(spec)
                for rate in args.rates:
                    t0 = time.monotonic()
                    point = await backend.measure(spec, spec.configs[0], rate, method)
                    win = backend.last_window
                    assert backend.last_samples is not None
                    samples.setdefault((workload, rate), []).append(backend.last_samples)
                    row = {"round": k, "requests": point.requests, "failed": point.failed_requests,
                           "ttft_p50_s": point.ttft_p50_s, "tpot_p50_s": point.tpot_p50_s,
                           "batch": point.mean_batch_size, "load_average_1m": os.getloadavg()[0],
                           "client_cpu_fraction": backend.last_client_cpu_fraction,
                           "engine_ttft_mean_s": win.ttft_mean_s if win else None,
                           "engine_tpot_mean_s": win.tpot_mean_s if win else None}
                    per_round.setdefault((workload, rate), []).append(row)
                    print(f"round {k + 1}/{args.rounds} {workload} {rate:g}/s: {point.requests} req, "
                          f"{point.failed_requests} failed, TTFT p50 {point.ttft_p50_s * 1e3:.1f} ms, TPOT p50 "
                          f"{point.tpot_p50_s * 1e3:.2f} ms, batch {point.mean_batch_size:.2f}, engine-side TTFT/TPOT "
                          f"means {_ms(row['engine_ttft_mean_s'])}/{_ms(row['engine_tpot_mean_s'])} ms, client CPU "
                          f"{backend.last_client_cpu_fraction:.2f}, load {row['load_average_1m']:.1f}, "
                          f"{time.monotonic() - t0:.0f} s", flush=True)
    finally:
        await backend.close()
    profiles = {}
    for workload, spec in specs.items():
        points = []
        for rate in args.rates:
            rounds = per_round[(workload, rate)]
            batches = [r["batch"] for r in rounds if r["batch"] > 0]
            extras = PointExtras(mean_batch_size=float(np.mean(batches)) if batches else math.nan)
            points.append(summarize(rate, pooled_samples(samples[(workload, rate)]), spec.slo, extras))
            means = {}
            for q in ("engine_ttft_mean_s", "engine_tpot_mean_s"):
                values = [r[q] for r in rounds if r[q]]
                means[q] = float(np.mean(values)) if values else None
            engine_side[(workload, rate)] = {**means, "rounds": rounds, **round_spread(samples[(workload, rate)])}
        config = spec.configs[0]
        profile = common_pb2.Profile(
            config_key=config_key(config), version=1, config=config, slo=spec.slo, points=points,
            source=common_pb2.PROFILE_SOURCE_MEASURED, method=as_proto(resolve(spec)),
            note=f"real vLLM {args.vllm_version} (CPU build, tiny random Llama, float32, --enforce-eager) on "
                 f"{os.cpu_count()} shared CPU cores, engine backend of greenserve.profiler, {args.rounds} "
                 f"interleaved round(s) of {args.duration_s:g} s per point pooled")
        profile.created_at.GetCurrentTime()
        validate_profile(profile)
        profiles[workload] = profile
    return profiles


def fit_and_predict(profiles: dict[str, common_pb2.Profile], args: argparse.Namespace) -> dict[str, Any]:
    fit_rates = set(args.fit_rates)
    prefill, decode = [], []
    for _workload, profile in profiles.items():
        part = common_pb2.Profile()
        part.CopyFrom(profile)
        del part.points[:]
        part.points.extend(p for p in profile.points if p.request_rate_per_s in fit_rates)
        pre, dec = calibration_points(part)
        prefill += pre
        decode += [d for _, d in dec]
    report = calibrate(base_profile(), prefill=prefill, decode=decode, label=f"{MODEL}@{HARDWARE} measured")
    print("fitted:", {k: f"{v:.4g}" for k, v in report.fitted.items()}, "rms:", report.rms_relative_error)
    rows = []
    for workload, profile in profiles.items():
        spec = spec_for(workload, args.rates, args, "", profiler_pb2.SWEEP_BACKEND_SIMULATOR)
        method = resolve(spec)
        for measured in profile.points:
            rate = measured.request_rate_per_s
            predicted = simulate_point(spec.configs[0], rate, spec, method, report.profile)
            row: dict[str, Any] = {"workload": workload, "rate_per_s": rate, "held_back": rate not in fit_rates,
                                   "measured_batch": measured.mean_batch_size,
                                   "predicted_batch": predicted.mean_batch_size}
            row["predicted_ttft_mean_s"], row["predicted_tpot_mean_s"] = predicted.ttft_mean_s, predicted.tpot_mean_s
            for q in ("ttft_p50_s", "tpot_p50_s"):
                m, p = getattr(measured, q), getattr(predicted, q)
                row[f"measured_{q}"], row[f"predicted_{q}"] = m, p
                row[f"{q}_error"] = p / m - 1.0 if m > 0 else math.nan
            rows.append(row)
    held = [r for r in rows if r["held_back"]]
    summary = {q: max(abs(r[f"{q}_error"]) for r in held) if held else math.nan for q in ("ttft_p50_s", "tpot_p50_s")}
    return {"fitted": report.fitted, "rms_relative_error": report.rms_relative_error, "rows": rows,
            "max_abs_error_held_back": summary}


def table(result: dict[str, Any]) -> str:
    lines = ["| workload | rate (req/s) | held back | TTFT p50 measured (ms) | predicted (ms) | error | "
             "TPOT p50 measured (ms) | predicted (ms) | error | batch measured / predicted |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(
            f"| {r['workload']} | {r['rate_per_s']:g} | {'yes' if r['held_back'] else 'no (fit)'} | "
            f"{r['measured_ttft_p50_s'] * 1e3:.1f} | {r['predicted_ttft_p50_s'] * 1e3:.1f} | "
            f"{r['ttft_p50_s_error']:+.1%} | {r['measured_tpot_p50_s'] * 1e3:.2f} | "
            f"{r['predicted_tpot_p50_s'] * 1e3:.2f} | {r['tpot_p50_s_error']:+.1%} | "
            f"{r['measured_batch']:.2f} / {r['predicted_batch']:.2f} |")
    return "\n".join(lines)


def scheduler() -> str:
    """This process's CPU scheduling policy and priority (``chrt -r 20`` reads "SCHED_RR 20")."""
    names = {getattr(os, n): n for n in ("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE", "SCHED_FIFO", "SCHED_RR")
             if hasattr(os, n)}
    policy = os.sched_getscheduler(0)
    return f"{names.get(policy, str(policy))} {os.sched_getparam(0).sched_priority}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vllm_version() -> str:
    import subprocess

    from greenserve.vllm_cpu import engines
    done = subprocess.run([str(engines.python()), "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
                          capture_output=True, text=True, timeout=60)
    return done.stdout.strip() or "unknown"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    floats = lambda s: [float(x) for x in s.split(",")]  # noqa: E731
    ap = Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the profiles, result.json, engine log")
    ap.add_argument("--engine-url", default="", help="an engine already serving tiny-llama (default: start one)")
    ap.add_argument("--profiles-from", type=Path, default=None,
                    help="no sweep: calibrate and predict on the profile-*.json (and engine-side figures of "
                         "result.json) a previous run wrote there; the rates are the stored ones")
    ap.add_argument("--workloads", type=lambda s: s.split(","), default=["humaneval", "longbench"])
    ap.add_argument("--rates", type=floats, default=[1.0, 2.0, 3.0, 4.0, 5.0], help="req/s, ascending")
    ap.add_argument("--fit-rates", type=floats, default=None,
                    help="rates the calibration sees (default 1,3,5; with --profiles-from the stored run's)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="interleaved rounds: each measures every workload and rate once; a point pools its rounds")
    ap.add_argument("--engine-omp-threads", type=int, default=1,
                    help="OMP_NUM_THREADS of the engine this script starts (0: vLLM's default, every core). One: "
                         "on 2 shared cores a step's OpenMP team waits at each barrier for a thread the API server "
                         "or another process preempted, so step times jump with whatever else runs")
    ap.add_argument("--target", choices=("client-p50", "engine-mean"), default="client-p50",
                    help="what the CPU step model is fitted to and scored on (greenserve bench calibration's --target)")
    ap.add_argument("--duration-s", type=float, default=20.0, help="measurement window per point")
    ap.add_argument("--warmup-s", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--vocab-size", type=int, default=TINY_VOCAB,
                    help="prompt token ids stay below it (vLLM refuses ids beyond the tokenizer's vocabulary)")
    ap.add_argument("--ttft-slo-s", type=float, default=10.0)
    ap.add_argument("--tpot-slo-s", type=float, default=1.0)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds: at least 1")
    if args.engine_omp_threads < 0:
        ap.error("--engine-omp-threads: 0 (vLLM's default) or more")
    if args.profiles_from:
        stored_rates(ap, args)
    elif args.fit_rates is None:
        args.fit_rates = [1.0, 3.0, 5.0]
    if not set(args.fit_rates) <= set(args.rates):
        ap.error(f"--fit-rates must be among the rates ({', '.join(f'{r:g}' for r in args.rates)})")
    return args


def stored_rates(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """With --profiles-from: the rates are those of the stored profiles, the fit rates (unless given) the stored
    run's (its arguments, else its rows not held back); a missing or unreadable file is a usage error naming it."""
    args.profiles = {}
    for workload in args.workloads:
        path = args.profiles_from / f"profile-{workload}.json"
        try:
            args.profiles[workload] = json_format.Parse(path.read_text(), common_pb2.Profile())
        except (OSError, json_format.ParseError) as exc:
            ap.error(f"--profiles-from: no readable profile-{workload}.json there ({exc.__class__.__name__})")
    try:
        args.previous = json.loads((args.profiles_from / "result.json").read_text())
    except (OSError, ValueError) as exc:
        ap.error(f"--profiles-from: no readable result.json there ({exc.__class__.__name__})")
    args.rates = sorted({p.request_rate_per_s for pr in args.profiles.values() for p in pr.points})
    if args.fit_rates is None:
        args.fit_rates = [float(r) for r in args.previous.get("args", {}).get("fit_rates") or []] or sorted(
            {float(r["rate_per_s"]) for r in args.previous.get("rows", []) if r.get("held_back") is False})
        if not args.fit_rates:
            ap.error("--fit-rates: the stored run does not say its fit rates; give them")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.profiles_from:
        return refit(args)
    args.vllm_version = vllm_version()
    engine = None
    t0 = time.monotonic()
    try:
        url = args.engine_url
        if not url:
            from greenserve.vllm_cpu import engines
            reason = engines.unavailable_reason()
            if reason:
                sys.exit(f"real vLLM unavailable: {reason}")
            scratch = Path(tempfile.mkdtemp(prefix="real-profile-"))
            model = engines.ensure_model(scratch / "tiny-llama")
            env = {**os.environ, "OMP_NUM_THREADS": str(args.engine_omp_threads)} if args.engine_omp_threads else None
            engine = engines.start(model, port=free_port(), log_path=args.out / "vllm.log", scratch=scratch / "vllm",
                                   env=env)
            print(f"engine healthy after {engine.wait_healthy():.1f} s", flush=True)
            url = engine.url
        t_sweep = time.monotonic()
        load_start = os.getloadavg()
        engine_side: dict[tuple[str, float], dict[str, Any]] = {}
        profiles = asyncio.run(sweep(url, args, engine_side))
        sweep_s = time.monotonic() - t_sweep
        load_end = os.getloadavg()
    finally:
        if engine is not None:
            engine.stop()
            shutil.rmtree(scratch, ignore_errors=True)
    for workload, profile in profiles.items():
        (args.out / f"profile-{workload}.json").write_text(json_format.MessageToJson(profile))
    result = fit_and_predict(profiles, args)
    for row in result["rows"]:
        row.update(engine_side.get((row["workload"], row["rate_per_s"]), {}))
    result.update(sweep_wall_s=sweep_s, total_wall_s=time.monotonic() - t0, vllm=args.vllm_version,
                  cpus=os.cpu_count(), load_average_start=load_start, load_average_end=load_end,
                  nice=os.getpriority(os.PRIO_PROCESS, 0), scheduler=scheduler(),
                  args={k: v for k, v in vars(args).items() if k not in ("out",)})
    result = report(result, args)
    step_model(args, args.out)
    return result


def step_model(args: argparse.Namespace, folder: Path) -> None:
    """The CPU step model fitted on the sweep in ``folder`` at --fit-rates, to --target (bench calibration's run)."""
    from greenserve.bench import profiler_calibration as bench_calibration

    try:
        fitted = bench_calibration.run(folder, list(args.fit_rates), args.target, args.seed)
    except ValueError as exc:
        print(f"step model not fitted: {exc}", flush=True)
        return
    for workload, profile in fitted.pop("calibrated").items():
        bench_calibration.write_profile(args.out / f"calibrated-{args.out.name}-{workload}.json", profile)
    print("step model:", {k: f"{v:.3g}" for k, v in fitted["coefficients"].items()})
    print(bench_calibration.table(fitted))


def refit(args: argparse.Namespace) -> dict[str, Any]:
    """Calibration and prediction again on a previous run's profiles (other --fit-rates, a changed model)."""
    profiles, previous = args.profiles, args.previous
    result = fit_and_predict(profiles, args)
    engine_side = {(r["workload"], r["rate_per_s"]): r for r in previous.get("rows", [])}
    measured_keys = ("engine_ttft_mean_s", "engine_tpot_mean_s", "rounds", "round_ttft_p50_s", "round_tpot_p50_s",
                     "ttft_p50_s_round_range", "tpot_p50_s_round_range", "ttft_p50_s_split_half",
                     "tpot_p50_s_split_half")
    for row in result["rows"]:
        old = engine_side.get((row["workload"], row["rate_per_s"]), {})
        row.update({k: old[k] for k in measured_keys if k in old})
    result.update({k: previous.get(k) for k in ("sweep_wall_s", "vllm", "cpus", "load_average_start",
                                                "load_average_end", "nice")},
                  refit_of=str(args.profiles_from.name))
    result = report(result, args)
    step_model(args, args.profiles_from)
    return result


def engine_side_table(result: dict[str, Any]) -> str:
    """The engine's own TTFT / per-request TPOT means (its /metrics histograms over the window) against the
    simulator's means."""
    lines = ["| workload | rate (req/s) | held back | TTFT mean, engine (ms) | predicted (ms) | error | "
             "TPOT mean, engine (ms) | predicted (ms) | error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        cells = []
        for q in ("ttft", "tpot"):
            m, p = r.get(f"engine_{q}_mean_s"), r.get(f"predicted_{q}_mean_s")
            if m and p:
                cells += [f"{m * 1e3:.2f}", f"{p * 1e3:.2f}", f"{p / m - 1:+.1%}"]
            else:
                cells += ["-", "-", "-"]
        lines.append(f"| {r['workload']} | {r['rate_per_s']:g} | {'yes' if r['held_back'] else 'no (fit)'} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    held = [r for r in result["rows"] if r["held_back"] and r.get("engine_ttft_mean_s")]
    result["max_abs_engine_side_error_held_back"] = {
        q: max(abs(r[f"predicted_{q}_mean_s"] / r[f"engine_{q}_mean_s"] - 1) for r in held) if held else None
        for q in ("ttft", "tpot")}
    (args.out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print(table(result))
    print(engine_side_table(result))
    side = result["max_abs_engine_side_error_held_back"]
    print(f"held-back max |error|: client-side TTFT p50 {result['max_abs_error_held_back']['ttft_p50_s']:.1%}, "
          f"TPOT p50 {result['max_abs_error_held_back']['tpot_p50_s']:.1%}; engine-side TTFT mean "
          + (f"{side['ttft']:.1%}, TPOT mean {side['tpot']:.1%}" if side["ttft"] is not None else "-")
          + f"; sweep {result.get('sweep_wall_s') or 0:.0f} s")
    return result


if __name__ == "__main__":
    main()
