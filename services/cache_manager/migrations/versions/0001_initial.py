"""cache_manager: lmcache_servers and cache_applications

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
        "lmcache_servers",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("pool", sa.String(length=128), nullable=False),
        sa.Column("url", sa.String(length=512), nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lmcache_servers")),
        sa.UniqueConstraint("url", name=op.f("uq_lmcache_servers_url")),
        sa.CheckConstraint("length(id) > 0", name=op.f("ck_lmcache_servers_id_not_empty")),
        sa.CheckConstraint("length(url) > 0", name=op.f("ck_lmcache_servers_url_not_empty")),
    )
    op.create_table(
        "cache_applications",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("server_id", sa.String(length=64), nullable=False),
        sa.Column("plan_version", sa.Integer(), nullable=False),
        sa.Column("l1_size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("l2_size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.Text(), server_default="", nullable=False),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cache_applications")),
        sa.ForeignKeyConstraint(
            ["server_id"],
            ["lmcache_servers.id"],
            name=op.f("fk_cache_applications_server_id_lmcache_servers"),
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint(
            "server_id", "plan_version", name=op.f("uq_cache_applications_server_id_plan_version")
        ),
        sa.CheckConstraint("plan_version >= 1", name=op.f("ck_cache_applications_plan_version_positive")),
        sa.CheckConstraint("l1_size_bytes >= 0", name=op.f("ck_cache_applications_l1_size_bytes_non_negative")),
        sa.CheckConstraint(
            "l2_size_bytes IS NULL OR l2_size_bytes >= 0",
            name=op.f("ck_cache_applications_l2_size_bytes_non_negative"),
        ),
        sa.CheckConstraint("state IN ('pending', 'applied', 'failed')", name=op.f("ck_cache_applications_state")),
    )


def downgrade() -> None:
    op.drop_table("cache_applications")
    op.drop_table("lmcache_servers")
