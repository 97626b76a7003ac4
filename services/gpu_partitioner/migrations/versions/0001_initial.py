"""gpu_partitioner: apply_journal and simulated_gpus

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
        "apply_journal",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("apply_id", sa.String(length=36), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("plan_version", sa.Integer(), nullable=True),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("step", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_apply_journal")),
        sa.UniqueConstraint("apply_id", "step_index", name=op.f("uq_apply_journal_apply_id_step_index")),
        sa.CheckConstraint("step_index >= 0", name=op.f("ck_apply_journal_step_index_non_negative")),
        sa.CheckConstraint(
            "plan_version IS NULL OR plan_version >= 1", name=op.f("ck_apply_journal_plan_version_positive")
        ),
        sa.CheckConstraint(
            "state IN ('pending', 'done', 'failed', 'rolled_back')", name=op.f("ck_apply_journal_state")
        ),
    )
    op.create_index(op.f("ix_apply_journal_gpu_uuid_state"), "apply_journal", ["gpu_uuid", "state"])
    op.create_table(
        "simulated_gpus",
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("model", sa.String(length=64), nullable=False),
        sa.Column("mig_enabled", sa.Boolean(), nullable=False),
        sa.Column("state_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("gpu_uuid", name=op.f("pk_simulated_gpus")),
        sa.CheckConstraint("length(gpu_uuid) > 0", name=op.f("ck_simulated_gpus_gpu_uuid_not_empty")),
    )


def downgrade() -> None:
    op.drop_table("simulated_gpus")
    op.drop_index(op.f("ix_apply_journal_gpu_uuid_state"), table_name="apply_journal")
    op.drop_table("apply_journal")
