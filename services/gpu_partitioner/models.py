"""Tables owned by the gpu-partitioner: the apply journal and the simulated NVML backend's GPUs.

The journal records every step of a MIG layout change before it runs, so a partitioner that dies
mid-apply can find the ``pending`` steps at start-up and finish or roll them back.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, CheckConstraint, Index, Integer, MetaData, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from greenserve.common.persistence import NAMING_CONVENTION, UtcDateTime

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
