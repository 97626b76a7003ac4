"""One evaluated day of one grid and one strategy: forecast, plan, replay, hour by hour.

* **Forecasts**: at 00:00 of the day, the forecaster's model (``--forecast-model``, the service's default ``auto``)
  is fitted on the history before the day only (CI: the grid's previous days; load: the load shape's previous
  days) and forecasts the 24 hours; ``oracle`` uses the actual values instead (what forecast errors cost).
* **Plans**: every hour the real planner (``greenserve.optimizer.plan_builder.Planner``) runs the strategy's solvers on
  the remaining hours of the day, with the plan of the previous hour in force; the interval of the hour is applied.
* **Replay**: each hour the pool's traffic (GreenCache's multi-turn conversations at the hour's actual rate) is
  replayed through the simulator on the engines the plan weights, each with the plan's cache size. The window
  (``window_s``, 600 s by default) stands for the hour: energy per request and attainment are measured on it, the
  idle power of every engine and the embodied carbon of every GPU and of the allocated cache are charged for the
  whole hour. The windows are replayed back to back and carry the state of the fleet (hour.py): cache contents,
  conversations straddling the boundary, an empty DRAM tier after a resize (LMCache restarts for a new size).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from greenserve.common import carbon
from greenserve.common.carbon_params import CarbonParams, load_default_params
from greenserve.common.embodied_carbon import amortised_embodied_g
from greenserve.evaluation.hour import PoolState, replay_hour, restart_changed, warm_start
from greenserve.evaluation.scenario import (
    GIB,
    WORKLOAD_OUTPUT_TOKENS,
    WORKLOAD_PROMPT_TOKENS,
    PoolScenario,
    Scenario,
)
from greenserve.forecaster.forecast_models import make_model
from greenserve.optimizer import capacity
from greenserve.optimizer.inputs import GPU_FAMILY
from greenserve.optimizer.plan_builder import Planner
from greenserve.optimizer.planning import PlanningInputs, SeriesForecast
from greenserve.optimizer.solvers.baselines import EvenRouting, FixedCache
from greenserve.optimizer.solvers.coupled import CoupledSolver
from greenserve.optimizer.solvers.cache_greencache import GreenCacheIlp
from greenserve.optimizer.solvers.keep_current import KeepCurrent
from greenserve.optimizer.solvers.mig_variants import MigVariantsSolver
from greenserve.optimizer.solvers.routing_weights import MinCarbonRouting, placement_engine_id
from greenserve.optimizer.solvers.serving_modes import (
    MODE_NAMES,
    SPEC_DECODE,
    STANDALONE,
    VOCAB_SIZE,
    GreenLlmModes,
    engine_profile,
)
from greenserve.optimizer.solvers import mig_patterns as mp
from greenserve.simulator.clocks import clocked_profile
from greenserve.simulator.engine_profile import EngineProfile, list_profiles, load_profile
from greenserve.simulator.mode_configs import SpecDecodeConfig
from greenserve.simulator.perf_model import PerfModel
from greenserve.v1 import common_pb2

HOUR_S = 3600
DEFAULT_WINDOW_S = 600.0
# The load margin the coupled plan carries is learned from day-ahead backtests of the load forecast on the history.
MARGIN_BACKTEST_DAYS = 3
MARGIN_QUANTILE = 0.95
MAX_LOAD_MARGIN = 2.0
# When the load of an hour runs above what its plan carries, the live loop re-plans on the observed load
# (optimizer/loop.py); the evaluation replays that reaction: the plan in force runs the hour's first part, the
# re-plan the rest.
PARTS_PER_HOUR = 6  # the loop looks every ten minutes of the hour
REPLAN_COOLDOWN_PARTS = 1  # and re-plans a pool at most once per part (a breach re-plan's cooldown)
# The capacity derate after an SLO breach, and how a good hour wins it back (the live loop's rule: loop.py).
DERATE_STEP = 0.85
DERATE_RECOVERY = 0.95
MIN_DERATE = 0.5
RECOVERY_MARGIN = 0.02

STRATEGIES: dict[str, str] = {
    "base_full_cache": "today's static fleet: every engine weighted equally, the largest cache (Full Cache + BASE)",
    "no_cache": "every engine weighted equally, no KV cache tier",
    "greencache": "GreenCache alone: cache sizes by the ILP, engines weighted equally",
    "carbon_routing": "min-carbon routing alone, the largest cache",
    "serving_modes": "GreenLLM's serving modes alone (Standalone or SpecDecode with the pool's draft, per hour), "
                     "engines weighted equally, the largest cache",
    "joint": "the joint plan: min-carbon routing, the GreenCache ILP and GreenLLM's serving modes (and, when the "
             "scenario declares MIG GPUs, CLOVER's MIG layouts with model variants)",
    "mig_variants": "CLOVER alone: MIG layouts with a model variant per instance (clover-exact, accuracy loss <= 4 %), "
                    "instances weighted by their capacity, the largest cache; only with a scenario declaring MIG GPUs",
}
MIG_MAX_ACCURACY_LOSS_FRACTION = 0.04  # CLOVER's 2-4 % (Sec. 5.2.1); the cap the clover-exact solver plans under


def strategies_for(scenario: Scenario) -> list[str]:
    """The strategies an evaluation runs by default: ``mig_variants`` only when the scenario declares MIG GPUs."""
    return [s for s in STRATEGIES if s != "mig_variants" or scenario.has_mig]


def solvers_for(strategy: str, mig: bool = False) -> list[Any]:
    """The strategy's solvers; ``mig``: the scenario declares MIG GPUs (``joint`` then plans their layouts too)."""
    keep = [KeepCurrent("mig_layouts"), KeepCurrent("serving_modes")]
    clover = MigVariantsSolver(max_accuracy_loss_fraction=MIG_MAX_ACCURACY_LOSS_FRACTION)
    if strategy == "mig_variants":
        return [EvenRouting(), FixedCache(full=True), clover, keep[1]]
    if strategy == "base_full_cache":
        return [EvenRouting(), FixedCache(full=True), *keep]
    if strategy == "no_cache":
        return [EvenRouting(), FixedCache(full=False), *keep]
    if strategy == "greencache":
        return [EvenRouting(), GreenCacheIlp(routing_fills_fewest=False), *keep]
    if strategy == "carbon_routing":
        return [MinCarbonRouting(), FixedCache(full=True), *keep]
    if strategy == "serving_modes":
        return [EvenRouting(), FixedCache(full=True), keep[0], GreenLlmModes()]
    if strategy == "joint":
        return [CoupledSolver(), clover if mig else keep[0], GreenLlmModes()]
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
    prefix_hit_fraction: float = 0.0  # prompt tokens found in a cache tier / prompt tokens (all pools)
    cache_restarts: int = 0  # engines whose LMCache DRAM tier restarted empty for a new size
    engine_restarts: int = 0  # engines restarted for a new serving mode
    cache_bytes: dict[str, int] = field(default_factory=dict)
    engines_weighted: dict[str, int] = field(default_factory=dict)
    serving_modes: dict[str, str] = field(default_factory=dict)  # pool -> mode run this hour
    plan_changed: bool = False
    # pool -> {"<MIG profile> <variant>" or "whole <variant>": engines} run this hour (MIG pools only)
    mig_layout: dict[str, dict[str, int]] = field(default_factory=dict)
    # traffic-weighted quality loss of the variants that served the hour: sum of requests x (1 - quality_fraction)
    # over requests (the window's requests per engine, each pool weighted by its hour's traffic)
    accuracy_loss_fraction: float = 0.0
    # what the plan predicted for the hour (its first interval, at the forecast load) and at the interval's upper load
    attainment_predicted_fraction: float = 0.0
    attainment_predicted_at_upper_fraction: float = 0.0
    sm_clock_fraction: dict[str, float] = field(default_factory=dict)  # pool -> SM clock the plan locked (1: unlocked)
    engines_asleep: dict[str, int] = field(default_factory=dict)  # pool -> engines the plan put to sleep
    replanned: bool = False  # the load ran above what the plan carries: re-planned after the hour's first part
    pool_dram_restarts: dict[str, int] = field(default_factory=dict)  # pool -> its LMCache DRAM resizes this hour
    # carbon the plan expected to save in the hour against the static fleet, by lever (routing, cache, clock,
    # sleep), as the planner's model predicted it at the forecast load and CI (the coupled planner only)
    saved_g_by_lever_predicted: dict[str, float] = field(default_factory=dict)
    pool_attainment: dict[str, float] = field(default_factory=dict)  # pool -> TTFT and TPOT attainment
    capacity_derate: dict[str, float] = field(default_factory=dict)  # pool -> derate in force after the hour
    first_part_plan: dict[str, Any] = field(default_factory=dict)  # engines, cache, clocks before a re-plan landed
    attainment_first_part_fraction: float | None = None  # attainment before the re-plan landed


def forecast_day(history: np.ndarray, history_start_s: int, truth: np.ndarray, model: str,
                 hours: int = 24) -> SeriesForecast:
    """Forecast of the ``hours`` after the history, from ``history`` only; ``oracle``: the truth, which must then
    hold those hours (a model's forecast does not look at it: a day evaluated in part needs only its hours)."""
    if model == "oracle":
        if len(truth) < hours:
            raise ValueError(f"the oracle forecast needs the actual values of {hours} h, got {len(truth)}")
        values = tuple(float(v) for v in truth[:hours])
        return SeriesForecast(values, values, values, "oracle")
    fitted = make_model(model).fit(np.asarray(history, dtype=np.float64), start_s=history_start_s)
    pred = fitted.predict(hours)
    clean = [tuple(max(0.0, float(v)) if math.isfinite(v) else 0.0 for v in arr)
             for arr in (pred.mean, pred.lower, pred.upper)]
    return SeriesForecast(clean[0], clean[1], clean[2], pred.model)


def _gpu_embodied_g_per_h(hardware: str, params: CarbonParams) -> float:
    count = int(hardware.split("x")[0]) if "x" in hardware.split("-")[0] else 1
    family = next((f for key, f in GPU_FAMILY.items() if key in hardware), None)
    if family is None:
        return 0.0
    try:
        spec = params.component(f"gpu.{family}")
    except ValueError:
        return 0.0
    return count * amortised_embodied_g(duration_s=HOUR_S, lifetime_s=spec.lifetime_s,
                                               embodied_g=spec.embodied_g)


def run_day(*, scenario: Scenario, region: str, day_start_s: int, ci_actual: np.ndarray, ci_history: np.ndarray,
            ci_history_start_s: int, load_shape_day: np.ndarray, load_shape_history: np.ndarray,
            load_history_start_s: int, strategy: str, forecast_model: str = "auto",
            window_s: float = DEFAULT_WINDOW_S, hours: int = 24,
            params: CarbonParams | None = None, ci_forecast: SeriesForecast | None = None,
            load_forecast: SeriesForecast | None = None, actual_load_scale: float = 1.0,
            on_hour: Callable[[int], None] | None = None) -> list[HourRecord]:
    """Plans and replays ``hours`` hours of one day (see the module docstring); ``ci_forecast`` /
    ``load_forecast``: the day's forecasts when already made (``forecast_day``), shared by the strategies;
    ``actual_load_scale``: the replayed load is this multiple of the day's (a forecast that much too low);
    ``on_hour(h)``: called as each hour's replay ends (a progress bar's tick)."""
    if not (actual_load_scale > 0 and math.isfinite(actual_load_scale)):
        raise ValueError(f"actual_load_scale: must be a finite number > 0, got {actual_load_scale!r}")
    params = params or load_default_params()
    fleet = scenario.fleet(region)
    peak = float(max(np.nanmax(load_shape_history), np.max(load_shape_day), 1e-9))  # a user's trace may miss hours
    ci_fc = ci_forecast or forecast_day(ci_history, ci_history_start_s, ci_actual, forecast_model)
    load_fc_shape = load_forecast or forecast_day(load_shape_history, load_history_start_s, load_shape_day,
                                                  forecast_model)
    # A stress run: the day's actual load runs at actual_load_scale x its shape while the forecasts, the pools'
    # scaling to their peak and the learned margin see the shape as it is.
    load_shape_day = np.asarray(load_shape_day, dtype=np.float64) * actual_load_scale
    solvers = solvers_for(strategy, scenario.has_mig)
    planner = Planner(solvers, solver_timeout_s=120.0)
    coupled = next((s for s in solvers if isinstance(s, CoupledSolver)), None)
    margin = learn_load_margin(load_shape_history, load_history_start_s, forecast_model) if coupled else None
    derate = {p.name: 1.0 for p in scenario.pools}  # capacity the planner may count, learned from breaches
    # A pool with count_prefix_hits: the planner's capacity per engine counts prefix reuse. The prefix-cache hit
    # fraction the system measured, the pool's in the window replayed last (what the cache-manager sees), rounded
    # down (capacity.hit_fraction_step; none before the first hour is measured), sets the conversations' shape; how
    # much an engine hits is replayed on its own HBM plus the DRAM tier per engine in force (the last plan's).
    # Other pools: no prefix reuse assumed.
    measured_hits: dict[str, float] = {}

    def capabilities() -> tuple[dict[str, capacity.Capability], dict[str, float]]:
        caps, hits = {}, {}
        for pool_s, pool in zip(scenario.pools, fleet.pools):
            measured = measured_hits.get(pool.name, 0.0) if pool_s.count_prefix_hits else 0.0
            hits[pool.name] = capacity.hit_fraction_step(measured)
            dram = (states[pool.name].cache_bytes or 0) if hits[pool.name] > 0 else 0
            cap = capacity.predict(pool_s.profile, pool_s.ttft_s, pool_s.tpot_s, pool_s.attainment_fraction,
                                   pool.mean_prompt_tokens, pool.mean_output_tokens, hits[pool.name], dram)
            for engine in pool.engines:
                caps[engine.id] = cap
        return caps, hits

    records: list[HourRecord] = []
    current: common_pb2.Plan | None = None
    states = {pool.name: PoolState() for pool in scenario.pools}
    # The hit rate the system measured in the hour before the day, under the static fleet that ran then (every
    # engine, the largest cache): what the first plan knows of prefix reuse, as a live loop knows its last hour's.
    for pool_s in scenario.pools:
        if pool_s.count_prefix_hits:
            ids = _engine_ids(pool_s)
            before = replay_hour(pool_s.profile, ids, float(load_shape_day[0]) * pool_s.peak_requests_per_s / peak,
                                 dict.fromkeys(ids, 1.0), int(pool_s.max_cache_dram_gib * GIB), pool_s.ttft_s,
                                 pool_s.tpot_s, int(day_start_s // HOUR_S) + 15485863, -2, window_s, PoolState())
            if before.requests_measured:
                measured_hits[pool_s.name] = before.prefix_hit_fraction
    try:
        for h in range(hours):
            left = 24 - h
            load = {}
            for pool_s in scenario.pools:
                scale = pool_s.peak_requests_per_s / peak
                load[pool_s.name] = SeriesForecast(
                    tuple(v * scale for v in load_fc_shape.mean[h:]), tuple(v * scale for v in load_fc_shape.lower[h:]),
                    tuple(v * scale for v in load_fc_shape.upper[h:]), load_fc_shape.model)
            caps, hits = capabilities()
            inputs = PlanningInputs(
                start_s=day_start_s + HOUR_S * h, horizon_hours=left, fleet=fleet,
                ci={region: SeriesForecast(ci_fc.mean[h:], ci_fc.lower[h:], ci_fc.upper[h:], ci_fc.model)},
                load=load, capabilities=caps, params=params, gpu_platform={}, current=current,
                prefix_hit_fraction=hits,
                load_margin={} if margin is None else {p.name: margin for p in scenario.pools},
                capacity_derate=dict(derate),
                dram_restarts_last_day={p.name: sum(1 for r in records if r.pool_dram_restarts.get(p.name))
                                        for p in scenario.pools})
            plan = planner.plan(inputs, trigger="schedule", created_s=day_start_s + HOUR_S * h).plan
            plan.version = h + 1
            interval = plan.intervals[0]
            changed = current is not None and (
                list(current.intervals[0].cache_targets) != list(interval.cache_targets)
                or list(current.intervals[0].serving_modes) != list(interval.serving_modes)
                or list(current.intervals[0].mig_layouts) != list(interval.mig_layouts)
                or [(w.engine_id, round(w.weight, 3)) for w in current.intervals[0].routing_weights]
                != [(w.engine_id, round(w.weight, 3)) for w in interval.routing_weights])
            current = plan
            seed = int(day_start_s // HOUR_S) + h
            if h == 0:
                for pool_s in scenario.pools:
                    weights, size = _pool_plan(interval, pool_s.name)
                    rate = float(load_shape_day[0]) * pool_s.peak_requests_per_s / peak
                    mode = next((t.serving_mode for t in interval.serving_modes if t.pool == pool_s.name), STANDALONE)
                    engines = pool_engines(pool_s, interval, weights, size)
                    warm_start(pool_s.profile, engines.ids, rate, engines.weights, engines.cache_bytes, seed, window_s,
                               states[pool_s.name], spec=_spec_for(pool_s, mode), engine_profiles=engines.profiles)
                    states[pool_s.name].engines = frozenset(engines.ids)
            actual = {p.name: float(load_shape_day[h]) * p.peak_requests_per_s / peak for p in scenario.pools}
            # Every strategy's hour is replayed in the same parts; only the coupled plan re-plans between them.
            # The live loop watches the hour in PARTS_PER_HOUR parts (the router reports attainment every
            # minute; the loop re-plans on a breach at most once per cooldown): after a part whose pool's load
            # ran above what the plan carries, or whose measured attainment fell below the floor, the loop
            # re-plans on the observed load (after a breach with the pool's capacity derated: the model
            # promised more than the engines gave) and that plan runs the next parts.
            parts: list[HourRecord] = []
            first_interval = interval
            replans = 0
            cooldown = 0
            for k in range(PARTS_PER_HOUR):
                part = _measure_hour(scenario, interval, h, float(ci_actual[h]), float(ci_fc.mean[h]),
                                     load_shape_day, load_fc_shape, peak, params, window_s / PARTS_PER_HOUR,
                                     seed + 104729 * k, states, measured_hits, replay_id=h + 1000 * k)
                parts.append(part)
                cooldown -= 1
                if coupled is None or k == PARTS_PER_HOUR - 1 or cooldown > 0:
                    continue
                carried = {p.pool: p.capacity_requests_per_s * coupled.headroom for p in interval.pools}
                over = [name for name in actual if actual[name] > carried.get(name, math.inf)]
                breached = [name for name, a in part.pool_attainment.items() if a < coupled.floor]
                if not (over or breached):
                    continue
                for name in breached:
                    derate[name] = max(MIN_DERATE, derate[name] * DERATE_STEP)
                observed = {name: SeriesForecast((rate, *fc.mean[1:]), (rate, *fc.lower[1:]),
                                                 (rate, *fc.upper[1:]), fc.model)
                            for name, fc in load.items() for rate in (actual[name],)}
                caps, hits = capabilities()
                plan = planner.plan(dataclasses.replace(inputs, load=observed, current=plan, capabilities=caps,
                                                        prefix_hit_fraction=hits, interval_capabilities=None,
                                                        capacity_derate=dict(derate)),
                                    trigger="slo_breach" if breached else "load_change",
                                    created_s=day_start_s + HOUR_S * (h + (k + 1) / PARTS_PER_HOUR)).plan
                plan.version = h + 1
                interval = plan.intervals[0]
                current = plan
                replans += 1
                cooldown = REPLAN_COOLDOWN_PARTS
            record = combine_parts(parts)
            first = parts[0]
            record.first_part_plan = {"engines_weighted": first.engines_weighted, "cache_bytes": first.cache_bytes,
                                      "sm_clock_fraction": {g.pool: g.sm_clock_fraction or 1.0
                                                            for g in first_interval.gpu_power}}
            record.replanned = replans > 0
            for name, a in record.pool_attainment.items():  # a good hour wins back part of a derate
                if coupled is not None and a >= coupled.floor + RECOVERY_MARGIN:
                    derate[name] = min(1.0, derate[name] / DERATE_RECOVERY)
            record.capacity_derate = dict(derate)
            record.plan_changed = changed
            record.attainment_predicted_fraction = interval.expected_slo_attainment_fraction
            uppers = [p.expected_slo_attainment_at_upper_fraction for p in interval.pools
                      if p.HasField("expected_slo_attainment_at_upper_fraction")]
            record.attainment_predicted_at_upper_fraction = min(uppers) if uppers else 0.0
            record.sm_clock_fraction = {g.pool: g.sm_clock_fraction or 1.0 for g in interval.gpu_power}
            record.saved_g_by_lever_predicted = {}
            for p in interval.pools:
                for lever, grams in p.expected_saved_g_by_lever.items():
                    record.saved_g_by_lever_predicted[lever] = record.saved_g_by_lever_predicted.get(lever, 0.0) + grams
            record.engines_asleep = {p.name: sum(1 for r in interval.engine_runs if r.pool == p.name and r.state
                                                 == common_pb2.ENGINE_RUN_STATE_SLEEPING) for p in scenario.pools}
            records.append(record)
            if on_hour:
                on_hour(h)
    finally:
        planner.close()
    return records


def _engine_ids(pool: PoolScenario) -> list[str]:
    return [f"{pool.name}-{i}" for i in range(pool.engines)]


@dataclass
class PoolEngines:
    """The engines one pool runs in an hour: its whole GPUs, or one engine per MIG instance of the plan's layout."""

    ids: list[str]
    weights: dict[str, float]
    cache_bytes: int  # DRAM per engine
    quality: dict[str, float]  # engine id -> quality_fraction of its variant
    profiles: dict[str, Any] | None = None  # engine id -> EngineProfile (MIG instances); None: the pool's profile
    layout: dict[str, int] = field(default_factory=dict)  # "<profile> <variant>" -> instances


def _slice_profile(sim_model: str, gpu_model: str, profile: str, variant: common_pb2.ModelVariant,
                   pool_model: str) -> EngineProfile:
    """The simulator profile of ``variant`` on one MIG slice, as the clover-exact solver predicted it
    (``mig_patterns.predicted_option``): the stored slice profile when its weight bytes match, else the closest
    profile scaled to the slice."""
    bpp = mp.weight_bytes_per_param(variant, pool_model)
    exact = f"{sim_model}@{gpu_model}-MIG-{profile}"
    if exact in list_profiles() and math.isclose(load_profile(exact).weight_bytes_per_param, bpp):
        return load_profile(exact)
    built = mp.scaled_engine_profile(sim_model, gpu_model, profile, bpp)
    if built is None:
        raise ValueError(f"no simulator profile of {sim_model} on {gpu_model} {profile}")
    return built[0]


_SLICE_CAPACITY: dict[tuple[str, str, str, str, float, float, float], float] = {}


def _slice_capacity(pool: PoolScenario, gpu_model: str, profile: str, variant: common_pb2.ModelVariant) -> float:
    """Requests/s one instance carries at the pool's SLO (the solver's option): its routing weight."""
    key = (pool.model, gpu_model, profile, variant.name, pool.ttft_s, pool.tpot_s, pool.attainment_fraction)
    if key not in _SLICE_CAPACITY:
        proto = common_pb2.Pool(name=pool.name, model=pool.model, slo=common_pb2.Slo(
            ttft_s=pool.ttft_s, tpot_s=pool.tpot_s, attainment_fraction=pool.attainment_fraction),
            mean_prompt_tokens=WORKLOAD_PROMPT_TOKENS, mean_output_tokens=WORKLOAD_OUTPUT_TOKENS)
        option = mp.predicted_option(proto, gpu_model, profile, variant, variant.simulator_model or pool.simulator_model,
                                     "variants")
        _SLICE_CAPACITY[key] = option.capacity_requests_per_s if option is not None else 0.0
    return _SLICE_CAPACITY[key]


def pool_engines(pool: PoolScenario, interval: common_pb2.PlanInterval, weights: dict[str, float],
                 cache_bytes: int) -> PoolEngines:
    """The pool's engines this hour. A MIG pool whose GPUs the plan partitions runs one engine per instance (id
    ``<gpu>/<profile>@<start>/<variant>``, so that an instance the next layout changes is a new engine with empty
    caches), its variant on that slice's profile, weighted as the plan weights its placement
    (``routing_weights.placement_engine_id``: the planner splits a partitioned GPU's weight over its instances by
    their capacity at the pool's SLO), or by that capacity when the plan names no weight for it; the DRAM of a GPU
    is shared by its instances. Otherwise the pool's whole GPUs, each the best variant."""
    variants = {v.name: v for v in pool.variant_protos}
    top = pool.variant_protos[0]
    ids: list[str] = []
    profiles: dict[str, Any] = {}
    quality: dict[str, float] = {}
    inst_weights: dict[str, float] = {}
    layout: dict[str, int] = {}
    gpus_used = set()
    if pool.mig:
        for mig in interval.mig_layouts:
            for pl in mig.placements:
                if pl.pool != pool.name or not pl.model_variant:
                    continue
                variant = variants.get(pl.model_variant, top)
                eid = f"{mig.gpu_uuid}/{pl.profile}@{pl.start}/{variant.name}"
                ids.append(eid)
                profiles[eid] = _slice_profile(variant.simulator_model or pool.simulator_model, pool.hardware,
                                               pl.profile, variant, pool.model)
                quality[eid] = variant.quality_fraction
                planned = weights.get(placement_engine_id(mig.gpu_uuid, pl.profile, pl.start))
                inst_weights[eid] = (planned if planned is not None
                                     else _slice_capacity(pool, pool.hardware, pl.profile, variant))
                layout[f"{pl.profile} {variant.name}"] = layout.get(f"{pl.profile} {variant.name}", 0) + 1
                gpus_used.add(mig.gpu_uuid)
    if ids:
        share = int(cache_bytes * pool.engines / len(ids))
        return PoolEngines(ids, inst_weights, share, quality, profiles, layout)
    ids = _engine_ids(pool)
    power = next((g for g in interval.gpu_power if g.pool == pool.name), None)
    clocked = None
    if power is not None and 0 < power.sm_clock_fraction < 1.0:  # the plan locks the pool's SM clocks
        slow = clocked_profile(load_profile(pool.profile), power.sm_clock_fraction)
        clocked = {eid: slow for eid in ids}
    return PoolEngines(ids, weights, cache_bytes, {eid: top.quality_fraction for eid in ids}, clocked,
                       {f"whole {top.name}": pool.engines} if pool.mig else {})


def _pool_plan(interval: common_pb2.PlanInterval, pool: str) -> tuple[dict[str, float], int]:
    """(routing weights by engine id, DRAM bytes per engine) the interval gives ``pool``."""
    weights = {w.engine_id: w.weight for w in interval.routing_weights if w.pool == pool}
    target = next((t for t in interval.cache_targets if t.pool == pool), None)
    return weights, int(target.dram_bytes or target.disk_bytes) if target is not None else 0


def _spec_for(pool: PoolScenario, mode: common_pb2.ServingMode) -> SpecDecodeConfig | None:
    """The replay's speculative decoding for a plan's mode: SpecDecode runs the pool's draft on the same GPU (as the
    serving-mode solver evaluates it); the modes that need an older GPU cannot be declared by a scenario."""
    if mode == STANDALONE:
        return None
    if mode != SPEC_DECODE or not pool.draft_model:
        raise ValueError(f"{pool.name}: the plan asks for mode {MODE_NAMES.get(mode, mode)}, which the scenario's "
                         f"pool cannot run (a draft model is needed for SpecDecode; DPD/DSD need older GPUs)")
    draft = engine_profile(pool.draft_model, pool.hardware)
    if draft is None:
        raise ValueError(f"{pool.name}: no simulator profile of the draft {pool.draft_model} on {pool.hardware}")
    return SpecDecodeConfig(draft=draft, num_speculative_tokens=pool.draft_tokens,
                            acceptance_rate=pool.draft_acceptance_fraction, vocab_size=VOCAB_SIZE)


def _measure_hour(scenario: Scenario, interval: common_pb2.PlanInterval, h: int, ci: float, ci_forecast: float,
                  shape_day: np.ndarray, shape_fc: SeriesForecast, peak: float, params: CarbonParams,
                  window_s: float, seed: int, states: dict[str, PoolState],
                  hits_out: dict[str, float] | None = None, replay_id: int | None = None) -> HourRecord:
    """One hour replayed under ``interval``; ``hits_out`` (pool -> prefix-hit fraction measured) is filled.
    ``replay_id``: the id the replay's conversations are numbered by (default ``h``; a second part of a split hour
    takes another so that its conversations are new ones)."""
    energy_j = 0.0
    embodied_compute = embodied_storage = 0.0
    requests_total = ok_t = ok_p = ok_both = 0.0
    measured_total = restarts = engine_restarts = 0
    hit_weighted = 0.0
    load_actual = load_forecast = 0.0
    cache_bytes: dict[str, int] = {}
    engines_weighted: dict[str, int] = {}
    modes: dict[str, str] = {}
    layouts: dict[str, dict[str, int]] = {}
    loss_weighted = 0.0
    pool_restarts: dict[str, int] = {}
    pool_attainment: dict[str, float] = {}
    for pool in scenario.pools:
        scale = pool.peak_requests_per_s / peak
        rate = float(shape_day[h]) * scale
        load_actual += rate
        load_forecast += float(shape_fc.mean[h]) * scale
        weights, size = _pool_plan(interval, pool.name)
        target = next((t for t in interval.cache_targets if t.pool == pool.name), None)
        cache_bytes[pool.name] = size
        engines_weighted[pool.name] = sum(1 for w in weights.values() if w > 0) or pool.engines
        mode = next((t.serving_mode for t in interval.serving_modes if t.pool == pool.name), STANDALONE)
        modes[pool.name] = MODE_NAMES.get(mode, "Standalone")
        engines = pool_engines(pool, interval, weights, size)
        if pool.mig:
            layouts[pool.name] = engines.layout
            if engines.profiles:  # MIG instances: the engines the replay weights, not the plan's whole-GPU engines
                engines_weighted[pool.name] = sum(1 for w in engines.weights.values() if w > 0) or len(engines.ids)
        state = states[pool.name]
        layout_restarts = restart_changed(state, engines.ids)
        out = replay_hour(pool.profile, engines.ids, rate, engines.weights, engines.cache_bytes, pool.ttft_s,
                          pool.tpot_s, seed, h if replay_id is None else replay_id, window_s, state,
                          spec=_spec_for(pool, mode), engine_profiles=engines.profiles)
        served = sum(out.requests_by_engine.values())
        if served:
            loss_weighted += rate * HOUR_S * sum(n * (1.0 - engines.quality.get(eid, 1.0))
                                        for eid, n in out.requests_by_engine.items()) / served
        a_t, a_p, a_b, n, per_request_j = (out.ttft_fraction, out.tpot_fraction, out.both_fraction,
                                           out.requests_measured, out.dynamic_energy_per_request_j)
        hit_weighted += rate * HOUR_S * out.prefix_hit_fraction
        if hits_out is not None and out.requests_measured:
            hits_out[pool.name] = out.prefix_hit_fraction
        restarts += out.cache_restarts
        pool_restarts[pool.name] = 1 if out.cache_restarts else 0
        engine_restarts += out.engine_restarts + layout_restarts
        idle_w = PerfModel(load_profile(pool.profile)).power_w(0.0)
        requests = rate * HOUR_S
        energy_j += pool.engines * idle_w * HOUR_S + per_request_j * requests
        embodied_compute += pool.engines * _gpu_embodied_g_per_h(pool.hardware, params)
        embodied_storage += pool.engines * carbon.cache_tiers_embodied_g(
            dram_bytes=target.dram_bytes if target else 0, disk_bytes=target.disk_bytes if target else 0,
            duration_s=HOUR_S, params=params)
        requests_total += requests
        pool_attainment[pool.name] = a_b
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
        prefix_hit_fraction=hit_weighted / norm if requests_total else 0.0, cache_restarts=restarts,
        engine_restarts=engine_restarts,
        cache_bytes=cache_bytes, engines_weighted=engines_weighted, serving_modes=modes, mig_layout=layouts,
        accuracy_loss_fraction=loss_weighted / norm if requests_total else 0.0, pool_dram_restarts=pool_restarts,
        pool_attainment=pool_attainment)


def learn_load_margin(history: np.ndarray, history_start_s: int, model: str, days: int = MARGIN_BACKTEST_DAYS,
                      quantile: float = MARGIN_QUANTILE) -> float | None:
    """The load a plan must carry per unit of forecast mean, learned from day-ahead backtests on the history: for
    each of its last ``days`` days the model is fitted on the days before and forecasts that day; the margin is the
    ``quantile`` of actual / forecast over those hours, at most ``MAX_LOAD_MARGIN`` (a forecast that runs high
    learns a margin under 1). The oracle forecast needs none (1)."""
    if model == "oracle":
        return 1.0
    ratios: list[float] = []
    for d in range(days, 0, -1):
        cut = len(history) - 24 * d
        if cut < 48:
            continue
        fc = forecast_day(history[:cut], history_start_s, history[cut:cut + 24], model)
        for actual, mean in zip(history[cut:cut + 24], fc.mean):
            if math.isfinite(actual) and mean > 0:
                ratios.append(float(actual) / mean)
    if not ratios:
        return None  # too little history to backtest: the plan carries the forecast's upper bound
    return float(min(MAX_LOAD_MARGIN, np.quantile(ratios, quantile)))


def combine_parts(parts: list[HourRecord]) -> HourRecord:
    """One hour that ran as ``parts`` of equal length (re-plans landed in between): carbon, energy and attainment
    their mean (each part charged the whole hour's idle and embodied carbon and its requests at the hour's rate),
    counts added, the state the last part ended in; ``attainment_first_part_fraction`` is the first part's."""
    out = dataclasses.replace(parts[-1])
    n = len(parts)
    for name in ("operational_g", "embodied_compute_g", "embodied_storage_g", "total_g", "energy_kwh",
                 "ttft_attainment_fraction", "tpot_attainment_fraction", "attainment_fraction",
                 "prefix_hit_fraction", "accuracy_loss_fraction"):
        setattr(out, name, sum(getattr(p, name) for p in parts) / n)
    for name in ("requests_measured", "cache_restarts", "engine_restarts"):
        setattr(out, name, sum(getattr(p, name) for p in parts))
    pools = parts[-1].pool_dram_restarts
    out.pool_dram_restarts = {pool: sum(p.pool_dram_restarts.get(pool, 0) for p in parts) for pool in pools}
    out.pool_attainment = {pool: sum(p.pool_attainment.get(pool, 0.0) for p in parts) / n
                           for pool in parts[-1].pool_attainment}
    out.attainment_first_part_fraction = parts[0].attainment_fraction
    return out


def records_json(records: list[HourRecord]) -> list[dict[str, Any]]:
    return [asdict(r) for r in records]
