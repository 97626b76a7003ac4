"""Tables owned by the router: the engines it routes to and the last plan it received.

An ``engines`` row holds everything the router knows about an engine that is not live load: where it
is (URL, GPU and MIG UUIDs), what it serves, its kind and power, and whether it is drained, so that a
restarted router (and the gpu-partitioner asking it which engines run on a MIG instance) knows the
same. Flag engines (``--engines``) are stored only once drained.

``last_plan`` holds at most one row (id = 1): the router keeps routing on it when the optimizer is
down, including after a restart. ``body`` is the serialized ``greenserve.v1.Plan``.

Shared by the router's replicas and workers (shared_state.py): ``state_version`` holds one counter row
(id = 1), bumped in the same transaction as every write of ``engines`` or ``engine_health``, which each
replica polls to learn that something changed; ``engine_health`` holds the ejection verdicts in force
(one row per ejected engine, deleted when the engine recovers); ``router_replicas`` holds, per replica,
the plan version and state version it routes on, so a replica that lags can be seen.
"""

from __future__ import annotations

from datetime import datetime

from greenserve.common.orm_conventions import NAMING_CONVENTION, UtcDateTime
from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    String,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ENGINE_SOURCES: tuple[str, ...] = ("flag", "rpc", "plan")
LAST_PLAN_ID = 1
STATE_VERSION_ID = 1
REPLICA_ID_MAX_CHARS = 128
REASON_MAX_CHARS = 255
# Column sizes, checked by RegisterEngine before anything is stored (PostgreSQL refuses longer strings).
ID_MAX_CHARS = 64
URL_MAX_CHARS = 512
POOL_MAX_CHARS = 128
MODEL_MAX_CHARS = 255
UUID_MAX_CHARS = 96  # "GPU-<uuid>" / "MIG-<uuid>" are 40; the legacy "MIG-GPU-<uuid>/<gi>/<ci>" ~ 56
KV_TRANSFER_PARAMS_MAX_CHARS = 1024  # a DPD pair's prefill kv_transfer_params (JSON)


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
        CheckConstraint("kind IN (0, 1, 2)", name="kind"),
        CheckConstraint("idle_power_w >= 0 AND busy_power_w >= 0", name="power_not_negative"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    url: Mapped[str] = mapped_column(String(512))
    pool: Mapped[str] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(255))
    source: Mapped[str] = mapped_column(String(8))
    registered_at: Mapped[datetime] = mapped_column(UtcDateTime())
    draining: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    kind: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))  # greenserve.v1.EngineKind
    gpu_uuid: Mapped[str] = mapped_column(String(UUID_MAX_CHARS), default="", server_default="")
    mig_uuid: Mapped[str] = mapped_column(String(UUID_MAX_CHARS), default="", server_default="")
    idle_power_w: Mapped[float] = mapped_column(Float, default=0.0, server_default=text("0"))
    busy_power_w: Mapped[float] = mapped_column(Float, default=0.0, server_default=text("0"))
    # DPD pair: the prefiller's base URL (``url`` is the decoder's); "" for a single engine
    prefill_url: Mapped[str] = mapped_column(String(URL_MAX_CHARS), default="", server_default="")
    prefill_kv_transfer_params: Mapped[str] = mapped_column(String(KV_TRANSFER_PARAMS_MAX_CHARS), default="",
                                                            server_default="")

    def __repr__(self) -> str:
        return (f"Engine(id={self.id!r}, url={self.url!r}, pool={self.pool!r}, mig_uuid={self.mig_uuid!r}, "
                f"draining={self.draining!r})")


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


class StateVersion(Base):
    """The change counter of the router's shared state (one row, id = 1)."""

    __tablename__ = "state_version"
    __table_args__ = (CheckConstraint("id = 1", name="singleton"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False, default=STATE_VERSION_ID)
    version: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))


class EngineHealth(Base):
    """An ejection verdict in force: the engine is not routed to until ``ejected_until`` (UTC)."""

    __tablename__ = "engine_health"
    __table_args__ = (CheckConstraint("eject_count >= 1", name="eject_count_positive"),)

    engine_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    ejected_until: Mapped[datetime] = mapped_column(UtcDateTime())
    eject_count: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(String(REASON_MAX_CHARS), default="", server_default="")
    replica_id: Mapped[str] = mapped_column(String(REPLICA_ID_MAX_CHARS), default="", server_default="")
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime())

    def __repr__(self) -> str:
        return f"EngineHealth(engine_id={self.engine_id!r}, ejected_until={self.ejected_until!r})"


class RouterReplica(Base):
    """What one replica (or worker) routes on, written when it changes and as a heartbeat."""

    __tablename__ = "router_replicas"

    replica_id: Mapped[str] = mapped_column(String(REPLICA_ID_MAX_CHARS), primary_key=True)
    plan_version: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    state_version: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    seen_at: Mapped[datetime] = mapped_column(UtcDateTime())

    def __repr__(self) -> str:
        return (f"RouterReplica(replica_id={self.replica_id!r}, plan_version={self.plan_version!r}, "
                f"state_version={self.state_version!r})")
