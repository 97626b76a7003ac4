"""gpu_partitioner: apply_runs and energy_accounts

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02 00:00:00
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
        "apply_runs",
        sa.Column("apply_id", sa.String(length=36), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("plan_version", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("previous_layout", sa.JSON(), nullable=False),
        sa.Column("previous_mig_enabled", sa.Boolean(), nullable=False),
        sa.Column("target_layout", sa.JSON(), nullable=False),
        sa.Column("drained_engines", sa.JSON(), nullable=False),
        sa.Column("instances", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("apply_id", name=op.f("pk_apply_runs")),
        sa.CheckConstraint(
            "state IN ('running', 'succeeded', 'rolled_back', 'failed')", name=op.f("ck_apply_runs_state")
        ),
    )
    op.create_index(op.f("ix_apply_runs_gpu_uuid_state"), "apply_runs", ["gpu_uuid", "state"])
    op.create_table(
        "energy_accounts",
        sa.Column("key", sa.String(length=112), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("energy_j", sa.Float(), nullable=False),
        sa.Column("power_w", sa.Float(), nullable=False),
        sa.Column("last_counter_j", sa.Float(), nullable=True),
        sa.Column("idle_power_w", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_energy_accounts")),
    )


def downgrade() -> None:
    op.drop_table("energy_accounts")
    op.drop_index(op.f("ix_apply_runs_gpu_uuid_state"), table_name="apply_runs")
    op.drop_table("apply_runs")
