"""Tables owned by the forecaster: time series of grid carbon intensity and of request load.

One ``Series`` row per (kind, key, signal): e.g. ``("ci", "DE", "direct")`` in gCO2e/kWh, or
``("load", "llama-3-8b/pool-a", "requests_per_s")``. Its ``Point`` rows hold the observations,
one per timestamp (UTC).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (CheckConstraint, Double, ForeignKey, Integer, LargeBinary, MetaData, String, UniqueConstraint,
                        text)
from sqlalchemy.orm import DeclarativeBase, Mapped, WriteOnlyMapped, mapped_column, relationship

from greenserve.common.orm_conventions import NAMING_CONVENTION, UtcDateTime

SERIES_KINDS: tuple[str, ...] = ("ci", "load")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Series(Base):
    __tablename__ = "series"
    __table_args__ = (
        UniqueConstraint("kind", "key", "signal"),
        CheckConstraint("kind IN ('ci', 'load')", name="kind"),
        CheckConstraint("length(key) > 0", name="key_not_empty"),
        CheckConstraint("length(signal) > 0", name="signal_not_empty"),
        CheckConstraint("resolution_s > 0", name="resolution_s_positive"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))
    # region (kind 'ci') or "<model>/<pool>" (kind 'load')
    key: Mapped[str] = mapped_column(String(255))
    # 'direct', 'lifecycle' (ci); 'requests_per_s', 'input_tokens_per_s', ... (load)
    signal: Mapped[str] = mapped_column(String(64))
    unit: Mapped[str] = mapped_column(String(32))
    resolution_s: Mapped[int] = mapped_column(Integer)

    points: WriteOnlyMapped[Point] = relationship(
        back_populates="series", cascade="all, delete-orphan", passive_deletes=True
    )

    def __repr__(self) -> str:
        return f"Series(id={self.id!r}, kind={self.kind!r}, key={self.key!r}, signal={self.signal!r})"


class Point(Base):
    """One observation. The primary key (series_id, ts) is also the index range scans use."""

    __tablename__ = "points"

    series_id: Mapped[int] = mapped_column(
        ForeignKey("series.id", ondelete="CASCADE"), primary_key=True
    )
    ts: Mapped[datetime] = mapped_column(UtcDateTime(), primary_key=True)
    value: Mapped[float] = mapped_column(Double)

    series: Mapped[Series] = relationship(back_populates="points")

    def __repr__(self) -> str:
        return f"Point(series_id={self.series_id!r}, ts={self.ts!r}, value={self.value!r})"


class FittedModel(Base):
    """The latest fit of a series' forecasting model, pickled (see ``greenserve.forecaster.fitting``).

    ``format_version`` is the pickle layout; a row written by another layout is ignored and refitted.
    ``history_end`` is the last point the fit saw; points after it are replayed with ``update()`` on load.
    """

    __tablename__ = "fitted_models"
    __table_args__ = (CheckConstraint("format_version > 0", name="format_version_positive"),)

    series_id: Mapped[int] = mapped_column(ForeignKey("series.id", ondelete="CASCADE"), primary_key=True)
    requested_model: Mapped[str] = mapped_column(String(64))
    model_name: Mapped[str] = mapped_column(String(512))
    format_version: Mapped[int] = mapped_column(Integer)
    fitted_at: Mapped[datetime] = mapped_column(UtcDateTime())
    history_end: Mapped[datetime] = mapped_column(UtcDateTime())
    fit_s: Mapped[float] = mapped_column(Double)
    blob: Mapped[bytes] = mapped_column(LargeBinary)


class LoadBucket(Base):
    """An open (not yet emitted) hour of a pool's StreamLoad samples: sums and the seconds they cover. A pool
    has at most two: its newest hour and, until that hour's grace (``--stream-load-late-s``) has passed, the
    hour before it (revision 0005; one per pool before).

    ``covered_s`` is the sum of the samples' windows (of all reporters: router workers and replicas);
    ``span_start_s`` / ``span_end_s`` are the earliest window start and the latest window end, in seconds after
    ``hour_start`` (a window is counted whole in the hour holding its middle, so the span may reach up to half
    an hour outside it). The hour's covered seconds are min(covered_s, span, 1 h) (see
    ``greenserve.forecaster.stream_load``). Rows stored before revision 0004 have no span: they get the whole
    hour (0 .. 3600), which keeps the reading of that time, min(covered_s, 1 h).

    Stored in the transaction of the StreamLoad call that changed it, so an acknowledged sample survives a
    restart; the hour becomes points of the pool's load series once its grace has passed (a sample of a later
    hour ending at least the grace after the hour's end, or a sample two hours later).
    """

    __tablename__ = "load_buckets"
    __table_args__ = (CheckConstraint("length(pool) > 0", name="pool_not_empty"),
                      CheckConstraint("covered_s >= 0", name="covered_s_not_negative"),
                      CheckConstraint("span_start_s < span_end_s", name="span_not_empty"))

    pool: Mapped[str] = mapped_column(String(255), primary_key=True)
    hour_start: Mapped[datetime] = mapped_column(UtcDateTime(), primary_key=True)
    covered_s: Mapped[float] = mapped_column(Double)
    requests: Mapped[float] = mapped_column(Double)
    input_tokens: Mapped[float] = mapped_column(Double)
    output_tokens: Mapped[float] = mapped_column(Double)
    span_start_s: Mapped[float] = mapped_column(Double, server_default=text("0"))
    span_end_s: Mapped[float] = mapped_column(Double, server_default=text("3600"))
