"""`greenserve evaluate`: real grid CI and a real load shape through the forecaster's models, the planner and the
simulator, hour by hour, strategies side by side; writes a report folder (result.json, PNG plots, index.html) and
prints one JSON object with per-strategy totals on its last line."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from greenserve.common.cli_parser import Parser
from greenserve.common.strict_json import dumps

if TYPE_CHECKING:
    from greenserve.simulator.engine_profile import EngineProfile

DEFAULT_DAY = "2022-07-06"


def _parser() -> argparse.ArgumentParser:
    from greenserve.common.ci_units import add_ci_unit_flag
    from greenserve.evaluation.day import STRATEGIES
    from greenserve.evaluation.grids import SHIPPED_REGIONS

    parser = Parser(prog="greenserve evaluate", description=" ".join(__doc__.split()))
    parser.add_argument("--grids", default=",".join(SHIPPED_REGIONS),
                        help=f"shipped grids to evaluate, comma-separated (default {','.join(SHIPPED_REGIONS)})")
    parser.add_argument("--ci-csv", type=Path, help="evaluate this CI CSV (hourly or finer rows, averaged per UTC "
                        "hour) instead of the shipped grids")
    parser.add_argument("--time-column", help="time column of --ci-csv (ISO-8601, UTC when no offset)")
    parser.add_argument("--value-column", help="CI column of --ci-csv (gCO2e/kWh unless --ci-unit says otherwise)")
    add_ci_unit_flag(parser)
    parser.add_argument("--region", help="region name of --ci-csv (default: the file name)")
    parser.add_argument("--day", default=DEFAULT_DAY, help=f"the UTC day to evaluate (default {DEFAULT_DAY}, "
                        "GreenCache's evaluation day); the 14 days before it are the CI history")
    parser.add_argument("--strategies", default=None,
                        help="comma-separated (default: all; mig_variants only with a scenario declaring MIG GPUs): "
                        # '%%': argparse formats help with '%' (a description's '4 %' was read as a directive)
                        + "; ".join(f"{k}: {v}" for k, v in STRATEGIES.items()).replace("%", "%%"))
    parser.add_argument("--scenario", type=Path, help="scenario file (YAML/JSON); default: one chat pool of 4 "
                        "Llama-3 8B engines on A100-80GB with up to 64 GiB of DRAM cache each")
    parser.add_argument("--forecast", default="auto",
                        help="forecaster model (auto, seasonal_naive, ...) or 'oracle' (the actual values)")
    parser.add_argument("--hours", type=int, default=24, help="hours of the day to replay (1..24)")
    parser.add_argument("--window-s", type=float, default=600.0, help="seconds of traffic replayed per hour (60..3600)")
    parser.add_argument("--actual-load-scale", type=float, default=1.0,
                        help="stress: replay each hour's load at this multiple of the day's (0.1..5) while forecasts "
                             "and plans see the day as it is; 1.3 is a load 30 %% above its forecast")
    parser.add_argument("--workers", type=int, default=0, help="processes (default: one per usable core)")
    parser.add_argument("--out", type=Path, default=Path("evaluation-report"), help="report folder")
    parser.add_argument("--ray-address", help="run the days on a Ray cluster instead of local processes: the cluster's "
                        "address (auto, ray://head:10001) or 'local' for a Ray instance on this machine; needs the "
                        "optional extra greenserve[ray]")
    parser.add_argument("--headlines", choices=("quick", "full", "none"), default="quick",
                        help="the seeds' headlines reproduced in their own settings, a table in the report "
                        "(default quick: each module's quick setting; full: the modules' own settings)")
    parser.add_argument("--profile", type=Path, help="a measured profile with a fitted step model (greenserve bench "
                        "calibration --out): its engine joins the simulator's profiles as MODEL@HARDWARE; without "
                        "--scenario the one pool runs engines of that kind")
    parser.add_argument("--json", action="store_true", help="accepted for symmetry: the last line is always JSON")
    return parser


def _measured_engine(path: Path) -> EngineProfile:
    """The engine of a measured profile file, made visible to this process and its workers under MODEL@HARDWARE;
    ValueError naming --profile when the file is not a measured profile with a fitted step model."""
    import os

    from greenserve.simulator.engine_profile import engine_profile_from_file
    from greenserve.simulator.engine_profile import MEASURED_PROFILES_ENV

    engine = engine_profile_from_file(path, "--profile")
    os.environ[MEASURED_PROFILES_ENV] = str(path.resolve())
    return engine


def main(argv: list[str]) -> int:
    from greenserve.common.ci_units import ci_unit_factor
    from greenserve.evaluation import grids, report, run, scenario
    from greenserve.evaluation.day import STRATEGIES
    from greenserve.evaluation.executor import RayUnavailable
    from greenserve.forecaster.forecast_models import MODELS

    parser = _parser()
    ns = parser.parse_args(argv)
    prog = "greenserve evaluate"
    strategies = [s.strip() for s in (ns.strategies or ",".join(STRATEGIES)).split(",") if s.strip()]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        parser.error(f"--strategies: unknown {unknown or 'none given'}; known: {', '.join(STRATEGIES)}")
    if ns.forecast != "oracle" and ns.forecast not in MODELS:
        parser.error(f"--forecast: unknown model {ns.forecast!r}; known: oracle, {', '.join(MODELS)}")
    if not 1 <= ns.hours <= 24:
        parser.error("--hours: must be in 1..24")
    if not 0.1 <= ns.actual_load_scale <= 5.0:
        parser.error(f"--actual-load-scale: must be in [0.1, 5], got {ns.actual_load_scale:g}")
    if not 60 <= ns.window_s <= 3600:
        parser.error("--window-s: must be in 60..3600")
    if ns.workers < 0:
        parser.error("--workers: must be >= 0")
    if ns.ray_address is not None and not ns.ray_address.strip():
        parser.error("--ray-address: empty (use 'local' for a Ray instance on this machine, or the cluster's address)")
    try:
        day = datetime.fromisoformat(ns.day).replace(tzinfo=UTC)
    except ValueError:
        parser.error(f"--day: not a date: {ns.day!r}")
    try:
        if ns.ci_csv is not None:
            if not ns.time_column or not ns.value_column:
                parser.error("--ci-csv needs --time-column and --value-column")
            series = grids.read_csv(ns.ci_csv, time_column=ns.time_column, value_column=ns.value_column,
                                    region=ns.region, value_scale=ci_unit_factor(ns.ci_unit, ns.value_column))
        else:
            shipped = grids.shipped()
            wanted = [g.strip() for g in ns.grids.split(",") if g.strip()]
            missing = [g for g in wanted if g not in shipped]
            if missing or not wanted:
                parser.error(f"--grids: unknown {missing or 'none given'}; shipped: {', '.join(shipped)}")
            series = {g: shipped[g] for g in wanted}
        measured = _measured_engine(ns.profile) if ns.profile is not None else None
        if measured is not None and not {"idle_w", "max_w"} <= set(measured.sources):
            print(f"{prog}: warning: --profile: {measured.name} has no measured power (idle {measured.idle_w:g} W, "
                  f"peak {measured.max_w:g} W are stand-ins): its latencies and attainment hold, its carbon and "
                  "energy figures do not", file=sys.stderr)
        chosen = scenario.load(ns.scenario) if ns.scenario else scenario.Scenario()
        if measured is not None and not ns.scenario:
            chosen = scenario.Scenario(pools=(scenario.PoolScenario(
                "chat", model=measured.model, simulator_model=measured.model, hardware=measured.hardware),))
    except (ValueError, scenario.ScenarioError) as exc:  # GridDataError and a unit refusal are ValueErrors
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if ns.strategies is None:  # the default: every strategy the scenario can run
        from greenserve.evaluation.day import strategies_for

        strategies = strategies_for(chosen)
    elif "mig_variants" in strategies and not chosen.has_mig:
        parser.error("--strategies: mig_variants needs a scenario whose pool declares MIG GPUs "
                     "(gpus: {model, count, mig: true})")
    from tqdm import tqdm

    # steps: each forecast, each hour of each (grid, strategy) day, each check of the method; what runs in the
    # description (no rate: a step is a forecast, an hour's plan and replay or a table, not a unit to count per second)
    with tqdm(total=1, file=sys.stderr, disable=None, bar_format="{n_fmt}/{total_fmt} steps [{elapsed}] {desc}") as bar:
        def show(done: int, total: int, doing: str) -> None:
            bar.total, bar.n = total, done
            bar.set_description_str(doing)

        try:
            result = run.evaluate(series, day_start_s=int(day.timestamp()), strategies=strategies, scenario=chosen,
                                  forecast_model=ns.forecast, window_s=ns.window_s, hours=ns.hours,
                                  actual_load_scale=ns.actual_load_scale,
                                  workers=ns.workers or None, ray_address=ns.ray_address, headlines=ns.headlines,
                                  progress=show)
        except RayUnavailable as exc:
            print(f"{prog}: error: --ray-address: {exc}", file=sys.stderr)
            return 2
        except (grids.GridDataError, ValueError) as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 2
        bar.set_description_str(f"writing the report (plots, index.html) into {ns.out}")
        index = report.write(result, ns.out)
    print(f"report: {index}", file=sys.stderr)
    print(dumps({"day": result["day"], "summary": result["summary"], "report": str(index)}))
    return 0
