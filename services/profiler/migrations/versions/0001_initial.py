"""profiler: profiles and sweeps

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
        "profiles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("config_key", sa.String(length=255), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_profiles")),
        sa.UniqueConstraint("config_key", "version", name=op.f("uq_profiles_config_key_version")),
        sa.CheckConstraint("length(config_key) > 0", name=op.f("ck_profiles_config_key_not_empty")),
        sa.CheckConstraint("version >= 1", name=op.f("ck_profiles_version_positive")),
        sa.CheckConstraint("source IN ('measured', 'simulated', 'published')", name=op.f("ck_profiles_source")),
    )
    op.create_table(
        "sweeps",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("total_points", sa.Integer(), nullable=False),
        sa.Column("done_points", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("request", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
        sa.CheckConstraint(
            "state IN ('pending', 'running', 'done', 'failed', 'cancelled')", name=op.f("ck_sweeps_state")
        ),
        sa.CheckConstraint("total_points >= 0", name=op.f("ck_sweeps_total_points_non_negative")),
        sa.CheckConstraint(
            "done_points >= 0 AND done_points <= total_points", name=op.f("ck_sweeps_done_points_in_range")
        ),
        sa.CheckConstraint("updated_at >= created_at", name=op.f("ck_sweeps_updated_after_created")),
    )


def downgrade() -> None:
    op.drop_table("sweeps")
    op.drop_table("profiles")
