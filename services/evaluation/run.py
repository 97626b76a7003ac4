"""Fan the (grid, strategy) days of an evaluation out (a local process pool or a Ray cluster: executor.py) and gather
one result document. The forecasts are made once per grid (CI) and once for the load shape, before the strategies'
days, which all plan on the same forecasts."""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import numpy as np
from greenserve.evaluation import day
from greenserve.evaluation.executor import map_jobs, ray_session
from greenserve.evaluation.grids import HOUR_S, GridSeries
from greenserve.evaluation.scenario import Scenario
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


@dataclass(frozen=True)
class ForecastJob:
    key: str  # a region, or LOAD_KEY
    history: tuple[float, ...]
    history_start_s: int
    truth: tuple[float, ...]
    model: str


LOAD_KEY = "load"


def _forecast(job: ForecastJob) -> tuple[str, SeriesForecast]:
    return job.key, day.forecast_day(np.array(job.history), job.history_start_s, np.array(job.truth), job.model)


def _load_split(day_start_s: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(the evaluated day's load shape, its history, the history's start): the shape's last day is the day."""
    shape = load_shape()
    days = len(shape) // 24
    return shape[(days - 1) * 24:days * 24], shape[:(days - 1) * 24], day_start_s - (days - 1) * 86400


def _run(job: Job) -> tuple[str, str, list[dict[str, Any]]]:
    shape_day, shape_history, history_start_s = _load_split(job.day_start_s)
    records = day.run_day(
        scenario=job.scenario, region=job.region, day_start_s=job.day_start_s, ci_actual=np.array(job.ci_actual),
        ci_history=np.array(job.ci_history), ci_history_start_s=job.ci_history_start_s,
        load_shape_day=shape_day, load_shape_history=shape_history, load_history_start_s=history_start_s,
        strategy=job.strategy, forecast_model=job.forecast_model, window_s=job.window_s, hours=job.hours,
        ci_forecast=job.ci_forecast, load_forecast=job.load_forecast)
    return job.region, job.strategy, day.records_json(records)


def jobs_for(series: dict[str, GridSeries], *, day_start_s: int, strategies: list[str], scenario: Scenario,
             forecast_model: str, window_s: float, hours: int) -> list[Job]:
    jobs = []
    for region, grid in series.items():
        actual = grid.window(day_start_s, 24)
        history_start = day_start_s - HISTORY_DAYS * 86400
        first = max(grid.start_s, history_start)
        history = grid.window(first, (day_start_s - first) // HOUR_S)
        if len(history) < 48:
            raise ValueError(f"{region}: {len(history)} h of CI before the day; the forecast needs at least 48")
        for strategy in strategies:
            jobs.append(Job(region, strategy, day_start_s, actual, history, first, scenario, forecast_model,
                            window_s, hours))
    return jobs


def totals(hours: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("operational_g", "embodied_compute_g", "embodied_storage_g", "total_g", "energy_kwh")
    out = {k: float(sum(h[k] for h in hours)) for k in keys}
    out["min_attainment_fraction"] = min((h["attainment_fraction"] for h in hours), default=1.0)
    out["min_ttft_attainment_fraction"] = min((h["ttft_attainment_fraction"] for h in hours), default=1.0)
    out["min_tpot_attainment_fraction"] = min((h["tpot_attainment_fraction"] for h in hours), default=1.0)
    out["plan_changes"] = float(sum(1 for h in hours if h["plan_changed"]))
    return out


def forecast_jobs(jobs: list[Job]) -> list[ForecastJob]:
    """One CI forecast per grid and one load forecast, from the history before the day only."""
    if not jobs:
        return []
    shape_day, shape_history, history_start_s = _load_split(jobs[0].day_start_s)
    out = [ForecastJob(LOAD_KEY, tuple(shape_history), history_start_s, tuple(shape_day[:24]), jobs[0].forecast_model)]
    for job in {j.region: j for j in jobs}.values():
        out.append(ForecastJob(job.region, job.ci_history, job.ci_history_start_s, job.ci_actual[:24],
                               job.forecast_model))
    return out


def evaluate(series: dict[str, GridSeries], *, day_start_s: int, strategies: list[str], scenario: Scenario,
             forecast_model: str = "auto", window_s: float = day.DEFAULT_WINDOW_S, hours: int = 24,
             workers: int | None = None, progress: Any = None, ray_address: str | None = None) -> dict[str, Any]:
    """Every (grid, strategy) day; ``progress`` is called with each finished job's (region, strategy).
    ``ray_address``: run the jobs on that Ray cluster (``local``: a local Ray instance) instead of local processes."""
    jobs = jobs_for(series, day_start_s=day_start_s, strategies=strategies, scenario=scenario,
                    forecast_model=forecast_model, window_s=window_s, hours=hours)
    results: dict[str, dict[str, Any]] = {region: {} for region in series}

    def done(outcome: tuple[str, str, list[dict[str, Any]]]) -> None:
        region, strategy, records = outcome
        results[region][strategy] = {"hours": records, "totals": totals(records)}
        if progress:
            progress(region, strategy)

    with ray_session(ray_address):
        forecasts = dict(map_jobs(_forecast, forecast_jobs(jobs), workers=workers, ray_address=ray_address))
        jobs = [dataclasses.replace(j, ci_forecast=forecasts[j.region], load_forecast=forecasts[LOAD_KEY])
                for j in jobs]
        map_jobs(_run, jobs, workers=workers, ray_address=ray_address, on_done=done)
    for region, by_strategy in results.items():  # strategies in the order asked, whatever order they finished in
        results[region] = {s: by_strategy[s] for s in strategies if s in by_strategy}
    summary = {}
    for region, by_strategy in results.items():
        base = by_strategy.get("base_full_cache", {}).get("totals", {}).get("total_g")
        summary[region] = {
            s: {"total_g": r["totals"]["total_g"], "min_attainment_fraction": r["totals"]["min_attainment_fraction"],
                "saved_vs_base_fraction": (1 - r["totals"]["total_g"] / base) if base else None}
            for s, r in by_strategy.items()}
    return {
        "day": datetime.fromtimestamp(day_start_s, UTC).date().isoformat(), "hours": hours,
        "forecast_model": forecast_model, "window_s": window_s, "strategies": strategies,
        "strategy_descriptions": {s: day.STRATEGIES[s] for s in strategies},
        "scenario": [p.__dict__ for p in scenario.pools], "grids": results, "summary": summary,
        "simplifications": day.__doc__.split("* **Replay**")[1].strip() if day.__doc__ else "",
    }
