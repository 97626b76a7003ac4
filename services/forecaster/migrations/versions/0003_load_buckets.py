"""forecaster: open StreamLoad hours per pool (acknowledged samples survive a restart)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25 00:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "load_buckets",
        sa.Column("pool", sa.String(length=255), nullable=False),
        sa.Column("hour_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("covered_s", sa.Double(), nullable=False),
        sa.Column("requests", sa.Double(), nullable=False),
        sa.Column("input_tokens", sa.Double(), nullable=False),
        sa.Column("output_tokens", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("pool", name=op.f("pk_load_buckets")),
        sa.CheckConstraint("length(pool) > 0", name=op.f("ck_load_buckets_pool_not_empty")),
        sa.CheckConstraint("covered_s >= 0", name=op.f("ck_load_buckets_covered_s_not_negative")),
    )


def downgrade() -> None:
    op.drop_table("load_buckets")
