"""Simulator backend: a sweep point in virtual time through ``greenserve.simulator``.

One engine (the configuration's performance profile, its LMCache DRAM/disk capacities converted from bytes
to tokens with the profile's KV bytes per token) replays the point's workload; the cache pre-fill requests and
the warm-up requests (the method's warm-up at the rate) fill the prefix and LMCache tiers and are not
measured. Power is the model's mean over the replay (idle included).

A serving-mode configuration (SPEC_DECODE, DISAGGREGATED, DISAGGREGATED_SPEC_DECODE) replays one unit of the mode
(``mode_config.unit``: the fleet the optimizer's serving-modes solver evaluates, the older GPU included in power);
its cache sizes apply to the engine on the configuration's own GPU.
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
from greenserve.common.errors import FailedPrecondition, InvalidArgument
from greenserve.common.persistence import Database
from greenserve.profiler import calibrate, mode_config, workload_catalog
from greenserve.profiler.keys import simulator_profile, simulator_profile_name
from greenserve.profiler.method import Method
from greenserve.profiler.points import PointExtras, RequestSamples, summarize
from greenserve.simulator.engine_profile import EngineProfile, data_version, load_profile
from greenserve.simulator.replay import replay
from greenserve.simulator.replay_fleet import EngineSpec, FleetConfig
from greenserve.v1 import common_pb2, profiler_pb2

SUPPORTED_MODES = (common_pb2.SERVING_MODE_UNSPECIFIED, common_pb2.SERVING_MODE_STANDALONE,
                   *mode_config.MODE_CONFIGS)


def check_config(config: common_pb2.ProfileConfig, field: str) -> None:
    """ValueError naming the field when the simulator cannot run the configuration."""
    name = simulator_profile_name(config, field)
    if config.serving_mode not in SUPPORTED_MODES:
        raise ValueError(f"{field}.serving_mode: the simulator backend has no model of this mode")
    if mode_config.is_mode_config(config):
        mode_config.unit(config, name, load_profile(name), field)


def _fleet(config: common_pb2.ProfileConfig, profile: EngineProfile, seed: int) -> FleetConfig:
    kv = profile.kv_bytes_per_token
    dram_tokens = int(config.cache_dram_bytes // kv)
    disk_tokens = int(config.cache_disk_bytes // kv)
    if not mode_config.is_mode_config(config):
        return FleetConfig((EngineSpec(profile, dram_capacity_tokens=dram_tokens, disk_capacity_tokens=disk_tokens),),
                           seed=seed)
    fleet = mode_config.unit(config, simulator_profile_name(config), profile).fleet
    first = dataclasses.replace(fleet.engines[0], dram_capacity_tokens=dram_tokens, disk_capacity_tokens=disk_tokens)
    return dataclasses.replace(fleet, engines=(first, *fleet.engines[1:]), seed=seed)


def simulate_point(config: common_pb2.ProfileConfig, rate_per_s: float, spec: profiler_pb2.SweepSpec,
                   method: Method, profile: EngineProfile | None = None) -> common_pb2.ProfilePoint:
    """Measure one (configuration, rate) point in virtual time (CPU-bound; call from a thread). ``profile``
    replaces the configuration's data-file profile (a calibrated model version)."""
    profile = profile or simulator_profile(config)
    warmup = method.warmup_requests(rate_per_s) + method.prefill_requests(rate_per_s, config)
    point_wl = workload_catalog.build(spec.workload, rate_per_s, warmup=warmup,
                                      measured=method.measured_requests(rate_per_s), seed=spec.seed,
                                      arrival=method.arrival)
    result = replay(point_wl.workload, _fleet(config, profile, spec.seed))
    m = slice(point_wl.warmup, None)
    ttft = np.where(result.rejected[m], np.nan, result.ttft_s[m])
    samples = RequestSamples(arrival_s=result.arrival_s[m], ttft_s=ttft, tpot_s=result.tpot_s[m],
                             e2e_s=np.where(result.rejected[m], np.nan, result.e2e_s[m]),
                             output_tokens=result.output_tokens[m], prompt_tokens=result.prompt_tokens[m])
    prompt = float(result.prompt_tokens[m].sum())
    hits = float(result.hit_hbm_tokens[m].sum() + result.hit_dram_tokens[m].sum() + result.hit_disk_tokens[m].sum())
    extras = PointExtras(
        power_w=result.fleet_energy_j / result.makespan_s if result.makespan_s > 0 else float("nan"),
        power_source="simulator_model",
        cache_hit_fraction=hits / prompt if prompt else float("nan"),
        mean_batch_size=float(result.engine_mean_batch[0]),
    )
    return summarize(rate_per_s, samples, spec.slo, extras, ci_g_per_kwh=method.ci_g_per_kwh)


class SimulatorBackend:
    """The SWEEP_BACKEND_SIMULATOR measurements; ``db`` holds the calibrated model versions."""

    source = common_pb2.PROFILE_SOURCE_SIMULATED
    name = "simulator"

    def __init__(self, db: Database | None = None) -> None:
        self.db = db
        self._calibrated: EngineProfile | None = None

    def _model_version(self, spec: profiler_pb2.SweepSpec) -> EngineProfile | None:
        if not spec.model_version:
            return None
        if self._calibrated is None:
            version = calibrate.get(self.db, spec.model_version) if self.db is not None else None
            if version is None:
                raise FailedPrecondition(f"no model version {spec.model_version!r} (see ListModelVersions)",
                                         field="spec.model_version")
            for i, config in enumerate(spec.configs):
                try:
                    calibrate.base_matches(version, config, f"spec.configs[{i}]")
                except ValueError as exc:
                    field, _, message = str(exc).partition(": ")
                    raise InvalidArgument(field, message) from None
            self._calibrated = calibrate.engine_profile(version)
        return self._calibrated

    async def prepare(self, spec: profiler_pb2.SweepSpec) -> None:
        await asyncio.to_thread(self._model_version, spec)

    async def apply_config(self, spec: profiler_pb2.SweepSpec, config: common_pb2.ProfileConfig) -> str:
        return ""

    async def measure(self, spec: profiler_pb2.SweepSpec, config: common_pb2.ProfileConfig, rate_per_s: float,
                      method: Method) -> common_pb2.ProfilePoint:
        def run() -> common_pb2.ProfilePoint:
            return simulate_point(config, rate_per_s, spec, method, self._model_version(spec))

        return await asyncio.to_thread(run)

    def provenance(self, spec: profiler_pb2.SweepSpec, config: common_pb2.ProfileConfig) -> tuple[str, str]:
        """(note, model version) of a profile this backend produced."""
        name = simulator_profile_name(config)
        if spec.model_version:
            return (f"greenserve.simulator virtual-time replay, calibrated model version {spec.model_version} "
                    f"(data {data_version()})", spec.model_version)
        return f"greenserve.simulator virtual-time replay, profile {name}, data {data_version()}", f"{name}@{data_version()}"

    async def close(self) -> None:
        return None
