"""optimizer: fleet inventory, GPUs reported by gpu-partitioners, enforcement reports, forecast cache

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-25 00:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fleet",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fleet")),
        sa.CheckConstraint("id = 1", name=op.f("ck_fleet_single_row")),
    )
    op.create_table(
        "reported_gpus",
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("node", name=op.f("pk_reported_gpus")),
    )
    op.create_table(
        "enforcement_reports",
        sa.Column("plan_version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("component", sa.String(length=64), nullable=False),
        sa.Column("instance", sa.String(length=253), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("plan_version", "component", "instance", name=op.f("pk_enforcement_reports")),
    )
    op.create_table(
        "forecast_cache",
        sa.Column("series", sa.String(length=300), nullable=False),
        sa.Column("fetched_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("series", name=op.f("pk_forecast_cache")),
    )


def downgrade() -> None:
    op.drop_table("forecast_cache")
    op.drop_table("enforcement_reports")
    op.drop_table("reported_gpus")
    op.drop_table("fleet")
