"""Tables owned by the cache-manager: registered LMCache servers and the cache sizes applied to them.

One ``CacheApplication`` per (server, plan version): the record of enforcing that plan's L1/L2
sizes on that server, and how it went.

``AccessEvent`` is the journal of the cache index: every acknowledged access event (and every eviction the
service itself made), in the order applied. The index snapshots on disk are checkpoints of it (each holds
the id of the last event it includes); at start each pool's snapshot is loaded and the later events are
replayed, so the index holds exactly the acknowledged events even after a kill. Events older than every
pool's previous checkpoint are pruned (docs/cache_manager.md, "Durability").

``ResizeStep`` is the journal of an L1 resize by controlled restart: written before the restart command stops
the old LMCache server, cleared once the outcome is recorded; a row found at start is a restart a kill cut
(resize_recovery.py).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, WriteOnlyMapped, mapped_column, relationship

from greenserve.common.orm_conventions import NAMING_CONVENTION, UtcDateTime

APPLICATION_STATES: tuple[str, ...] = ("pending", "applied", "failed")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class LmcacheServer(Base):
    __tablename__ = "lmcache_servers"
    __table_args__ = (
        UniqueConstraint("url"),
        CheckConstraint("length(id) > 0", name="id_not_empty"),
        CheckConstraint("length(url) > 0", name="url_not_empty"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    pool: Mapped[str] = mapped_column(String(128))
    url: Mapped[str] = mapped_column(String(512))
    registered_at: Mapped[datetime] = mapped_column(UtcDateTime())

    applications: WriteOnlyMapped[CacheApplication] = relationship(
        back_populates="server", cascade="all, delete-orphan", passive_deletes=True
    )

    def __repr__(self) -> str:
        return f"LmcacheServer(id={self.id!r}, pool={self.pool!r}, url={self.url!r})"


class CacheApplication(Base):
    __tablename__ = "cache_applications"
    __table_args__ = (
        UniqueConstraint("server_id", "plan_version"),
        CheckConstraint("plan_version >= 1", name="plan_version_positive"),
        CheckConstraint("l1_size_bytes >= 0", name="l1_size_bytes_non_negative"),
        CheckConstraint("l2_size_bytes IS NULL OR l2_size_bytes >= 0", name="l2_size_bytes_non_negative"),
        CheckConstraint("state IN ('pending', 'applied', 'failed')", name="state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    server_id: Mapped[str] = mapped_column(ForeignKey("lmcache_servers.id", ondelete="CASCADE"))
    plan_version: Mapped[int] = mapped_column(Integer)
    l1_size_bytes: Mapped[int] = mapped_column(BigInteger)
    l2_size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str] = mapped_column(Text, default="", server_default="")
    applied_at: Mapped[datetime] = mapped_column(UtcDateTime())

    server: Mapped[LmcacheServer] = relationship(back_populates="applications")

    def __repr__(self) -> str:
        return (
            f"CacheApplication(server_id={self.server_id!r}, plan_version={self.plan_version!r}, "
            f"state={self.state!r})"
        )


class AccessEvent(Base):
    __tablename__ = "cache_access_events"
    # AUTOINCREMENT on SQLite: ids are never reused, even after every row was pruned (checkpoints hold ids).
    __table_args__ = (CheckConstraint("kind BETWEEN 1 AND 4", name="kind"), {"sqlite_autoincrement": True})

    # Integer on SQLite (its rowid alias), BIGINT elsewhere: the journal's order.
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    pool: Mapped[str] = mapped_column(String(128))
    entry_key: Mapped[str] = mapped_column(String(512))
    kind: Mapped[int] = mapped_column(SmallInteger)  # greenserve.v1.AccessKind
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    hit_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    turn: Mapped[int] = mapped_column(BigInteger, default=0)
    conversation_id: Mapped[str] = mapped_column(String(256), default="")
    document_id: Mapped[str] = mapped_column(String(256), default="")
    time_s: Mapped[float] = mapped_column(Double)  # when it happened (as applied), Unix seconds

    def __repr__(self) -> str:
        return f"AccessEvent(id={self.id!r}, pool={self.pool!r}, entry_key={self.entry_key!r}, kind={self.kind!r})"


class AccessSample(Base):
    """A recorded access kept for the planner's replay (``access_history.py``): per pool and UTC hour the first
    ``--access-history-per-hour`` accesses, for ``--access-history-days``. Unlike the journal it is not pruned
    at checkpoints."""

    __tablename__ = "cache_access_samples"
    __table_args__ = (CheckConstraint("kind BETWEEN 1 AND 3", name="kind"),
                      Index("ix_cache_access_samples_pool_time", "pool", "time_s"))

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    pool: Mapped[str] = mapped_column(String(128))
    entry_key: Mapped[str] = mapped_column(String(512))
    kind: Mapped[int] = mapped_column(SmallInteger)  # HIT, MISS or STORE
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    hit_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    conversation_id: Mapped[str] = mapped_column(String(256), default="")
    document_id: Mapped[str] = mapped_column(String(256), default="")
    time_s: Mapped[float] = mapped_column(Double)  # Unix seconds
    hour_s: Mapped[int] = mapped_column(BigInteger)  # the UTC hour holding time_s (the cap's bucket)


class ResizeStep(Base):
    """An L1 resize by controlled restart in progress on one server (at most one per server): what a restarted
    cache-manager needs to finish it or roll it back (resize_recovery.py)."""

    __tablename__ = "cache_resize_steps"
    __table_args__ = (
        CheckConstraint("plan_version IS NULL OR plan_version >= 1", name="plan_version_positive"),
        CheckConstraint("target_bytes >= 0 AND previous_bytes >= 0", name="sizes_non_negative"),
    )

    server_id: Mapped[str] = mapped_column(ForeignKey("lmcache_servers.id", ondelete="CASCADE"), primary_key=True)
    plan_version: Mapped[int | None] = mapped_column(Integer)  # None: a ResizeCache call, no plan
    target_bytes: Mapped[int] = mapped_column(BigInteger)
    previous_bytes: Mapped[int] = mapped_column(BigInteger)
    quotas_json: Mapped[str] = mapped_column(Text)  # {salt: quota bytes} read before the restart, to put back
    restart_pid: Mapped[int | None] = mapped_column(Integer)  # the restart command (leader of its own session)
    restart_start_ticks: Mapped[int | None] = mapped_column(BigInteger)  # its start time (/proc), against pid reuse
    started_at: Mapped[datetime] = mapped_column(UtcDateTime())

    def __repr__(self) -> str:
        return (f"ResizeStep(server_id={self.server_id!r}, plan_version={self.plan_version!r}, "
                f"target_bytes={self.target_bytes!r}, previous_bytes={self.previous_bytes!r})")
