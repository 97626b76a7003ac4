"""Gathering the planning inputs once per computation: forecasts (forecaster), profiles (profiler, else the
simulator's predictions), the fleet, carbon parameters.

Degraded modes: when the forecaster does not answer (down, or late past ``timeout_s``), the last forecast of each
series (kept in memory and in the ``forecast_cache`` table) is used, aligned on its timestamps and marked stale in
the plan (source "cache", its age), up to ``forecast_max_age_s``; older than that it is marked expired and the loop
makes the safe plan instead (safe_plan.py). With no forecast cached at all the computation is refused with
FAILED_PRECONDITION. When the profiler does not answer, every engine is planned on simulator predictions and the
plan says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime

import grpc
from sqlalchemy.exc import IntegrityError
from greenserve.common.carbon_params import CarbonParams
from greenserve.common.embodied_carbon import Platform, PlatformItem
from greenserve.common.errors import FailedPrecondition
from greenserve.common.mig_geometry import instance_engine_ids
from greenserve.common.persistence import Database
from greenserve.optimizer import cache_tier_health, capacity, prefix_hits
from greenserve.optimizer import traffic_history as traffic_history_module
from greenserve.optimizer.fleet import GPU_HARDWARE, gpu_hardware
from greenserve.optimizer.models import ForecastCache
from greenserve.optimizer.planning import PlanningInputs, SeriesForecast
from greenserve.v1 import (
    cache_manager_pb2,
    cache_manager_pb2_grpc,
    common_pb2,
    forecaster_pb2,
    forecaster_pb2_grpc,
    profiler_pb2,
    profiler_pb2_grpc,
)

log = logging.getLogger("greenserve.optimizer.inputs")

MAX_HORIZON_STEPS = 168
#: ``SeriesForecast.source`` of a cached forecast older than ``forecast_max_age_s``: the loop then makes the safe
#: plan (safe_plan.py); "cache" is one within that age.
EXPIRED = "expired"
DEGRADED_SOURCES = ("cache", EXPIRED)
GPU_FAMILY = {"A100": "A100", "H100": "H100", "H200": "H200", "L40": "L40", "T4": "T4", "V100": "V100"}
# Served model names -> the simulator's model families (used when a pool names no variant with simulator_model).
SIMULATOR_MODELS = (
    (("llama-3.2", "1b"), "llama3.2-1b"), (("llama3.2", "1b"), "llama3.2-1b"),
    (("llama-3", "70b"), "llama3-70b"), (("llama3", "70b"), "llama3-70b"),
    (("llama-3", "8b"), "llama3-8b"), (("llama3", "8b"), "llama3-8b"),
    (("llama-2", "7b"), "llama2-7b"), (("llama2", "7b"), "llama2-7b"),
)


def guess_simulator_model(model: str) -> str | None:
    name = model.lower()
    for needles, family in SIMULATOR_MODELS:
        if all(n in name for n in needles):
            return family
    return None


def series_label(ref: common_pb2.SeriesRef) -> str:
    kind = "ci" if ref.kind == common_pb2.SERIES_KIND_CARBON_INTENSITY else "load"
    return f"{kind}:{ref.key}"


@dataclass
class ForecastSource:
    """Fetches forecasts and keeps the last good one per series (memory + database)."""

    db: Database
    channel: grpc.aio.Channel | None
    ci_signal: common_pb2.CarbonSignal = common_pb2.CARBON_SIGNAL_DIRECT
    max_age_s: float = 6 * 3600.0
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        self.stub = None if self.channel is None else forecaster_pb2_grpc.ForecasterServiceStub(self.channel)
        self.cache: dict[str, tuple[float, common_pb2.Forecast]] = {}
        with self.db.session(readonly=True) as s:
            for row in s.query(ForecastCache).all():
                fc = common_pb2.Forecast()
                fc.ParseFromString(bytes(row.body))
                self.cache[row.series] = (row.fetched_at.timestamp(), fc)

    def _store(self, label: str, fetched_s: float, forecast: common_pb2.Forecast) -> None:
        body = forecast.SerializeToString()
        fetched = datetime.fromtimestamp(fetched_s, UTC)
        for attempt in range(2):
            try:
                with self.db.session() as s:
                    row = s.get(ForecastCache, label)
                    if row is None:
                        s.add(ForecastCache(series=label, fetched_at=fetched, body=body))
                    else:
                        row.fetched_at, row.body = fetched, body
                return
            except IntegrityError:  # a concurrent first store of the series inserted the row (PostgreSQL): update it
                if attempt:
                    raise

    async def _prepend_actuals(self, ref: common_pb2.SeriesRef, forecast: common_pb2.Forecast, start_s: float) -> None:
        """Hours of the horizon that the history already covers (the current hour, typically) take the observed
        values, not the forecast's first point."""
        first = min((p.time.ToSeconds() for p in forecast.points), default=None)
        if first is None or start_s >= first or self.stub is None:
            return
        request = forecaster_pb2.GetPointsRequest(series=ref)
        request.start.FromSeconds(int(start_s))
        request.end.FromSeconds(int(first))
        try:
            reply = await self.stub.GetPoints(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError:
            return
        observed = [common_pb2.ForecastPoint(time=p.time, mean=p.value, lower=p.value, upper=p.value)
                    for p in reply.points[-MAX_HORIZON_STEPS:]]
        if observed:
            points = observed + list(forecast.points)
            del forecast.points[:]
            forecast.points.extend(points)

    async def get(self, ref: common_pb2.SeriesRef, start_s: float, hours: int, now_s: float,
                  notes: list[str]) -> SeriesForecast | None:
        """Hourly forecast of ``ref`` over ``hours`` from ``start_s``; None when the series is unknown."""
        label = series_label(ref)
        error = "no forecaster configured"
        if self.stub is not None:
            # Ask for enough steps to reach the end of the horizon from wherever the history ends.
            steps = MAX_HORIZON_STEPS
            try:
                reply = await self.stub.GetForecast(
                    forecaster_pb2.GetForecastRequest(series=ref, horizon_steps=steps), timeout=self.timeout_s)
                forecast = reply.forecast
                await self._prepend_actuals(ref, forecast, start_s)
                self.cache[label] = (now_s, forecast)
                await asyncio.to_thread(self._store, label, now_s, forecast)
                return _made(align(forecast, start_s, hours, model=forecast.model), forecast)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
                                  grpc.StatusCode.INVALID_ARGUMENT):
                    if label in self.cache:
                        error = f"{exc.code().name}: {exc.details()}"
                    else:
                        notes.append(f"no forecast for {label}: {exc.details()}")
                        return None
                else:
                    error = f"forecaster {exc.code().name}"
        cached = self.cache.get(label)
        if cached is None:
            raise FailedPrecondition(f"no forecast for {label} ({error}) and none cached: cannot plan")
        fetched_s, forecast = cached
        age_s = max(0.0, now_s - fetched_s)
        fc = align(forecast, start_s, hours, model=forecast.model)
        if age_s > self.max_age_s:  # too old to plan on: the loop makes the safe plan (safe_plan.py)
            notes.append(f"forecast for {label} is {age_s / 3600:.2f} h old, past the {self.max_age_s / 3600:.2f} h "
                         f"a plan may use (--forecast-max-age-s), and the forecaster does not answer ({error})")
            source = EXPIRED
        else:
            notes.append(f"forecast for {label} is stale: {age_s / 60:.0f} min old ({error})")
            source = "cache"
        return _made(SeriesForecast(fc.mean, fc.lower, fc.upper, fc.model, stale_s=age_s, source=source), forecast)


def _made(fc: SeriesForecast, forecast: common_pb2.Forecast) -> SeriesForecast:
    """``fc`` with when ``forecast`` was made and the history it had seen."""
    return dataclasses.replace(fc, made_s=forecast.generated_at.ToNanoseconds() / 1e9,
                               history_end_s=float(forecast.history_end.seconds))


def ci_series_ref(region: str, signal: common_pb2.CarbonSignal) -> common_pb2.SeriesRef:
    return common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key=region, carbon_signal=signal,
                                unit=common_pb2.UNIT_G_PER_KWH)


def load_series_ref(pool: common_pb2.Pool) -> common_pb2.SeriesRef:
    return common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_LOAD, key=pool.load_series_key or pool.name,
                                unit=common_pb2.UNIT_REQUESTS_PER_S)


def plan_forecasts(inputs: PlanningInputs, ci_signal: common_pb2.CarbonSignal) -> list[common_pb2.PlanForecast]:
    """The forecasts a plan was computed on (``Plan.forecasts``): the CI of each region, the load of each pool."""
    out = []
    pools = {pool.name: pool for pool in inputs.fleet.pools}
    series = [(ci_series_ref(region, ci_signal), fc) for region, fc in sorted(inputs.ci.items())]
    series += [(load_series_ref(pools[name]), fc) for name, fc in inputs.load.items() if name in pools]
    for ref, fc in series:
        item = common_pb2.PlanForecast(series=ref, model=fc.model, source=fc.source, stale_s=fc.stale_s)
        if fc.made_s > 0:
            item.generated_at.FromNanoseconds(int(round(fc.made_s * 1e9)))
        if fc.history_end_s > 0:
            item.history_end.FromSeconds(int(fc.history_end_s))
        out.append(item)
    return out


def align(forecast: common_pb2.Forecast, start_s: float, hours: int, model: str = "") -> SeriesForecast:
    """Hourly values at ``start_s + 3600 h`` from the forecast's timestamped points: the point covering each hour
    (an hour before the first point takes the first; past the last, the same hour of the latest day covered)."""
    points = sorted(forecast.points, key=lambda p: p.time.ToSeconds())
    if not points:
        raise FailedPrecondition(f"forecast of {forecast.series.key} has no points")
    times = [p.time.ToSeconds() for p in points]
    res = forecast.resolution_s or 3600
    mean, lower, upper = [], [], []
    for h in range(hours):
        t = start_s + 3600.0 * h
        while t > times[-1] + res - 1 and t - 86400.0 >= times[0]:
            t -= 86400.0
        idx = 0
        for i, ti in enumerate(times):
            if ti <= t:
                idx = i
            else:
                break
        # Average the points inside the hour when the series is finer than hourly.
        group = [p for p, ti in zip(points, times) if t <= ti < t + 3600.0] or [points[idx]]
        mean.append(_finite_mean([p.mean for p in group]))
        lower.append(_finite_mean([p.lower for p in group]))
        upper.append(_finite_mean([p.upper for p in group]))
    return SeriesForecast(tuple(mean), tuple(lower), tuple(upper), model)


def _finite_mean(values: list[float]) -> float:
    good = [v for v in values if math.isfinite(v)]
    return max(0.0, sum(good) / len(good)) if good else 0.0


async def fetch_profiles(channel: grpc.aio.Channel | None, notes: list[str],
                         timeout_s: float = 3.0) -> list[common_pb2.Profile]:
    """The latest version of every stored profile: ListProfiles' pages one after another, within ``timeout_s`` in
    all (a profiler from before paging answers everything on the first page, with no next_page_token). A page
    larger than the channel takes (RESOURCE_EXHAUSTED: profiles of many points) is asked again at half the size."""
    if channel is None:
        return []
    stub = profiler_pb2_grpc.ProfilerServiceStub(channel)
    request = profiler_pb2.ListProfilesRequest(latest_only=True, page_size=1000)  # the profiler's largest page
    deadline = asyncio.get_running_loop().time() + timeout_s
    profiles: list[common_pb2.Profile] = []
    try:
        while True:
            left_s = max(deadline - asyncio.get_running_loop().time(), 0.001)  # past it: DEADLINE_EXCEEDED below
            try:
                reply = await stub.ListProfiles(request, timeout=left_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or request.page_size <= 1:
                    raise
                request.page_size //= 2
                continue
            profiles.extend(reply.profiles)
            if not reply.next_page_token:
                return profiles
            request.page_token = reply.next_page_token
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
            notes.append(f"profiler {exc.code().name}: every engine planned on simulator predictions")
        return []


def engine_hardware(engine: common_pb2.Engine, fleet: common_pb2.FleetInventory) -> str:
    if engine.hardware:
        return engine.hardware
    for gpu in fleet.gpus:
        if engine.mig_uuid:
            for inst in gpu.instances:
                if inst.uuid == engine.mig_uuid:
                    return f"{gpu_hardware(gpu)}-MIG-{inst.profile}"
        elif engine.gpu_uuid and gpu.uuid == engine.gpu_uuid:
            return gpu_hardware(gpu)
    return ""


def engine_variant(engine: common_pb2.Engine, pool: common_pb2.Pool) -> common_pb2.ModelVariant | None:
    for variant in pool.variants:
        if variant.name == engine.model_variant:
            return variant
    return pool.variants[0] if pool.variants else None


def mig_slice(engine: common_pb2.Engine, fleet: common_pb2.FleetInventory) -> tuple[str, str] | None:
    """(GPU geometry name, MIG profile) of the instance an engine runs on, from the fleet's GPUs (the instance with
    the engine's MIG UUID, or the one reporting its id), else from a ``"<gpu>-MIG-<profile>"`` hardware name; None
    for an engine on a whole GPU."""
    for gpu in fleet.gpus:
        for inst in gpu.instances:
            if (engine.mig_uuid and inst.uuid == engine.mig_uuid) or engine.id in instance_engine_ids(inst):
                name = GPU_HARDWARE.get(gpu.model) or gpu_hardware(gpu)
                return (name, inst.profile) if inst.profile else None
    if "-MIG-" in engine.hardware:
        gpu_model, _, profile = engine.hardware.partition("-MIG-")
        return gpu_model, profile
    return None


def mig_capability(pool: common_pb2.Pool, pool_index: int, gpu_model: str, profile: str,
                   variant: common_pb2.ModelVariant | None, sim_model: str | None, prefix_hit_fraction: float = 0.0
                   ) -> tuple[capacity.Capability | None, str]:
    """The capability of an engine on a ``profile`` slice of a ``gpu_model`` GPU: the variants-on-MIG solver's own
    prediction for that variant on that slice (``mig_patterns.predicted_option``: the stored slice profile, else the
    closest one scaled to the slice), so that a running instance and a planned one cost the same. (None, why) when
    it cannot be predicted (no simulator model, an unknown GPU or profile, the variant does not fit the slice)."""
    # Imported here: the solvers package imports this module (mig_setup uses engine_hardware).
    from greenserve.optimizer.solvers import mig_patterns

    vi = next((i for i, v in enumerate(pool.variants) if variant is not None and v.name == variant.name), None)
    field_ = (f"fleet.pools[{pool_index}].variants[{vi}].simulator_model" if vi is not None
              else f"fleet.pools[{pool_index}].model")
    try:
        option = mig_patterns.predicted_option(pool, gpu_model, profile, variant, sim_model, field_,
                                               prefix_hit_fraction)
    except (mig_patterns.NoOption, KeyError, ValueError) as exc:
        return None, f"no slice prediction ({exc})"
    if option is None:
        return None, "the variant does not fit the slice at the pool's request shape"
    return capacity.Capability(option.capacity_requests_per_s, option.idle_power_w, option.energy_per_request_j,
                               "predicted", option.detail), ""


def capabilities(fleet: common_pb2.FleetInventory, profiles: list[common_pb2.Profile],
                 notes: list[str], prefix_hit_fraction: dict[str, float] | None = None
                 ) -> dict[str, capacity.Capability]:
    """Capability of every engine of the fleet for its pool (stored profile first, else a prediction). An engine on a
    MIG instance without a stored profile of its slice is predicted as the variants-on-MIG solver predicts a new
    instance of that slice (``mig_capability``); only when that is impossible, from the closest whole-GPU profile.
    ``prefix_hit_fraction`` (pool -> measured fraction of prompt tokens found in the prefix cache, rounded down by
    ``capacity.hit_fraction_step``): predictions count that prefill as saved; a stored profile is taken as
    measured (with the cache it was measured with)."""
    hits = prefix_hit_fraction or {}
    out: dict[str, capacity.Capability] = {}
    predicted: list[str] = []
    approximate: list[str] = []
    index: dict[tuple[str, str], common_pb2.Profile] = {}
    for profile in profiles:
        cfg = profile.config
        if cfg.cache_dram_bytes or cfg.cache_disk_bytes or cfg.serving_mode not in (
                common_pb2.SERVING_MODE_UNSPECIFIED, common_pb2.SERVING_MODE_STANDALONE):
            continue
        hardware = cfg.hardware + (f"-MIG-{cfg.mig_profile}" if cfg.mig_profile else "")
        for name in filter(None, (cfg.model_variant, cfg.model)):
            index.setdefault((name, hardware), profile)
    for pi, pool in enumerate(fleet.pools):
        prompt = pool.mean_prompt_tokens or capacity.DEFAULT_PROMPT_TOKENS
        output = pool.mean_output_tokens or capacity.DEFAULT_OUTPUT_TOKENS
        for engine in pool.engines:
            hardware = engine_hardware(engine, fleet)
            variant = engine_variant(engine, pool)
            names = [n for n in ((variant.name, variant.model) if variant else ()) if n] + [pool.model]
            stored = next((index[(n, hardware)] for n in names if (n, hardware) in index), None)
            cap = capacity.from_profile(stored, pool.slo) if stored is not None else None
            sim_model = (variant.simulator_model if variant and variant.simulator_model else None) or \
                guess_simulator_model(variant.model if variant else pool.model) or guess_simulator_model(pool.model)
            where = mig_slice(engine, fleet) if cap is None else None
            if where is not None:
                cap, why = mig_capability(pool, pi, where[0], where[1], variant, sim_model, hits.get(pool.name, 0.0))
                if cap is not None:
                    predicted.append(engine.id)
                else:
                    approximate.append(f"{engine.id} on {where[0]} {where[1]}: {why}")
            if cap is None:
                profile_name, exact = capacity.simulator_profile_name(sim_model or "", hardware or "A100-80GB")
                if not exact:
                    approximate.append(f"{engine.id} ({sim_model or pool.model}@{hardware or '?'} -> {profile_name})")
                cap = capacity.predict(profile_name, pool.slo.ttft_s, pool.slo.tpot_s, pool.slo.attainment_fraction,
                                       prompt, output, hits.get(pool.name, 0.0))
                predicted.append(engine.id)
            out[engine.id] = cap
    if predicted:
        shown = ", ".join(predicted[:8]) + (f" and {len(predicted) - 8} more" if len(predicted) > 8 else "")
        notes.append(f"no stored profile for {len(predicted)} engine(s) ({shown}): capacity and energy predicted "
                     f"by the simulator")
    if approximate:
        notes.append("simulator has no exact performance model for " + "; ".join(approximate[:8]))
    return out


def gpu_platforms(fleet: common_pb2.FleetInventory, params: CarbonParams,
                  notes: list[str]) -> dict[str, Platform]:
    """Embodied platform of each GPU (its family's cited figure); GPUs without one are noted and not charged."""
    out: dict[str, Platform] = {}
    missing: set[str] = set()
    for gpu in fleet.gpus:
        hardware = gpu_hardware(gpu)
        family = next((f for key, f in GPU_FAMILY.items() if key in hardware), None)
        try:
            if family is None:
                raise KeyError(hardware)
            spec = params.component(f"gpu.{family}")
        except (KeyError, ValueError):
            missing.add(hardware or gpu.name or gpu.uuid)
            continue
        out[gpu.uuid] = Platform((PlatformItem(spec, 1),))
    if missing:
        notes.append(f"no cited embodied carbon for {', '.join(sorted(missing))}: not charged (set it in "
                     f"carbon_params)")
    return out


async def fetch_cache_sizes(channel: grpc.aio.Channel | None, notes: list[str],
                            timeout_s: float = 3.0) -> dict[str, tuple[int, int]]:
    """Per pool, the largest (DRAM, disk) sizes its LMCache servers hold now."""
    if channel is None:
        return {}
    try:
        reply = await cache_manager_pb2_grpc.CacheManagerServiceStub(channel).ListCacheServers(
            cache_manager_pb2.ListCacheServersRequest(), timeout=timeout_s)
    except grpc.aio.AioRpcError as exc:
        notes.append(f"cache-manager {exc.code().name}: cache sizes in force unknown")
        return {}
    sizes: dict[str, tuple[int, int]] = {}
    for server in reply.servers:
        dram, disk = sizes.get(server.pool, (0, 0))
        sizes[server.pool] = (max(dram, server.dram_bytes), max(disk, server.disk_bytes))
    return sizes


async def gather(*, fleet: common_pb2.FleetInventory, forecasts: ForecastSource, profiler: grpc.aio.Channel | None,
                 params: CarbonParams, start_s: float, hours: int, now_s: float,
                 current: common_pb2.Plan | None, carbon_weight_fraction: float,
                 declared: common_pb2.FleetInventory | None = None,
                 cache_manager: grpc.aio.Channel | None = None, traffic_history: bool = False) -> PlanningInputs:
    notes: list[str] = []
    if not fleet.pools:
        raise FailedPrecondition("the fleet has no pools: set one with SetFleet (greenserve fleet set)")
    regions = sorted({p.region for p in fleet.pools})
    ci_refs = [ci_series_ref(region, forecasts.ci_signal) for region in regions]
    load_refs = [load_series_ref(pool) for pool in fleet.pools]
    # Every series at once (one round trip's latency, not one per series); notes keep the series order.
    per_series_notes: list[list[str]] = [[] for _ in ci_refs + load_refs]
    fetched = await asyncio.gather(*(forecasts.get(ref, start_s, hours, now_s, per_series_notes[i])
                                     for i, ref in enumerate(ci_refs + load_refs)))
    for lines in per_series_notes:
        notes.extend(lines)
    ci: dict[str, SeriesForecast] = {}
    for region, fc in zip(regions, fetched[:len(ci_refs)]):
        if fc is None:
            raise FailedPrecondition(f"no carbon-intensity series for region {region} at the forecaster: ingest "
                                     f"one (greenserve forecast ingest) before planning")
        ci[region] = fc
    load: dict[str, SeriesForecast] = {}
    for pool, fc in zip(fleet.pools, fetched[len(ci_refs):]):
        if fc is not None:
            load[pool.name] = fc
    profiles = await fetch_profiles(profiler, notes)
    # Each pool's prefix-hit fraction measured over the last hour (prefix_hits.py), as the evaluation feeds it.
    hits = await prefix_hits.fetch_hit_fractions(cache_manager, fleet, now_s, notes)
    caps = await asyncio.to_thread(capabilities, fleet, profiles, notes, hits)
    tier_faults = cache_tier_health.faults(
        fleet, profiles, {e.id: engine_hardware(e, fleet) for pool in fleet.pools for e in pool.engines})
    for name, fault in sorted(tier_faults.items()):
        notes.append(f"LMCache tier of pool {name} not working: {fault.reason}")
    platforms = gpu_platforms(fleet, params, notes)
    cache_sizes = await fetch_cache_sizes(cache_manager, notes)
    traffic, traffic_missing = await traffic_history_module.fetch_traces(
        cache_manager, forecasts.stub, fleet, start_s, notes) if traffic_history else ({}, {})
    return PlanningInputs(start_s=start_s, horizon_hours=hours, fleet=fleet, ci=ci, load=load, capabilities=caps,
                          params=params, gpu_platform=platforms, current=current,
                          carbon_weight_fraction=carbon_weight_fraction, notes=notes, declared=declared,
                          cache_sizes=cache_sizes, traffic=traffic, traffic_missing=traffic_missing,
                          prefix_hit_fraction=hits, cache_tier_faults=tier_faults)
