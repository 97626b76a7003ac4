"""gpu_partitioner: gpu_power_runs (journal of power limit / SM clock changes) and gpu_power_settings

Revision ID: 0003
Revises: 0002
Create Date: 2026-01-15 00:00:00
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
        "gpu_power_runs",
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("plan_version", sa.Integer(), nullable=True),
        sa.Column("pool", sa.String(length=128), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("previous", sa.JSON(), nullable=False),
        sa.Column("target", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_gpu_power_runs")),
        sa.CheckConstraint(
            "state IN ('running', 'succeeded', 'rolled_back', 'failed')", name=op.f("ck_gpu_power_runs_state")
        ),
    )
    op.create_index(op.f("ix_gpu_power_runs_gpu_uuid_state"), "gpu_power_runs", ["gpu_uuid", "state"])
    op.create_table(
        "gpu_power_settings",
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("power_limit_w", sa.Float(), nullable=True),
        sa.Column("locked_min_mhz", sa.Integer(), nullable=True),
        sa.Column("locked_max_mhz", sa.Integer(), nullable=True),
        sa.Column("pool", sa.String(length=128), nullable=False),
        sa.Column("plan_version", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("gpu_uuid", name=op.f("pk_gpu_power_settings")),
    )


def downgrade() -> None:
    op.drop_table("gpu_power_settings")
    op.drop_index(op.f("ix_gpu_power_runs_gpu_uuid_state"), table_name="gpu_power_runs")
    op.drop_table("gpu_power_runs")
