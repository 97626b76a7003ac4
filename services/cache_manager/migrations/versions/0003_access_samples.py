"""cache_manager: cache_access_samples, the bounded access history the planner replays

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25 18:30:00
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
        "cache_access_samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("pool", sa.String(length=128), nullable=False),
        sa.Column("entry_key", sa.String(length=512), nullable=False),
        sa.Column("kind", sa.SmallInteger(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("hit_tokens", sa.BigInteger(), nullable=False),
        sa.Column("conversation_id", sa.String(length=256), nullable=False),
        sa.Column("document_id", sa.String(length=256), nullable=False),
        sa.Column("time_s", sa.Double(), nullable=False),
        sa.Column("hour_s", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cache_access_samples")),
        sa.CheckConstraint("kind BETWEEN 1 AND 3", name=op.f("ck_cache_access_samples_kind")),
    )
    op.create_index("ix_cache_access_samples_pool_time", "cache_access_samples", ["pool", "time_s"])


def downgrade() -> None:
    op.drop_index("ix_cache_access_samples_pool_time", table_name="cache_access_samples")
    op.drop_table("cache_access_samples")
