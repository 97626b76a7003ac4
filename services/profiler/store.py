"""The profile store: versioned profiles per configuration key, with source and provenance.

Synchronous (SQLAlchemy sessions); the servicer calls it through ``asyncio.to_thread``. A profile's version is
assigned here, one more than the key's latest, inside the transaction that inserts it; the unique
(config_key, version) constraint turns a concurrent writer's race into a retry instead of a duplicate.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Iterable, Sequence
from datetime import datetime

import sqlalchemy as sa
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy.orm import Session

from greenserve.common.orm_conventions import utcnow
from greenserve.common.persistence import Database
from greenserve.profiler.keys import check_config, config_key
from greenserve.profiler.models import Profile
from greenserve.v1 import common_pb2

SOURCE_NAMES: dict[int, str] = {
    common_pb2.PROFILE_SOURCE_MEASURED: "measured",
    common_pb2.PROFILE_SOURCE_SIMULATED: "simulated",
    common_pb2.PROFILE_SOURCE_PUBLISHED: "published",
}
SOURCE_VALUES: dict[str, int] = {name: value for value, name in SOURCE_NAMES.items()}
MAX_POINTS = 10_000
MAX_NOTE_CHARS = 4096


def _finite_non_negative(value: float, field: str) -> None:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{field}: must be finite and >= 0, got {value}")


def validate_profile(profile: common_pb2.Profile, field: str = "profile") -> None:
    """Raise ValueError("<field path>: reason") for a profile that must not be stored."""
    if not profile.HasField("config"):
        raise ValueError(f"{field}.config: required")
    check_config(profile.config, f"{field}.config")
    if profile.source not in SOURCE_NAMES:
        raise ValueError(f"{field}.source: must be MEASURED, SIMULATED or PUBLISHED")
    if profile.source == common_pb2.PROFILE_SOURCE_PUBLISHED and not profile.note.strip():
        raise ValueError(f"{field}.note: a PUBLISHED profile must cite its source")
    if len(profile.note) > MAX_NOTE_CHARS:
        raise ValueError(f"{field}.note: at most {MAX_NOTE_CHARS} characters")
    if not profile.points and not profile.facts:
        raise ValueError(f"{field}.points: a profile needs at least one point or one fact")
    if len(profile.points) > MAX_POINTS:
        raise ValueError(f"{field}.points: at most {MAX_POINTS}")
    slo = profile.slo
    for name in ("ttft_s", "tpot_s"):
        _finite_non_negative(getattr(slo, name), f"{field}.slo.{name}")
    if not (math.isfinite(slo.attainment_fraction) and 0 <= slo.attainment_fraction <= 1):
        raise ValueError(f"{field}.slo.attainment_fraction: must be in [0, 1]")
    if not (math.isfinite(profile.variant_quality_fraction) and 0 <= profile.variant_quality_fraction <= 1):
        raise ValueError(f"{field}.variant_quality_fraction: must be in [0, 1]")
    previous = -math.inf
    for i, point in enumerate(profile.points):
        where = f"{field}.points[{i}]"
        for desc, value in point.ListFields():
            if desc.type == desc.TYPE_DOUBLE:
                _finite_non_negative(value, f"{where}.{desc.name}")
        for name in ("slo_attainment_fraction", "ttft_slo_attainment_fraction", "tpot_slo_attainment_fraction",
                     "cache_hit_fraction"):
            if getattr(point, name) > 1:
                raise ValueError(f"{where}.{name}: must be <= 1")
        if point.kv_connector_state not in common_pb2.KvConnectorState.values():
            raise ValueError(f"{where}.kv_connector_state: unknown value {point.kv_connector_state}")
        if point.request_rate_per_s <= previous:
            raise ValueError(f"{where}.request_rate_per_s: points must be in ascending order of rate")
        previous = point.request_rate_per_s
    for i, rate in enumerate(profile.skipped_rates_per_s):
        if not math.isfinite(rate) or rate <= 0:
            raise ValueError(f"{field}.skipped_rates_per_s[{i}]: must be a finite rate > 0, got {rate}")
    if profile.method.stop_rule not in common_pb2.LadderStopRule.values():
        raise ValueError(f"{field}.method.stop_rule: unknown value {profile.method.stop_rule}")
    for desc, value in profile.method.ListFields():
        if desc.type == desc.TYPE_DOUBLE:
            _finite_non_negative(value, f"{field}.method.{desc.name}")
    for i, fact in enumerate(profile.facts):
        if not fact.name.strip():
            raise ValueError(f"{field}.facts[{i}].name: must not be empty")
        if not math.isfinite(fact.value):
            raise ValueError(f"{field}.facts[{i}].value: must be finite")


def _to_proto(row: Profile) -> common_pb2.Profile:
    profile = common_pb2.Profile.FromString(row.body)
    profile.config_key, profile.version = row.config_key, row.version
    profile.created_at.CopyFrom(_ts(row.created_at))
    return profile


def _ts(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def insert_profile(session: Session, profile: common_pb2.Profile, *, sweep_id: str | None = None) -> common_pb2.Profile:
    """Store ``profile`` as the next version of its key inside ``session``'s transaction; return it as stored.
    The caller has validated it."""
    key = config_key(profile.config)
    latest = session.scalar(sa.select(sa.func.max(Profile.version)).where(Profile.config_key == key)) or 0
    stored = common_pb2.Profile()
    stored.CopyFrom(profile)
    stored.config_key, stored.version = key, latest + 1
    if sweep_id:
        stored.sweep_id = sweep_id
    now = utcnow()
    stored.created_at.CopyFrom(_ts(now))
    session.add(Profile(config_key=key, version=stored.version, source=SOURCE_NAMES[profile.source],
                        created_at=now, body=stored.SerializeToString(), model=profile.config.model,
                        hardware=profile.config.hardware, workload=profile.config.workload,
                        sweep_id=sweep_id or None))
    session.flush()
    return stored


class ProfileStore:
    """PutProfile / GetProfile / ListProfiles over the profiler's database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def put(self, profile: common_pb2.Profile, *, sweep_id: str | None = None) -> common_pb2.Profile:
        validate_profile(profile)
        for attempt in range(5):
            try:
                with self.db.session() as s:
                    return insert_profile(s, profile, sweep_id=sweep_id)
            except sa.exc.IntegrityError:  # a concurrent writer took the version: take the next one
                if attempt == 4:
                    raise
        raise AssertionError("unreachable")

    def get(self, key: str, version: int = 0) -> common_pb2.Profile | None:
        with self.db.session(readonly=True) as s:
            query = sa.select(Profile).where(Profile.config_key == key)
            query = query.where(Profile.version == version) if version else query.order_by(Profile.version.desc())
            row = s.scalars(query.limit(1)).first()
            return _to_proto(row) if row is not None else None

    def list(self, *, model: str = "", hardware: str = "", latest_only: bool = False, source: str = "",
             workload: str = "", after: tuple[str, int] | None = None,
             limit: int | None = None) -> list[common_pb2.Profile]:
        """The matching profiles by (config_key, version); ``after``: only those past that (key, version), so a page
        that follows another neither repeats nor skips a profile when others are stored in between."""
        with self.db.session(readonly=True) as s:
            query = sa.select(Profile)
            if after is not None:
                key, version = after
                query = query.where(sa.or_(Profile.config_key > key,
                                           sa.and_(Profile.config_key == key, Profile.version > version)))
            if model:
                query = query.where(Profile.model == model)
            if hardware:
                query = query.where(Profile.hardware == hardware)
            if source:
                query = query.where(Profile.source == source)
            if workload:
                query = query.where(Profile.workload == workload)
            if latest_only:
                latest = (sa.select(Profile.config_key, sa.func.max(Profile.version).label("v"))
                          .group_by(Profile.config_key).subquery())
                query = query.join(latest, sa.and_(Profile.config_key == latest.c.config_key,
                                                   Profile.version == latest.c.v))
            query = query.order_by(Profile.config_key, Profile.version)
            rows = s.scalars(query if limit is None else query.limit(limit)).all()
            return [_to_proto(r) for r in rows]

    def count(self, source: str = "") -> int:
        with self.db.session(readonly=True) as s:
            query = sa.select(sa.func.count()).select_from(Profile)
            if source:
                query = query.where(Profile.source == source)
            return int(s.scalar(query) or 0)

    def put_many(self, profiles: Iterable[common_pb2.Profile]) -> builtins.list[common_pb2.Profile]:  # list: the method
        """Validate all, then store all in one transaction (all or nothing)."""
        items: Sequence[common_pb2.Profile] = list(profiles)
        for i, p in enumerate(items):
            validate_profile(p, f"profiles[{i}]")
        with self.db.session() as s:
            return [insert_profile(s, p) for p in items]
