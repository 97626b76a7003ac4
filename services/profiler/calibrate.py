"""Calibration of the simulator's performance model from a measured profile, stored as a model version.

From a MEASURED profile of a fixed-size workload (``sharegpt``, ``humaneval``, ``longbench``: every request has the
dataset's P50 size, so each point's token counts are known):

* a prefill point: the lowest rate's median TTFT for the prompt's tokens (the least queueing of the ladder);
* decode points: each point's mean TPOT at its mean batch size (rounded, at least 1) with the batch's context
  taken as batch x (prompt + output / 2) tokens, for points that met the SLO target (no overload);

``greenserve.simulator.calibration.calibrate`` fits ``prefill_mfu``, ``decode_mbu`` and ``step_overhead_s`` to
them (SciPy least squares on relative errors). The fitted parameters are stored as ``<profile>+cal<n>``; a
simulator sweep names it in ``SweepSpec.model_version``. Power is not fitted: a profile holds mean power per
rate, not the utilisation the power model needs.
"""

from __future__ import annotations

from collections.abc import Mapping

import sqlalchemy as sa

from greenserve.common.orm_conventions import utcnow
from greenserve.common.persistence import Database
from greenserve.profiler.keys import simulator_profile_name
from greenserve.profiler.models import ModelVersion
from greenserve.profiler.workload_catalog import FIXED_SIZES
from greenserve.simulator.calibration import DecodePoint, PrefillPoint, calibrate
from greenserve.simulator.engine_profile import EngineProfile, load_profile
from greenserve.simulator.perf_model import PerfModel
from greenserve.v1 import common_pb2, profiler_pb2

FITTED = ("prefill_mfu", "decode_mbu", "step_overhead_s")


def calibration_points(profile: common_pb2.Profile) -> tuple[list[PrefillPoint], list[tuple[float, DecodePoint]]]:
    """The prefill point and (rate, decode point) pairs a profile gives; ValueError naming what is missing."""
    workload = profile.config.workload
    if workload not in FIXED_SIZES:
        raise ValueError(f"config_key: calibration needs a profile of a fixed-size workload "
                         f"({', '.join(FIXED_SIZES)}); this one is {workload or 'unnamed'!r}")
    prompt, output = FIXED_SIZES[workload]
    points = sorted(profile.points, key=lambda p: p.request_rate_per_s)
    if not points or points[0].ttft_p50_s <= 0:
        raise ValueError("config_key: the profile has no TTFT at its lowest rate")
    prefill = [PrefillPoint(uncached_tokens=prompt, time_s=points[0].ttft_p50_s)]
    decode = []
    for p in points:
        if p.below_slo_target or p.tpot_mean_s <= 0 or p.mean_batch_size <= 0:
            continue
        batch = max(1, round(p.mean_batch_size))
        decode.append((p.request_rate_per_s, DecodePoint(batch_size=batch, total_context_tokens=int(batch * (prompt + output / 2)),
                                                         time_s=p.tpot_mean_s)))
    return prefill, decode


def fit(profile: common_pb2.Profile, base_name: str) -> profiler_pb2.ModelVersion:
    """Fit the base simulator profile to a measured profile (not stored)."""
    if profile.source != common_pb2.PROFILE_SOURCE_MEASURED:
        raise ValueError("config_key: calibration needs a MEASURED profile")
    prefill, decode = calibration_points(profile)
    base = load_profile(base_name)
    label = f"{profile.config_key}@{profile.version}"
    report = calibrate(base, prefill=prefill, decode=[d for _, d in decode], label=label)
    before, after = PerfModel(base), PerfModel(report.profile)
    version = profiler_pb2.ModelVersion(base_profile=base_name, calibrated_from=label)
    version.parameters.update(report.fitted)
    version.rms_relative_error.update(report.rms_relative_error)
    low = sorted(profile.points, key=lambda p: p.request_rate_per_s)[0]
    version.checks.add(request_rate_per_s=low.request_rate_per_s, quantity="ttft_unloaded_s",
                       measured_s=prefill[0].time_s, default_model_s=before.prefill_time_s(prefill[0].uncached_tokens),
                       calibrated_model_s=after.prefill_time_s(prefill[0].uncached_tokens))
    for rate, d in decode:
        version.checks.add(request_rate_per_s=rate, quantity="tpot_mean_s", measured_s=d.time_s,
                           default_model_s=before.decode_step_time_s(d.batch_size, d.total_context_tokens),
                           calibrated_model_s=after.decode_step_time_s(d.batch_size, d.total_context_tokens))
    return version


STORE_ATTEMPTS = 10


def store(db: Database, version: profiler_pb2.ModelVersion) -> profiler_pb2.ModelVersion:
    """Store as the next ``+cal<n>`` of its base profile. A concurrent writer that took the number first (PostgreSQL
    reads the latest ordinal without locking) turns into a retry with the next one, as ``ProfileStore.put`` does."""
    for attempt in range(STORE_ATTEMPTS):
        try:
            return _store_next(db, version)
        except sa.exc.IntegrityError:
            if attempt == STORE_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _store_next(db: Database, version: profiler_pb2.ModelVersion) -> profiler_pb2.ModelVersion:
    with db.session() as s:
        latest = s.scalar(sa.select(sa.func.max(ModelVersion.ordinal))
                          .where(ModelVersion.base_profile == version.base_profile)) or 0
        stored = profiler_pb2.ModelVersion()
        stored.CopyFrom(version)
        stored.name = f"{version.base_profile}+cal{latest + 1}"
        now = utcnow()
        stored.created_at.FromDatetime(now)
        s.add(ModelVersion(name=stored.name, base_profile=version.base_profile, ordinal=latest + 1, created_at=now,
                           body=stored.SerializeToString()))
        return stored


def get(db: Database, name: str) -> profiler_pb2.ModelVersion | None:
    with db.session(readonly=True) as s:
        row = s.get(ModelVersion, name)
        return profiler_pb2.ModelVersion.FromString(row.body) if row is not None else None


def list_versions(db: Database, base_profile: str = "") -> list[profiler_pb2.ModelVersion]:
    with db.session(readonly=True) as s:
        query = sa.select(ModelVersion.body).order_by(ModelVersion.created_at.desc(), ModelVersion.ordinal.desc())
        if base_profile:
            query = query.where(ModelVersion.base_profile == base_profile)
        return [profiler_pb2.ModelVersion.FromString(b) for b in s.scalars(query)]


def engine_profile(version: profiler_pb2.ModelVersion) -> EngineProfile:
    """The simulator profile with the version's fitted parameters."""
    params: Mapping[str, float] = dict(version.parameters)
    unknown = set(params) - set(FITTED)
    if unknown:
        raise ValueError(f"model_version: unknown parameters {sorted(unknown)}")
    return load_profile(version.base_profile).with_overrides(**params, calibrated_from=version.calibrated_from)


def base_matches(version: profiler_pb2.ModelVersion, config: common_pb2.ProfileConfig, field: str) -> None:
    name = simulator_profile_name(config, field)
    if name != version.base_profile:
        raise ValueError(f"{field}: maps to simulator profile {name!r}, model version {version.name!r} "
                         f"calibrates {version.base_profile!r}")
