"""Fan the (grid, strategy) days of an evaluation out over a process pool and gather one result document."""

from __future__ import annotations

import concurrent.futures
import csv
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import numpy as np

from greenserve.evaluation import day
from greenserve.evaluation.grids import HOUR_S, GridSeries
from greenserve.evaluation.scenario import Scenario

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


def _run(job: Job) -> tuple[str, str, list[dict[str, Any]]]:
    shape = load_shape()
    days = len(shape) // 24
    # The last day of the load shape is the evaluated day; the days before it are the load's history.
    records = day.run_day(
        scenario=job.scenario, region=job.region, day_start_s=job.day_start_s, ci_actual=np.array(job.ci_actual),
        ci_history=np.array(job.ci_history), ci_history_start_s=job.ci_history_start_s,
        load_shape_day=shape[(days - 1) * 24:days * 24], load_shape_history=shape[:(days - 1) * 24],
        load_history_start_s=job.day_start_s - (days - 1) * 86400, strategy=job.strategy,
        forecast_model=job.forecast_model, window_s=job.window_s, hours=job.hours)
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


def evaluate(series: dict[str, GridSeries], *, day_start_s: int, strategies: list[str], scenario: Scenario,
             forecast_model: str = "auto", window_s: float = day.DEFAULT_WINDOW_S, hours: int = 24,
             workers: int | None = None, progress: Any = None) -> dict[str, Any]:
    """Every (grid, strategy) day; ``progress`` is called with each finished job's (region, strategy)."""
    jobs = jobs_for(series, day_start_s=day_start_s, strategies=strategies, scenario=scenario,
                    forecast_model=forecast_model, window_s=window_s, hours=hours)
    workers = workers or min(len(jobs), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    results: dict[str, dict[str, Any]] = {region: {} for region in series}
    if workers <= 1:
        finished = map(_run, jobs)
        for region, strategy, records in finished:
            results[region][strategy] = {"hours": records, "totals": totals(records)}
            if progress:
                progress(region, strategy)
    else:
        with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(_run, job) for job in jobs]
            for future in concurrent.futures.as_completed(futures):
                region, strategy, records = future.result()
                results[region][strategy] = {"hours": records, "totals": totals(records)}
                if progress:
                    progress(region, strategy)
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
