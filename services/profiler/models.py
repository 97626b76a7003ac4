"""Tables owned by the profiler: versioned performance profiles, profiling sweeps and their points.

``Profile.body``, ``Sweep.request`` and ``SweepPoint.body`` are serialized protobuf messages
(``greenserve.v1``), so a row written by an older release still parses after fields are added. The columns
next to them (model, hardware, workload, ...) are copies for filtering in SQL.

A sweep is persisted point by point: one ``SweepPoint`` row per (configuration, rate) cell, written in the
same transaction as the sweep's progress counters (and, for the last cell of a configuration, its profile),
so a crash loses at most the point being measured and a restart resumes after the last committed one.
Sweep states are the proto's ``SweepState`` names in lower case.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Float,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from greenserve.common.orm_conventions import NAMING_CONVENTION, UtcDateTime

PROFILE_SOURCES: tuple[str, ...] = ("measured", "simulated", "published")
SWEEP_STATES: tuple[str, ...] = ("pending", "running", "succeeded", "failed", "cancelled")
POINT_STATES: tuple[str, ...] = ("measured", "skipped")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Profile(Base):
    __tablename__ = "profiles"
    __table_args__ = (
        UniqueConstraint("config_key", "version"),
        CheckConstraint("length(config_key) > 0", name="config_key_not_empty"),
        CheckConstraint("version >= 1", name="version_positive"),
        CheckConstraint("source IN ('measured', 'simulated', 'published')", name="source"),
        Index(None, "model", "hardware"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    config_key: Mapped[str] = mapped_column(String(255))
    version: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    body: Mapped[bytes] = mapped_column(LargeBinary)
    model: Mapped[str] = mapped_column(String(255), default="")
    hardware: Mapped[str] = mapped_column(String(128), default="")
    workload: Mapped[str] = mapped_column(String(255), default="")
    sweep_id: Mapped[str | None] = mapped_column(String(36))

    def __repr__(self) -> str:
        return f"Profile(config_key={self.config_key!r}, version={self.version!r}, source={self.source!r})"


class Sweep(Base):
    __tablename__ = "sweeps"
    __table_args__ = (
        CheckConstraint("state IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')", name="state"),
        CheckConstraint("total_points >= 0", name="total_points_non_negative"),
        CheckConstraint("done_points >= 0 AND done_points <= total_points", name="done_points_in_range"),
        CheckConstraint("updated_at >= created_at", name="updated_after_created"),
        CheckConstraint("skipped_points >= 0 AND done_points + skipped_points <= total_points",
                        name="skipped_points_in_range"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)  # uuid4, text form
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime())
    total_points: Mapped[int] = mapped_column(Integer)
    done_points: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    request: Mapped[bytes] = mapped_column(LargeBinary)
    skipped_points: Mapped[int] = mapped_column(Integer, default=0)
    # seconds spent measuring so far (for the ETA; survives restarts)
    busy_s: Mapped[float] = mapped_column(Float, default=0.0)
    notes: Mapped[list[Any]] = mapped_column(JSON, default=list)
    profile_ids: Mapped[list[Any]] = mapped_column(JSON, default=list)

    def __repr__(self) -> str:
        return f"Sweep(id={self.id!r}, state={self.state!r}, done={self.done_points}/{self.total_points})"


class SweepPoint(Base):
    __tablename__ = "sweep_points"
    __table_args__ = (
        UniqueConstraint("sweep_id", "point_index"),
        CheckConstraint("point_index >= 0", name="point_index_non_negative"),
        CheckConstraint("state IN ('measured', 'skipped')", name="state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[str] = mapped_column(String(36), ForeignKey("sweeps.id", ondelete="CASCADE"))
    point_index: Mapped[int] = mapped_column(Integer)  # config_index * len(rates) + rate_index
    config_index: Mapped[int] = mapped_column(Integer)
    rate_index: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    body: Mapped[bytes] = mapped_column(LargeBinary)  # greenserve.v1.ProfilePoint; empty when skipped

    def __repr__(self) -> str:
        return f"SweepPoint(sweep_id={self.sweep_id!r}, point_index={self.point_index}, state={self.state!r})"


class ModelVersion(Base):
    """A simulator performance model calibrated from a measured profile (``body``: greenserve.v1.ModelVersion)."""

    __tablename__ = "model_versions"
    __table_args__ = (
        CheckConstraint("length(name) > 0", name="name_not_empty"),
        UniqueConstraint("base_profile", "ordinal"),
    )

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    base_profile: Mapped[str] = mapped_column(String(255))
    ordinal: Mapped[int] = mapped_column(Integer)  # n of "+cal<n>", per base profile
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    body: Mapped[bytes] = mapped_column(LargeBinary)

    def __repr__(self) -> str:
        return f"ModelVersion(name={self.name!r})"
