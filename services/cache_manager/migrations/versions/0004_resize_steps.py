"""cache_manager: cache_resize_steps, the journal of an L1 resize by controlled restart in progress

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05 19:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "cache_resize_steps",
        sa.Column("server_id", sa.String(length=64), nullable=False),
        sa.Column("plan_version", sa.Integer(), nullable=True),
        sa.Column("target_bytes", sa.BigInteger(), nullable=False),
        sa.Column("previous_bytes", sa.BigInteger(), nullable=False),
        sa.Column("quotas_json", sa.Text(), nullable=False),
        sa.Column("restart_pid", sa.Integer(), nullable=True),
        sa.Column("restart_start_ticks", sa.BigInteger(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("server_id", name=op.f("pk_cache_resize_steps")),
        sa.ForeignKeyConstraint(["server_id"], ["lmcache_servers.id"],
                                name=op.f("fk_cache_resize_steps_server_id_lmcache_servers"), ondelete="CASCADE"),
        sa.CheckConstraint("plan_version IS NULL OR plan_version >= 1",
                           name=op.f("ck_cache_resize_steps_plan_version_positive")),
        sa.CheckConstraint("target_bytes >= 0 AND previous_bytes >= 0",
                           name=op.f("ck_cache_resize_steps_sizes_non_negative")),
    )


def downgrade() -> None:
    op.drop_table("cache_resize_steps")
