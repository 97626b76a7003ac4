"""Tables owned by the profiler: versioned performance profiles and profiling sweeps.

``Profile.body`` and ``Sweep.request`` are serialized protobuf messages (``greenserve.v1``), so a
row written by an older release still parses after fields are added.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, Integer, LargeBinary, MetaData, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from greenserve.common.persistence import NAMING_CONVENTION, UtcDateTime

PROFILE_SOURCES: tuple[str, ...] = ("measured", "simulated", "published")
SWEEP_STATES: tuple[str, ...] = ("pending", "running", "done", "failed", "cancelled")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Profile(Base):
    __tablename__ = "profiles"
    __table_args__ = (
        UniqueConstraint("config_key", "version"),
        CheckConstraint("length(config_key) > 0", name="config_key_not_empty"),
        CheckConstraint("version >= 1", name="version_positive"),
        CheckConstraint("source IN ('measured', 'simulated', 'published')", name="source"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    config_key: Mapped[str] = mapped_column(String(255))
    version: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    body: Mapped[bytes] = mapped_column(LargeBinary)

    def __repr__(self) -> str:
        return f"Profile(config_key={self.config_key!r}, version={self.version!r}, source={self.source!r})"


class Sweep(Base):
    __tablename__ = "sweeps"
    __table_args__ = (
        CheckConstraint("state IN ('pending', 'running', 'done', 'failed', 'cancelled')", name="state"),
        CheckConstraint("total_points >= 0", name="total_points_non_negative"),
        CheckConstraint("done_points >= 0 AND done_points <= total_points", name="done_points_in_range"),
        CheckConstraint("updated_at >= created_at", name="updated_after_created"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)  # uuid4, text form
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime())
    total_points: Mapped[int] = mapped_column(Integer)
    done_points: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    request: Mapped[bytes] = mapped_column(LargeBinary)

    def __repr__(self) -> str:
        return f"Sweep(id={self.id!r}, state={self.state!r}, done={self.done_points}/{self.total_points})"
