"""forecaster: series and points

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "series",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("signal", sa.String(length=64), nullable=False),
        sa.Column("unit", sa.String(length=32), nullable=False),
        sa.Column("resolution_s", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_series")),
        sa.UniqueConstraint("kind", "key", "signal", name=op.f("uq_series_kind_key_signal")),
        sa.CheckConstraint("kind IN ('ci', 'load')", name=op.f("ck_series_kind")),
        sa.CheckConstraint("length(key) > 0", name=op.f("ck_series_key_not_empty")),
        sa.CheckConstraint("length(signal) > 0", name=op.f("ck_series_signal_not_empty")),
        sa.CheckConstraint("resolution_s > 0", name=op.f("ck_series_resolution_s_positive")),
    )
    op.create_table(
        "points",
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("series_id", "ts", name=op.f("pk_points")),
        sa.ForeignKeyConstraint(
            ["series_id"], ["series.id"], name=op.f("fk_points_series_id_series"), ondelete="CASCADE"
        ),
    )


def downgrade() -> None:
    op.drop_table("points")
    op.drop_table("series")
