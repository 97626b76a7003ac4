"""Tables owned by the gpu-partitioner: the apply journal and runs, energy accounts, the simulated GPUs.

The journal records every step of a MIG layout change before it runs, so a partitioner that dies
mid-apply can find the ``pending`` steps at start-up and finish or roll them back.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from greenserve.common.orm_conventions import NAMING_CONVENTION, UtcDateTime
from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

STEP_STATES: tuple[str, ...] = ("pending", "done", "failed", "rolled_back")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class ApplyJournalEntry(Base):
    __tablename__ = "apply_journal"
    __table_args__ = (
        UniqueConstraint("apply_id", "step_index"),
        Index(None, "gpu_uuid", "state"),
        CheckConstraint("step_index >= 0", name="step_index_non_negative"),
        CheckConstraint("plan_version IS NULL OR plan_version >= 1", name="plan_version_positive"),
        CheckConstraint("state IN ('pending', 'done', 'failed', 'rolled_back')", name="state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    apply_id: Mapped[str] = mapped_column(String(36))
    gpu_uuid: Mapped[str] = mapped_column(String(96))
    plan_version: Mapped[int | None] = mapped_column(Integer)
    step_index: Mapped[int] = mapped_column(Integer)
    step: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime())

    def __repr__(self) -> str:
        return (
            f"ApplyJournalEntry(apply_id={self.apply_id!r}, step_index={self.step_index!r}, "
            f"state={self.state!r})"
        )


class SimulatedGpu(Base):
    __tablename__ = "simulated_gpus"
    __table_args__ = (CheckConstraint("length(gpu_uuid) > 0", name="gpu_uuid_not_empty"),)

    gpu_uuid: Mapped[str] = mapped_column(String(96), primary_key=True)
    model: Mapped[str] = mapped_column(String(64))
    mig_enabled: Mapped[bool] = mapped_column(Boolean)
    state_json: Mapped[str] = mapped_column(Text)

    def __repr__(self) -> str:
        return f"SimulatedGpu(gpu_uuid={self.gpu_uuid!r}, model={self.model!r}, mig={self.mig_enabled!r})"


APPLY_STATES: tuple[str, ...] = ("running", "succeeded", "rolled_back", "failed")


class ApplyRun(Base):
    """One apply of a layout to a GPU: what it started from, where it goes, and how it ended.

    `previous_layout` is what recovery restores after a crash or a failed step; `drained_engines` are
    undrained whatever the outcome. A run in state ``running`` at start-up was interrupted by a crash.
    """

    __tablename__ = "apply_runs"
    __table_args__ = (
        Index(None, "gpu_uuid", "state"),
        CheckConstraint("state IN ('running', 'succeeded', 'rolled_back', 'failed')", name="state"),
    )

    apply_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    gpu_uuid: Mapped[str] = mapped_column(String(96))
    plan_version: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    phase: Mapped[str] = mapped_column(String(16))
    previous_layout: Mapped[list[Any]] = mapped_column(JSON)
    previous_mig_enabled: Mapped[bool] = mapped_column(Boolean)
    target_layout: Mapped[list[Any]] = mapped_column(JSON)
    drained_engines: Mapped[list[Any]] = mapped_column(JSON)
    instances: Mapped[list[Any]] = mapped_column(JSON)
    error: Mapped[str] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime())

    def __repr__(self) -> str:
        return f"ApplyRun(apply_id={self.apply_id!r}, gpu={self.gpu_uuid!r}, state={self.state!r})"


class EnergyAccount(Base):
    """Energy attributed so far to one MIG instance, to a GPU's unallocated slices, or a GPU's counter state.

    `key` is ``mig:<MIG uuid>``, ``unallocated:<GPU uuid>`` or ``gpu:<GPU uuid>``; a ``gpu:`` row keeps the
    last energy-counter reading (`last_counter_j`) and the idle power estimate (minimum power seen).
    """

    __tablename__ = "energy_accounts"

    key: Mapped[str] = mapped_column(String(112), primary_key=True)
    gpu_uuid: Mapped[str] = mapped_column(String(96))
    energy_j: Mapped[float] = mapped_column(Float)
    power_w: Mapped[float] = mapped_column(Float)
    last_counter_j: Mapped[float | None] = mapped_column(Float)
    idle_power_w: Mapped[float | None] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime())


POWER_RUN_STATES: tuple[str, ...] = ("running", "succeeded", "rolled_back", "failed")


class GpuPowerRun(Base):
    """One change of a GPU's power limit and SM clock lock (power.py), journaled before it runs.

    ``previous`` and ``target`` are ``{"power_limit_w": W or null (the GPU's default), "locked_clocks": [min, max]
    MHz or null (unlocked)}``; ``phase`` is the step under way (``limit``, ``clocks``, ``rollback``, ``done``). A run
    still ``running`` at start-up was cut by a crash: recovery restores ``previous`` (or, with the resume policy,
    finishes ``target``)."""

    __tablename__ = "gpu_power_runs"
    __table_args__ = (
        Index(None, "gpu_uuid", "state"),
        CheckConstraint("state IN ('running', 'succeeded', 'rolled_back', 'failed')", name="state"),
    )

    run_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    gpu_uuid: Mapped[str] = mapped_column(String(96))
    plan_version: Mapped[int | None] = mapped_column(Integer)
    pool: Mapped[str] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16))
    phase: Mapped[str] = mapped_column(String(16))
    previous: Mapped[dict[str, Any]] = mapped_column(JSON)
    target: Mapped[dict[str, Any]] = mapped_column(JSON)
    error: Mapped[str] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime())

    def __repr__(self) -> str:
        return f"GpuPowerRun(run_id={self.run_id!r}, gpu={self.gpu_uuid!r}, state={self.state!r})"


class GpuPowerSetting(Base):
    """The power limit and SM clock lock this service has in force on one GPU (NVML cannot read a clock lock
    back). No row, or nulls: the GPU's defaults."""

    __tablename__ = "gpu_power_settings"

    gpu_uuid: Mapped[str] = mapped_column(String(96), primary_key=True)
    power_limit_w: Mapped[float | None] = mapped_column(Float)
    locked_min_mhz: Mapped[int | None] = mapped_column(Integer)
    locked_max_mhz: Mapped[int | None] = mapped_column(Integer)
    pool: Mapped[str] = mapped_column(String(128))
    plan_version: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime())
