"""Fan the (grid, strategy) days of an evaluation out (a local process pool or a Ray cluster: executor.py) and gather
one result document. The forecasts are made once per grid (CI) and once for the load shape, before the strategies'
days, which all plan on the same forecasts."""

from __future__ import annotations

import csv
import dataclasses
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import numpy as np
from greenserve.common.quiet_highs import silence_banner
from greenserve.evaluation import day
from greenserve.evaluation.executor import map_jobs, ray_session, tick
from greenserve.evaluation.grids import HOUR_S, GridSeries
from greenserve.evaluation.headlines import HEADLINES, landed
from greenserve.evaluation.progress import Progress
from greenserve.evaluation.scenario import LoadShape, Scenario
from greenserve.optimizer.planning import SeriesForecast

HISTORY_DAYS = 14
LOAD_SHAPE = "azure2024_conv_requests_hourly.csv"


def load_shape() -> np.ndarray:
    """The Azure 2024 conversation trace, requests per hour over 7 days (shipped demo data)."""
    text = resources.files("greenserve.common").joinpath("data", "demo", LOAD_SHAPE).read_text()
    return np.array([float(row[1]) for row in list(csv.reader(text.splitlines()))[1:]])


@dataclass(frozen=True)
class Job:
    region: str
    strategy: str
    day_start_s: int
    ci_actual: tuple[float, ...]
    ci_history: tuple[float, ...]
    ci_history_start_s: int
    scenario: Scenario
    forecast_model: str
    window_s: float
    hours: int
    ci_forecast: SeriesForecast | None = None  # made once per grid (None: run_day makes it)
    load_forecast: SeriesForecast | None = None
    actual_load_scale: float = 1.0  # a stress run: the replayed load is this multiple of the day's (run_day)


@dataclass(frozen=True)
class ForecastJob:
    key: str  # a region, or LOAD_KEY
    history: tuple[float, ...]
    history_start_s: int
    truth: tuple[float, ...]
    model: str


LOAD_KEY = "load"


def _forecast(job: ForecastJob) -> tuple[str, SeriesForecast, float]:
    started = time.process_time()
    fc = day.forecast_day(np.array(job.history), job.history_start_s, np.array(job.truth), job.model)
    return job.key, fc, time.process_time() - started


def _load_split(day_start_s: int, custom: LoadShape | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """(the evaluated day's load shape, its history, the history's start): the shape's last day is the day.
    ``custom``: the scenario's own trace (whole UTC days, NaN where the history misses an hour), else the shipped
    Azure 2024 one."""
    shape = np.array(custom.values, dtype=np.float64) if custom is not None else load_shape()
    days = len(shape) // 24
    return shape[(days - 1) * 24:days * 24], shape[:(days - 1) * 24], day_start_s - (days - 1) * 86400


def _run(job: Job) -> tuple[str, str, list[dict[str, Any]], float]:
    """(region, strategy, hour records, CPU seconds of this process for the day: planning and replay, not the
    forecasts, which the strategies share)."""
    started = time.process_time()
    name = _step_name(job)
    shape_day, shape_history, history_start_s = _load_split(job.day_start_s, job.scenario.load_shape)
    records = day.run_day(
        scenario=job.scenario, region=job.region, day_start_s=job.day_start_s, ci_actual=np.array(job.ci_actual),
        ci_history=np.array(job.ci_history), ci_history_start_s=job.ci_history_start_s,
        load_shape_day=shape_day, load_shape_history=shape_history, load_history_start_s=history_start_s,
        strategy=job.strategy, forecast_model=job.forecast_model, window_s=job.window_s, hours=job.hours,
        ci_forecast=job.ci_forecast, load_forecast=job.load_forecast, actual_load_scale=job.actual_load_scale,
        on_hour=lambda _h: tick(name))
    return job.region, job.strategy, day.records_json(records), time.process_time() - started


def jobs_for(series: dict[str, GridSeries], *, day_start_s: int, strategies: list[str], scenario: Scenario,
             forecast_model: str, window_s: float, hours: int) -> list[Job]:
    jobs = []
    for region, grid in series.items():
        # the hours replayed (the forecasts and plans cover the whole day from the history alone); the oracle
        # forecast plans on the actual values of the whole day, so it needs them all
        actual = grid.window(day_start_s, 24 if forecast_model == "oracle" else hours)
        history_start = day_start_s - HISTORY_DAYS * 86400
        first = max(grid.start_s, history_start)
        # the history may miss hours (NaN: the forecaster's models skip them); the day may not (grids.py)
        history = grid.window(first, (day_start_s - first) // HOUR_S, allow_missing=True)
        known = sum(1 for v in history if not math.isnan(v))
        if known < 48:
            raise ValueError(f"{region}: {known} h of CI before the day; the forecast needs at least 48")
        for strategy in strategies:
            jobs.append(Job(region, strategy, day_start_s, actual, history, first, scenario, forecast_model,
                            window_s, hours))
    return jobs


def _load_shape_json(shape: LoadShape | None) -> dict[str, Any]:
    """Which trace the day replayed: the scenario's (its last whole day with every hour) or the shipped one."""
    if shape is None:
        return {"name": LOAD_SHAPE, "replayed_day": None}
    replayed_s = shape.start_s + len(shape.values) * 3600 - 86400
    return {"name": shape.name, "replayed_day": datetime.fromtimestamp(replayed_s, UTC).date().isoformat()}


def scenario_json(pool: Any) -> dict[str, Any]:
    """A scenario pool as JSON (its declared variants as name, model, quality and its source, simulator model)."""
    return {**pool.__dict__, "variants": [
        {"name": v.name, "model": v.model, "quality_fraction": v.quality_fraction,
         "quality_source": v.quality_source, "simulator_model": v.simulator_model} for v in pool.variants]}


def totals(hours: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("operational_g", "embodied_compute_g", "embodied_storage_g", "total_g", "energy_kwh")
    out = {k: float(sum(h[k] for h in hours)) for k in keys}
    out["min_attainment_fraction"] = min((h["attainment_fraction"] for h in hours), default=1.0)
    out["min_ttft_attainment_fraction"] = min((h["ttft_attainment_fraction"] for h in hours), default=1.0)
    out["min_tpot_attainment_fraction"] = min((h["tpot_attainment_fraction"] for h in hours), default=1.0)
    out["plan_changes"] = float(sum(1 for h in hours if h["plan_changed"]))
    served = sum(h["load_actual_requests_per_s"] for h in hours)
    out["accuracy_loss_fraction"] = (float(sum(h.get("accuracy_loss_fraction", 0.0) * h["load_actual_requests_per_s"]
                                               for h in hours) / served) if served > 0 else 0.0)
    return out


@dataclass(frozen=True)
class SideJob:
    """A table of the report made next to the days: a seed's headline (``name``) or the simulator's fidelity."""

    kind: str  # "headline" or "fidelity"
    name: str = ""
    quick: bool = True


def fidelity_table() -> list[dict[str, Any]]:
    """The simulator's fidelity table (simulator/fidelity.py), its Kareto rows on the shipped Mooncake trace included."""
    from greenserve.simulator import fidelity

    return [{**dataclasses.asdict(r), "relative_error": r.relative_error, "holds": r.holds}
            for r in fidelity.fidelity_rows()]


def _run_any(job: Job | SideJob) -> tuple[str, Any]:
    silence_banner()  # each worker process's first solver would print HiGHS's banner through the progress bar
    if isinstance(job, Job):
        return "day", _run(job)
    if job.kind == "fidelity":
        return "fidelity", fidelity_table()
    from greenserve.evaluation import headlines

    return "headline", headlines.run_one(job.name, quick=job.quick)


def _step_name(job: Job | SideJob) -> str:
    if isinstance(job, Job):
        return f"{job.region}/{job.strategy}"
    return "simulator fidelity" if job.kind == "fidelity" else f"headline {job.name}"


def forecast_jobs(jobs: list[Job]) -> list[ForecastJob]:
    """One CI forecast per grid and one load forecast, from the history before the day only."""
    if not jobs:
        return []
    shape_day, shape_history, history_start_s = _load_split(jobs[0].day_start_s, jobs[0].scenario.load_shape)
    out = [ForecastJob(LOAD_KEY, tuple(shape_history), history_start_s, tuple(shape_day[:24]), jobs[0].forecast_model)]
    for job in {j.region: j for j in jobs}.values():
        out.append(ForecastJob(job.region, job.ci_history, job.ci_history_start_s, job.ci_actual,
                               job.forecast_model))
    return out


def evaluate(series: dict[str, GridSeries], *, day_start_s: int, strategies: list[str], scenario: Scenario,
             forecast_model: str = "auto", window_s: float = day.DEFAULT_WINDOW_S, hours: int = 24,
             workers: int | None = None, progress: Any = None, ray_address: str | None = None,
             headlines: str = "none", fidelity: bool = True, actual_load_scale: float = 1.0) -> dict[str, Any]:
    """Every (grid, strategy) day; ``progress(done, total, doing)`` is called as the steps (forecasts, days, the
    method's checks) start and finish, ``doing`` saying what runs (progress.py).
    ``actual_load_scale``: replay the load at this multiple of the day's while forecasts see the day as it is.
    ``ray_address``: run the jobs on that Ray cluster (``local``: a local Ray instance) instead of local processes.
    ``headlines`` (``none``, ``quick``, ``full``): the seeds' headline table, run next to the days; ``fidelity``:
    the simulator's fidelity table."""
    if headlines not in ("none", "quick", "full"):
        raise ValueError(f"headlines: must be none, quick or full, got {headlines!r}")
    jobs = jobs_for(series, day_start_s=day_start_s, strategies=strategies, scenario=scenario,
                    forecast_model=forecast_model, window_s=window_s, hours=hours)
    jobs = [dataclasses.replace(j, actual_load_scale=actual_load_scale) for j in jobs]
    results: dict[str, dict[str, Any]] = {region: {} for region in series}

    headline_rows: list[dict[str, Any]] = []
    fidelity_rows: list[dict[str, Any]] = []
    side: list[SideJob] = [SideJob("fidelity")] if fidelity else []
    if headlines != "none":
        ready = landed()
        headline_rows = [{"name": n, "status": "missing", "error": f"{HEADLINES[n]} has not landed"}
                         for n in HEADLINES if n not in ready]
        side += [SideJob("headline", n, headlines == "quick") for n in ready]

    fjobs = forecast_jobs(jobs)
    steps = Progress(progress, len(fjobs) + len(jobs) * hours + len(side))

    def done(outcome: tuple[str, Any]) -> None:
        kind, body = outcome
        if kind == "day":
            region, strategy, records, cpu_s = body
            results[region][strategy] = {"hours": records, "totals": totals(records), "cpu_s": cpu_s}
            steps.finished(f"{region}/{strategy}")
        elif kind == "headline":
            headline_rows.append(body)
            steps.finished(f"headline {body.get('name', '')}")
        else:
            fidelity_rows.extend(body)
            steps.finished("simulator fidelity")

    with ray_session(ray_address):
        steps.forecasting(series, forecast_model)
        made = map_jobs(_forecast, fjobs, workers=workers, ray_address=ray_address, on_done=lambda _: steps.finished())
        forecasts = {key: fc for key, fc, _ in made}
        forecast_cpu_s = {key: cpu for key, _, cpu in made}
        jobs = [dataclasses.replace(j, ci_forecast=forecasts[j.region], load_forecast=forecasts[LOAD_KEY])
                for j in jobs]
        steps.running([_step_name(j) for j in jobs], hours, [_step_name(j) for j in side])
        every: list[Job | SideJob] = [*jobs, *side]
        map_jobs(_run_any, every, workers=workers, ray_address=ray_address, on_done=done,
                 on_tick=steps.hour_finished)
    order = {n: i for i, n in enumerate(HEADLINES)}
    headline_rows.sort(key=lambda r: order.get(r["name"], len(order)))
    for region, by_strategy in results.items():  # strategies in the order asked, whatever order they finished in
        results[region] = {s: by_strategy[s] for s in strategies if s in by_strategy}
    summary = {}
    for region, by_strategy in results.items():
        base = by_strategy.get("base_full_cache", {}).get("totals", {}).get("total_g")
        summary[region] = {
            s: {"total_g": r["totals"]["total_g"], "min_attainment_fraction": r["totals"]["min_attainment_fraction"],
                "saved_vs_base_fraction": (1 - r["totals"]["total_g"] / base) if base else None,
                "accuracy_loss_fraction": r["totals"]["accuracy_loss_fraction"], "cpu_s": r.get("cpu_s")}
            for s, r in by_strategy.items()}
    return {
        "day": datetime.fromtimestamp(day_start_s, UTC).date().isoformat(), "hours": hours,
        "forecast_model": forecast_model, "window_s": window_s, "strategies": strategies,
        "strategy_descriptions": {s: day.STRATEGIES[s] for s in strategies},
        "scenario": [scenario_json(p) for p in scenario.pools], "grids": results, "summary": summary,
        "load_shape": _load_shape_json(scenario.load_shape),
        "simplifications": day.__doc__.split("* **Replay**")[1].strip() if day.__doc__ else "",
        "headlines": headline_rows, "fidelity": fidelity_rows, "forecast_cpu_s": forecast_cpu_s,
    }
