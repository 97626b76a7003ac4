"""`greenserve bench calibration`: the simulator's step model fitted on some rates of a stored real-engine sweep,
its error at the rates it did not see.

A sweep folder holds ``profile-<workload>.json`` (MEASURED profiles, protobuf JSON: the client-side p50s over the
pooled rounds of each point) and ``result.json`` (its ``rows`` carry the engine's own TTFT and per-request TPOT means
over each window, from vLLM's ``/metrics`` histograms, and the split-half spread of the p50s between rounds), as
``scripts/real_engine_profile.py`` writes them. The fit (``step_fit``) sees the ``--fit-rates`` (default: the ones
the sweep was calibrated on); the replay predicts every rate. The default target is the client-side p50s (exact per
request; vLLM's histogram buckets are too coarse for a p50); ``--target engine-mean`` fits and scores the engine's
means. Progress and the table go to stderr, one JSON object is the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from greenserve.common.cli_parser import Parser
from greenserve.profiler import step_fit
from greenserve.simulator.engine_profile import EngineProfile
from greenserve.v1 import common_pb2

STORED_SWEEP = Path(__file__).resolve().parents[1] / "profiler" / "data" / "real_engine_cpu"
"""The shipped sweeps of vLLM's CPU build on the tiny Llama (docs/profiler.md, "Real engine")."""

DEFAULT_RUN = "run3"
"""The shipped sweep ``greenserve bench calibration`` fits by default (a folder of ``STORED_SWEEP``)."""

TARGETS = {"engine-mean": ("ttft_mean_s", "tpot_mean_s"), "client-p50": ("ttft_p50_s", "tpot_p50_s")}


def load_sweep(folder: Path) -> tuple[dict[str, common_pb2.Profile], dict[tuple[str, float], dict[str, Any]]]:
    """The profiles (by workload) and the engine-side figures (by workload and rate) of one sweep folder;
    ValueError naming the file when one is missing or unreadable."""
    profiles = {}
    for path in sorted(folder.glob("profile-*.json")):
        try:
            profile = json_format.Parse(path.read_text(), common_pb2.Profile())
        except (OSError, json_format.ParseError) as exc:
            raise ValueError(f"{path.name}: not a profile ({exc})") from None
        profiles[profile.config.workload] = profile
    if not profiles:
        raise ValueError(f"--sweep: no profile-*.json in {folder.name}")
    engine: dict[tuple[str, float], dict[str, Any]] = {}
    result = folder / "result.json"
    if result.exists():
        try:
            rows = json.loads(result.read_text())["rows"]
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"result.json: unreadable ({exc})") from None
        engine = {(r["workload"], float(r["rate_per_s"])): r for r in rows}
    return profiles, engine


def measured(profile: common_pb2.Profile, engine: dict[tuple[str, float], dict[str, Any]], rate: float,
             quantity: str) -> float | None:
    """The measured figure: an engine-side mean from result.json, a p50 from the profile; None when absent."""
    if quantity.endswith("_mean_s"):
        value = engine.get((profile.config.workload, rate), {}).get(f"engine_{quantity}")
        return float(value) if value else None
    point = next((p for p in profile.points if p.request_rate_per_s == rate), None)
    value = getattr(point, quantity) if point is not None else 0.0
    return value if value > 0 else None


def stored_fit_rates(folder: Path) -> list[float]:
    """The rates the sweep in ``folder`` was calibrated on: its result.json's ``args.fit_rates``, else the rates of
    its rows not held back; empty when it says neither."""
    try:
        result = json.loads((folder / "result.json").read_text())
    except (OSError, ValueError):
        return []
    given = (result.get("args") or {}).get("fit_rates") or []
    if given:
        return sorted(float(r) for r in given)
    return sorted({float(r["rate_per_s"]) for r in result.get("rows", []) if r.get("held_back") is False})


def run(folder: Path, fit_rates: list[float] | None, target: str, seed: int = 11) -> dict[str, Any]:
    """Fit on ``fit_rates`` (None: the sweep's own, ``stored_fit_rates``) of the sweep in ``folder``, predict every
    rate; the rows and the held-back errors."""
    profiles, engine = load_sweep(folder)
    if fit_rates is None:
        fit_rates = stored_fit_rates(folder)
        if not fit_rates:
            raise ValueError(f"--fit-rates: sweep {folder.name} does not say its fit rates; give them")
    swept = {p.request_rate_per_s for profile in profiles.values() for p in profile.points}
    if not set(fit_rates) <= swept:
        raise ValueError(f"--fit-rates: sweep {folder.name} measured {', '.join(f'{r:g}' for r in sorted(swept))} "
                         f"req/s, not {', '.join(f'{r:g}' for r in fit_rates if r not in swept)}")
    quantities = TARGETS[target]
    observations = []
    for profile in profiles.values():
        for rate in fit_rates:
            for q in quantities:
                value = measured(profile, engine, rate, q)
                if value is not None:
                    observations.append(step_fit.Observation(profile, rate, q, value))
    if not observations:
        raise ValueError(f"--fit-rates: the sweep has no {target} figure at {fit_rates}")
    t0 = time.monotonic()
    fit = step_fit.fit_step_model(observations, seed=seed, label=f"real-engine sweep {folder.name}")
    fit_s = time.monotonic() - t0
    rows = []
    for workload, profile in profiles.items():
        rates = [p.request_rate_per_s for p in profile.points]
        predicted = step_fit.predict(profile, fit.profile, rates, seed)
        for rate in rates:
            row: dict[str, Any] = {"workload": workload, "rate_per_s": rate, "held_back": rate not in fit_rates}
            for q in ("ttft_mean_s", "tpot_mean_s", "ttft_p50_s", "tpot_p50_s"):
                m, p = measured(profile, engine, rate, q), getattr(predicted[rate], q)
                row[f"measured_{q}"], row[f"predicted_{q}"] = m, p
                row[f"{q}_error"] = p / m - 1.0 if m else None
            side = engine.get((workload, rate), {})
            for q in ("ttft_p50_s", "tpot_p50_s"):
                row[f"{q}_split_half"] = side.get(f"{q}_split_half")
            rows.append(row)
    held = [r for r in rows if r["held_back"]]
    worst = {}
    for q in ("ttft_mean_s", "tpot_mean_s", "ttft_p50_s", "tpot_p50_s"):
        errors = [abs(r[f"{q}_error"]) for r in held if r[f"{q}_error"] is not None]
        worst[q] = max(errors) if errors else None
    spread = {}
    for q in ("ttft_p50_s", "tpot_p50_s"):
        halves = [r[f"{q}_split_half"] for r in held if r[f"{q}_split_half"] is not None]
        spread[q] = max(halves) if halves else None
    citation = (f"greenserve bench calibration: {target} of sweep {folder.name} at "
                f"{', '.join(f'{r:g}' for r in fit_rates)} req/s")
    calibrated = {w: step_fit.with_fitted_facts(p, fit, citation) for w, p in profiles.items()}
    return {"sweep": folder.name, "target": target, "fit_rates": fit_rates, "coefficients": fit.coefficients,
            "calibrated": calibrated, "engine": fit.profile,
            "fit_rms_log_error": fit.rms_relative_error, "fit_s": fit_s, "rows": rows,
            "max_abs_error_held_back": worst, "max_split_half_held_back": spread}


def check_on(engine: EngineProfile, folder: Path, seed: int = 11) -> dict[str, Any]:
    """The fitted ``engine`` predicting every rate of another sweep (a repeat on another occasion): per workload and
    rate the measured and predicted p50s, and the largest |error|."""
    profiles, _ = load_sweep(folder)
    rows = []
    for workload, profile in profiles.items():
        predicted = step_fit.predict(profile, engine, [p.request_rate_per_s for p in profile.points], seed)
        for point in profile.points:
            row: dict[str, Any] = {"workload": workload, "rate_per_s": point.request_rate_per_s}
            for q in ("ttft_p50_s", "tpot_p50_s"):
                m, p = getattr(point, q), getattr(predicted[point.request_rate_per_s], q)
                row[f"measured_{q}"], row[f"predicted_{q}"] = m, p
                row[f"{q}_error"] = p / m - 1.0 if m > 0 else None
            rows.append(row)
    worst = {q: max((abs(r[f"{q}_error"]) for r in rows if r[f"{q}_error"] is not None), default=None)
             for q in ("ttft_p50_s", "tpot_p50_s")}
    return {"sweep": folder.name, "rows": rows, "max_abs_error": worst}


def table(result: dict[str, Any]) -> str:
    def ms(v: float | None, digits: int) -> str:
        return f"{v * 1e3:.{digits}f}" if v else "-"

    def err(v: float | None) -> str:
        return f"{v:+.1%}" if v is not None and math.isfinite(v) else "-"

    lines = ["| workload | rate (req/s) | held back | TTFT mean engine / predicted (ms) | error | TPOT mean engine / "
             "predicted (ms) | error | TTFT p50 client / predicted (ms) | error | TPOT p50 client / predicted (ms) "
             "| error |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        cells = []
        for q, digits in (("ttft_mean_s", 1), ("tpot_mean_s", 2), ("ttft_p50_s", 1), ("tpot_p50_s", 2)):
            cells += [f"{ms(r[f'measured_{q}'], digits)} / {ms(r[f'predicted_{q}'], digits)}", err(r[f"{q}_error"])]
        lines.append(f"| {r['workload']} | {r['rate_per_s']:g} | {'yes' if r['held_back'] else 'no (fit)'} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_profile(path: Path, profile: common_pb2.Profile) -> None:
    """Writes ``profile`` as protobuf JSON all at once (a temporary file renamed over the target)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json_format.MessageToJson(profile) + "\n")
    os.replace(tmp, path)


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = Parser(prog=prog, description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--sweep", type=Path, action="append", default=None,
                        help=f"sweep folder (repeatable: one fit per folder); default: the shipped {DEFAULT_RUN}")
    parser.add_argument("--fit-rates", default=None,
                        help="rates the fit sees, req/s (default: the ones the sweep was calibrated on)")
    parser.add_argument("--target", choices=sorted(TARGETS), default="client-p50",
                        help="what is fitted and scored (default client-p50: the profile's p50s, the client's "
                             "per-request timings; engine-mean: vLLM's own histogram means)")
    parser.add_argument("--check-sweep", type=Path, default=None,
                        help="another sweep folder (a repeat): the model fitted on each --sweep predicts its p50s at "
                             "every rate")
    parser.add_argument("--seed", type=int, default=11, help="the replay's seed, the sweep's (default 11)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for each workload's measured profile with the fitted step model as facts "
                             "(calibrated-<sweep>-<workload>.json, for greenserve evaluate --profile)")
    parser.add_argument("--json", action="store_true", help="accepted for symmetry; the last line is always JSON")
    return parser


def main(argv: list[str], prog: str = "greenserve bench calibration") -> int:
    parser = _parser(prog)
    ns = parser.parse_args(argv)
    fit_rates: list[float] | None = None
    if ns.fit_rates is not None:
        try:
            fit_rates = [float(x) for x in ns.fit_rates.split(",") if x.strip()]
        except ValueError:
            parser.error(f"--fit-rates: not a comma-separated list of numbers: {ns.fit_rates!r}")
        if not fit_rates or any(not (r > 0 and math.isfinite(r)) for r in fit_rates):
            parser.error("--fit-rates: give rates > 0")
    folders = ns.sweep or [STORED_SWEEP / DEFAULT_RUN]
    results = []
    if ns.check_sweep is not None and not ns.check_sweep.is_dir():
        parser.error(f"--check-sweep: not a folder: {ns.check_sweep}")
    for folder in folders:
        if not folder.is_dir():
            parser.error(f"--sweep: not a folder: {folder}")
        try:
            result = run(folder, fit_rates, ns.target, ns.seed)
        except ValueError as exc:
            parser.error(str(exc))
        print(f"sweep {result['sweep']}, fit on {', '.join(f'{r:g}' for r in result['fit_rates'])} req/s: fitted {', '.join(f'{k} {v:.3g}' for k, v in result['coefficients'].items())}"
              f" in {result['fit_s']:.1f} s", file=sys.stderr)
        print(table(result), file=sys.stderr)
        calibrated, engine = result.pop("calibrated"), result.pop("engine")
        if ns.check_sweep is not None:
            try:
                result["check"] = check_on(engine, ns.check_sweep, ns.seed)
            except ValueError as exc:
                parser.error(f"--check-sweep: {exc}")
            print(f"fitted on {result['sweep']}, predicting {ns.check_sweep.name} at every rate: largest |error| TTFT "
                  f"p50 {result['check']['max_abs_error']['ttft_p50_s']:.1%}, TPOT p50 "
                  f"{result['check']['max_abs_error']['tpot_p50_s']:.1%}", file=sys.stderr)
        if ns.out is not None:
            for workload, profile in calibrated.items():
                write_profile(ns.out / f"calibrated-{result['sweep']}-{workload}.json", profile)
        results.append(result)
    worst = {q: max((r["max_abs_error_held_back"][q] for r in results
                     if r["max_abs_error_held_back"][q] is not None), default=None)
             for q in ("ttft_mean_s", "tpot_mean_s", "ttft_p50_s", "tpot_p50_s")}
    spread = {q: max((r["max_split_half_held_back"][q] for r in results
                      if r["max_split_half_held_back"][q] is not None), default=None)
              for q in ("ttft_p50_s", "tpot_p50_s")}
    print(json.dumps({"benchmark": "calibration", "target": ns.target, "fit_rates": fit_rates,
                      "max_abs_error_held_back": worst, "max_split_half_held_back": spread, "sweeps": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
