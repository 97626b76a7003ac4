"""Tables owned by the router: the engines it routes to and the last plan it received.

``last_plan`` holds at most one row (id = 1): the router keeps routing on it when the optimizer is
down, including after a restart. ``body`` is the serialized ``greenserve.v1.Plan``.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, CheckConstraint, Integer, LargeBinary, MetaData, String, UniqueConstraint, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from greenserve.common.persistence import NAMING_CONVENTION, UtcDateTime

ENGINE_SOURCES: tuple[str, ...] = ("flag", "rpc", "plan")
LAST_PLAN_ID = 1


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Engine(Base):
    """A vLLM (or emulated) engine behind the router. Not to be confused with a SQLAlchemy Engine."""

    __tablename__ = "engines"
    __table_args__ = (
        UniqueConstraint("url"),
        CheckConstraint("length(id) > 0", name="id_not_empty"),
        CheckConstraint("length(url) > 0", name="url_not_empty"),
        CheckConstraint("source IN ('flag', 'rpc', 'plan')", name="source"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    url: Mapped[str] = mapped_column(String(512))
    pool: Mapped[str] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(255))
    source: Mapped[str] = mapped_column(String(8))
    registered_at: Mapped[datetime] = mapped_column(UtcDateTime())
    draining: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    def __repr__(self) -> str:
        return f"Engine(id={self.id!r}, url={self.url!r}, pool={self.pool!r}, draining={self.draining!r})"


class LastPlan(Base):
    __tablename__ = "last_plan"
    __table_args__ = (
        CheckConstraint("id = 1", name="singleton"),
        CheckConstraint("plan_version >= 1", name="plan_version_positive"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False, default=LAST_PLAN_ID)
    plan_version: Mapped[int] = mapped_column(Integer)
    received_at: Mapped[datetime] = mapped_column(UtcDateTime())
    body: Mapped[bytes] = mapped_column(LargeBinary)

    def __repr__(self) -> str:
        return f"LastPlan(plan_version={self.plan_version!r}, received_at={self.received_at!r})"
