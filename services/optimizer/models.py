"""Tables owned by the optimizer: the versioned plans it produces.

``Plan.body`` is the serialized ``greenserve.v1.Plan`` message. At most one plan is ``active`` at a
time (a partial unique index enforces it); activating a new plan means superseding the old one in
the same transaction.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, Double, Index, Integer, LargeBinary, MetaData, String, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from greenserve.common.orm_conventions import NAMING_CONVENTION, UtcDateTime

PLAN_STATES: tuple[str, ...] = ("proposed", "active", "superseded")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Plan(Base):
    __tablename__ = "plans"
    __table_args__ = (
        CheckConstraint("version >= 1", name="version_positive"),
        CheckConstraint("valid_until > valid_from", name="valid_until_after_valid_from"),
        CheckConstraint("state IN ('proposed', 'active', 'superseded')", name="state"),
        CheckConstraint("expected_total_carbon_g >= 0", name="expected_total_carbon_g_non_negative"),
        Index(
            "uq_plans_one_active",
            "state",
            unique=True,
            sqlite_where=text("state = 'active'"),
            postgresql_where=text("state = 'active'"),
        ),
    )

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    valid_from: Mapped[datetime] = mapped_column(UtcDateTime())
    valid_until: Mapped[datetime] = mapped_column(UtcDateTime())
    state: Mapped[str] = mapped_column(String(16))
    expected_total_carbon_g: Mapped[float] = mapped_column(Double)
    body: Mapped[bytes] = mapped_column(LargeBinary)

    def __repr__(self) -> str:
        return f"Plan(version={self.version!r}, state={self.state!r})"


class Fleet(Base):
    """The operator's fleet inventory (one row, id 1): the serialized ``greenserve.v1.FleetInventory``."""

    __tablename__ = "fleet"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime())
    body: Mapped[bytes] = mapped_column(LargeBinary)


class ReportedGpus(Base):
    """The GPUs one gpu-partitioner reported for its node (serialized ``ReportGpusRequest``)."""

    __tablename__ = "reported_gpus"

    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    reported_at: Mapped[datetime] = mapped_column(UtcDateTime())
    body: Mapped[bytes] = mapped_column(LargeBinary)


class EnforcementReport(Base):
    """The latest report of one component instance about one plan version."""

    __tablename__ = "enforcement_reports"

    plan_version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    component: Mapped[str] = mapped_column(String(64), primary_key=True)
    instance: Mapped[str] = mapped_column(String(253), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    reported_at: Mapped[datetime] = mapped_column(UtcDateTime())
    body: Mapped[bytes] = mapped_column(LargeBinary)


class ForecastCache(Base):
    """The last good forecast of one series (serialized ``greenserve.v1.Forecast``): planning input while the
    forecaster is down, up to a maximum age."""

    __tablename__ = "forecast_cache"

    series: Mapped[str] = mapped_column(String(300), primary_key=True)
    fetched_at: Mapped[datetime] = mapped_column(UtcDateTime())
    body: Mapped[bytes] = mapped_column(LargeBinary)
