"""One evaluated day of one grid and one strategy: forecast, plan, replay, hour by hour.

* **Forecasts**: at 00:00 of the day, the forecaster's model (``--forecast-model``, the service's default ``auto``)
  is fitted on the history before the day only (CI: the grid's previous days; load: the load shape's previous
  days) and forecasts the 24 hours; ``oracle`` uses the actual values instead (what forecast errors cost).
* **Plans**: every hour the real planner (``greenserve.optimizer.planning.Planner``) runs the strategy's solvers on
  the remaining hours of the day, with the plan of the previous hour in force; the interval of the hour is applied.
* **Replay**: each hour the pool's traffic (GreenCache's multi-turn conversations at the hour's actual rate) is
  replayed through the simulator on the engines the plan weights, each with the plan's cache size; the first
  third of the window warms the caches and is not measured. The window (``window_s``, 600 s by default) stands
  for the hour: energy per request and attainment are measured on it, the idle power of every engine and the
  embodied carbon of every GPU and of the allocated cache are charged for the whole hour. Cache contents are not
  carried from one hour to the next (each hour starts warm); that is the replay's main simplification.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from greenserve.common import carbon
from greenserve.forecaster.forecast_models import make_model
from greenserve.optimizer import capacity
from greenserve.optimizer.inputs import GPU_FAMILY
from greenserve.optimizer.planning import Planner, PlanningInputs, SeriesForecast
from greenserve.optimizer.solvers.baselines import EvenRouting, FixedCache
from greenserve.optimizer.solvers.cache_greencache import GreenCacheIlp
from greenserve.optimizer.solvers.keep_current import KeepCurrent
from greenserve.optimizer.solvers.routing_weights import MinCarbonRouting
from greenserve.evaluation.scenario import PoolScenario, Scenario
from greenserve.simulator.perf_model import PerfModel, load_profile
from greenserve.simulator.replay import EngineSpec, FleetConfig, WeightedRandom, replay
from greenserve.simulator.workloads import multi_turn_workload
from greenserve.v1 import common_pb2

HOUR_S = 3600
MEAN_TURNS = 4.0
DEFAULT_WINDOW_S = 600.0

STRATEGIES: dict[str, str] = {
    "base_full_cache": "today's static fleet: every engine weighted equally, the largest cache (Full Cache + BASE)",
    "no_cache": "every engine weighted equally, no KV cache tier",
    "greencache": "GreenCache alone: cache sizes by the ILP, engines weighted equally",
    "carbon_routing": "min-carbon routing alone, the largest cache",
    "joint": "the joint plan: min-carbon routing and the GreenCache ILP",
}


def solvers_for(strategy: str) -> list[Any]:
    keep = [KeepCurrent("mig_layouts"), KeepCurrent("serving_modes")]
    if strategy == "base_full_cache":
        return [EvenRouting(), FixedCache(full=True), *keep]
    if strategy == "no_cache":
        return [EvenRouting(), FixedCache(full=False), *keep]
    if strategy == "greencache":
        return [EvenRouting(), GreenCacheIlp(), *keep]
    if strategy == "carbon_routing":
        return [MinCarbonRouting(), FixedCache(full=True), *keep]
    if strategy == "joint":
        return [MinCarbonRouting(), GreenCacheIlp(), *keep]
    raise ValueError(f"strategy: must be one of {', '.join(STRATEGIES)}, got {strategy!r}")


@dataclass
class HourRecord:
    hour: int
    ci_actual_g_per_kwh: float
    ci_forecast_g_per_kwh: float
    load_actual_requests_per_s: float
    load_forecast_requests_per_s: float
    operational_g: float
    embodied_compute_g: float
    embodied_storage_g: float
    total_g: float
    energy_kwh: float
    ttft_attainment_fraction: float
    tpot_attainment_fraction: float
    attainment_fraction: float
    requests_measured: int
    cache_bytes: dict[str, int] = field(default_factory=dict)
    engines_weighted: dict[str, int] = field(default_factory=dict)
    plan_changed: bool = False


def forecast_day(history: np.ndarray, history_start_s: int, truth: np.ndarray, model: str) -> SeriesForecast:
    """Day-ahead forecast from ``history`` only (``oracle``: the truth)."""
    if model == "oracle":
        values = tuple(float(v) for v in truth)
        return SeriesForecast(values, values, values, "oracle")
    fitted = make_model(model).fit(np.asarray(history, dtype=np.float64), start_s=history_start_s)
    pred = fitted.predict(len(truth))
    clean = [tuple(max(0.0, float(v)) if math.isfinite(v) else 0.0 for v in arr)
             for arr in (pred.mean, pred.lower, pred.upper)]
    return SeriesForecast(clean[0], clean[1], clean[2], pred.model)


def _gpu_embodied_g_per_h(hardware: str, params: carbon.CarbonParams) -> float:
    count = int(hardware.split("x")[0]) if "x" in hardware.split("-")[0] else 1
    family = next((f for key, f in GPU_FAMILY.items() if key in hardware), None)
    if family is None:
        return 0.0
    try:
        spec = params.component(f"gpu.{family}")
    except ValueError:
        return 0.0
    return count * carbon.amortised_embodied_g(duration_s=HOUR_S, lifetime_s=spec.lifetime_s,
                                               embodied_g=spec.embodied_g)


def replay_hour(pool: PoolScenario, rate_per_s: float, weights: dict[str, float], cache_bytes: int, seed: int,
                window_s: float) -> tuple[float, float, float, int, float]:
    """(TTFT, TPOT, both attainment, measured requests, dynamic energy per request J) of one pool's hour."""
    used = [eid for eid, w in sorted(weights.items()) if w > 0] or [f"{pool.name}-{i}" for i in range(pool.engines)]
    model = PerfModel(load_profile(pool.profile))
    tokens = int(cache_bytes / max(model.profile.kv_bytes_per_token, 1.0))
    if rate_per_s <= 0:
        return 1.0, 1.0, 1.0, 0, 0.0
    n_conv = max(2, int(rate_per_s / MEAN_TURNS * window_s))
    workload = multi_turn_workload(n_conv, rate_per_s / MEAN_TURNS, seed=seed, mean_turns=MEAN_TURNS)
    specs = tuple(EngineSpec(pool.profile, dram_capacity_tokens=tokens) for _ in used)
    policy = WeightedRandom([max(weights.get(eid, 1.0), 1e-9) for eid in used], seed=seed) if weights else "least_loaded"
    result = replay(workload, FleetConfig(specs, policy=policy, seed=seed))
    arrivals = np.asarray(result.arrival_s)
    measured = np.flatnonzero((arrivals >= window_s / 3.0) & (arrivals < window_s))
    if len(measured) == 0:
        return 1.0, 1.0, 1.0, 0, 0.0
    ttft = np.nan_to_num(result.ttft_s[measured], nan=math.inf)
    tpot = np.where(result.output_tokens[measured] <= 1, 0.0, np.nan_to_num(result.tpot_s[measured], nan=math.inf))
    done = result.completed[measured]
    ok_t = (ttft <= pool.ttft_s) & done
    ok_p = (tpot <= pool.tpot_s) & done
    energy = result.energy_j[measured][done]
    return (float(ok_t.mean()), float(ok_p.mean()), float((ok_t & ok_p).mean()), int(len(measured)),
            float(np.mean(energy)) if len(energy) else 0.0)


def run_day(*, scenario: Scenario, region: str, day_start_s: int, ci_actual: np.ndarray, ci_history: np.ndarray,
            ci_history_start_s: int, load_shape_day: np.ndarray, load_shape_history: np.ndarray,
            load_history_start_s: int, strategy: str, forecast_model: str = "auto",
            window_s: float = DEFAULT_WINDOW_S, hours: int = 24,
            params: carbon.CarbonParams | None = None) -> list[HourRecord]:
    """Plans and replays ``hours`` hours of one day (see the module docstring)."""
    params = params or carbon.load_default_params()
    fleet = scenario.fleet(region)
    peak = float(max(np.max(load_shape_history), np.max(load_shape_day), 1e-9))
    ci_fc = forecast_day(ci_history, ci_history_start_s, ci_actual[:24], forecast_model)
    load_fc_shape = forecast_day(load_shape_history, load_history_start_s, load_shape_day[:24], forecast_model)
    planner = Planner(solvers_for(strategy), solver_timeout_s=120.0)
    caps = {}
    for pool_s, pool in zip(scenario.pools, fleet.pools):
        cap = capacity.predict(pool_s.profile, pool_s.ttft_s, pool_s.tpot_s, pool_s.attainment_fraction,
                               pool.mean_prompt_tokens, pool.mean_output_tokens)
        for engine in pool.engines:
            caps[engine.id] = cap
    records: list[HourRecord] = []
    current: common_pb2.Plan | None = None
    try:
        for h in range(hours):
            left = 24 - h
            load = {}
            for pool_s in scenario.pools:
                scale = pool_s.peak_requests_per_s / peak
                load[pool_s.name] = SeriesForecast(
                    tuple(v * scale for v in load_fc_shape.mean[h:]), tuple(v * scale for v in load_fc_shape.lower[h:]),
                    tuple(v * scale for v in load_fc_shape.upper[h:]), load_fc_shape.model)
            inputs = PlanningInputs(
                start_s=day_start_s + HOUR_S * h, horizon_hours=left, fleet=fleet,
                ci={region: SeriesForecast(ci_fc.mean[h:], ci_fc.lower[h:], ci_fc.upper[h:], ci_fc.model)},
                load=load, capabilities=caps, params=params, gpu_platform={}, current=current)
            plan = planner.plan(inputs, trigger="schedule", created_s=day_start_s + HOUR_S * h).plan
            plan.version = h + 1
            interval = plan.intervals[0]
            changed = current is not None and (
                list(current.intervals[0].cache_targets) != list(interval.cache_targets)
                or [(w.engine_id, round(w.weight, 3)) for w in current.intervals[0].routing_weights]
                != [(w.engine_id, round(w.weight, 3)) for w in interval.routing_weights])
            current = plan
            record = _measure_hour(scenario, interval, h, region, float(ci_actual[h]), float(ci_fc.mean[h]),
                                   load_shape_day, load_fc_shape, peak, params, window_s, seed=int(day_start_s // HOUR_S) + h)
            record.plan_changed = changed
            records.append(record)
    finally:
        planner.close()
    return records


def _measure_hour(scenario: Scenario, interval: common_pb2.PlanInterval, h: int, region: str, ci: float,
                  ci_forecast: float, shape_day: np.ndarray, shape_fc: SeriesForecast, peak: float,
                  params: carbon.CarbonParams, window_s: float, seed: int) -> HourRecord:
    del region
    energy_j = 0.0
    embodied_compute = embodied_storage = 0.0
    requests_total = ok_t = ok_p = ok_both = 0.0
    measured_total = 0
    load_actual = load_forecast = 0.0
    cache_bytes: dict[str, int] = {}
    engines_weighted: dict[str, int] = {}
    for pool in scenario.pools:
        scale = pool.peak_requests_per_s / peak
        rate = float(shape_day[h]) * scale
        load_actual += rate
        load_forecast += float(shape_fc.mean[h]) * scale
        weights = {w.engine_id: w.weight for w in interval.routing_weights if w.pool == pool.name}
        target = next((t for t in interval.cache_targets if t.pool == pool.name), None)
        size = int(target.dram_bytes or target.disk_bytes) if target is not None else 0
        cache_bytes[pool.name] = size
        engines_weighted[pool.name] = sum(1 for w in weights.values() if w > 0) or pool.engines
        a_t, a_p, a_b, n, per_request_j = replay_hour(pool, rate, weights, size, seed, window_s)
        idle_w = PerfModel(load_profile(pool.profile)).power_w(0.0)
        requests = rate * HOUR_S
        energy_j += pool.engines * idle_w * HOUR_S + per_request_j * requests
        embodied_compute += pool.engines * _gpu_embodied_g_per_h(pool.hardware, params)
        embodied_storage += pool.engines * carbon.cache_tiers_embodied_g(
            dram_bytes=target.dram_bytes if target else 0, disk_bytes=target.disk_bytes if target else 0,
            duration_s=HOUR_S, params=params)
        requests_total += requests
        ok_t += requests * a_t
        ok_p += requests * a_p
        ok_both += requests * a_b
        measured_total += n
    energy_kwh = energy_j / 3.6e6
    operational = carbon.operational_g(energy_kwh=energy_kwh, ci_g_per_kwh=ci, pue=params.pue)
    norm = requests_total if requests_total > 0 else 1.0
    return HourRecord(
        hour=h, ci_actual_g_per_kwh=ci, ci_forecast_g_per_kwh=ci_forecast, load_actual_requests_per_s=load_actual,
        load_forecast_requests_per_s=load_forecast, operational_g=operational, embodied_compute_g=embodied_compute,
        embodied_storage_g=embodied_storage, total_g=operational + embodied_compute + embodied_storage,
        energy_kwh=energy_kwh, ttft_attainment_fraction=ok_t / norm if requests_total else 1.0,
        tpot_attainment_fraction=ok_p / norm if requests_total else 1.0,
        attainment_fraction=ok_both / norm if requests_total else 1.0, requests_measured=measured_total,
        cache_bytes=cache_bytes, engines_weighted=engines_weighted)


def records_json(records: list[HourRecord]) -> list[dict[str, Any]]:
    return [asdict(r) for r in records]
