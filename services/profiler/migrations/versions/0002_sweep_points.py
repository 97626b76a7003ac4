"""profiler: sweep points, sweep progress columns, profile filter columns; sweep states as the proto names them

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-03 00:00:00

The 0001 state 'done' is the proto's SWEEP_STATE_SUCCEEDED: rows are renamed to 'succeeded'.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NEW_STATES = "state IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')"
_OLD_STATES = "state IN ('pending', 'running', 'done', 'failed', 'cancelled')"


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_constraint(op.f("ck_sweeps_state"), type_="check")
        batch.add_column(sa.Column("skipped_points", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("busy_s", sa.Float(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("notes", sa.JSON(), nullable=False, server_default="[]"))
        batch.add_column(sa.Column("profile_ids", sa.JSON(), nullable=False, server_default="[]"))
    op.execute("UPDATE sweeps SET state = 'succeeded' WHERE state = 'done'")
    with op.batch_alter_table("sweeps") as batch:
        batch.create_check_constraint("state", _NEW_STATES)
        batch.create_check_constraint(
            "skipped_points_in_range", "skipped_points >= 0 AND done_points + skipped_points <= total_points"
        )
    with op.batch_alter_table("profiles") as batch:
        batch.add_column(sa.Column("model", sa.String(length=255), nullable=False, server_default=""))
        batch.add_column(sa.Column("hardware", sa.String(length=128), nullable=False, server_default=""))
        batch.add_column(sa.Column("workload", sa.String(length=255), nullable=False, server_default=""))
        batch.add_column(sa.Column("sweep_id", sa.String(length=36), nullable=True))
        batch.create_index(batch.f("ix_profiles_model_hardware"), ["model", "hardware"])
    op.create_table(
        "sweep_points",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.String(length=36), nullable=False),
        sa.Column("point_index", sa.Integer(), nullable=False),
        sa.Column("config_index", sa.Integer(), nullable=False),
        sa.Column("rate_index", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweep_points")),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], name=op.f("fk_sweep_points_sweep_id_sweeps"),
                                ondelete="CASCADE"),
        sa.UniqueConstraint("sweep_id", "point_index", name=op.f("uq_sweep_points_sweep_id_point_index")),
        sa.CheckConstraint("point_index >= 0", name=op.f("ck_sweep_points_point_index_non_negative")),
        sa.CheckConstraint("state IN ('measured', 'skipped')", name=op.f("ck_sweep_points_state")),
    )


def downgrade() -> None:
    op.drop_table("sweep_points")
    with op.batch_alter_table("profiles") as batch:
        batch.drop_index(batch.f("ix_profiles_model_hardware"))
        batch.drop_column("sweep_id")
        batch.drop_column("workload")
        batch.drop_column("hardware")
        batch.drop_column("model")
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_constraint(op.f("ck_sweeps_skipped_points_in_range"), type_="check")
        batch.drop_constraint(op.f("ck_sweeps_state"), type_="check")
    op.execute("UPDATE sweeps SET state = 'done' WHERE state = 'succeeded'")
    with op.batch_alter_table("sweeps") as batch:
        batch.create_check_constraint("state", _OLD_STATES)
        batch.drop_column("profile_ids")
        batch.drop_column("notes")
        batch.drop_column("busy_s")
        batch.drop_column("skipped_points")
