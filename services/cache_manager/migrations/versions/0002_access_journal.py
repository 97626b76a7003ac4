"""cache_manager: cache_access_events, the journal the cache index snapshots checkpoint

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
        "cache_access_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("pool", sa.String(length=128), nullable=False),
        sa.Column("entry_key", sa.String(length=512), nullable=False),
        sa.Column("kind", sa.SmallInteger(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("hit_tokens", sa.BigInteger(), nullable=False),
        sa.Column("turn", sa.BigInteger(), nullable=False),
        sa.Column("conversation_id", sa.String(length=256), nullable=False),
        sa.Column("document_id", sa.String(length=256), nullable=False),
        sa.Column("time_s", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cache_access_events")),
        sa.CheckConstraint("kind BETWEEN 1 AND 4", name=op.f("ck_cache_access_events_kind")),
        sqlite_autoincrement=True,  # ids never reused: checkpoints hold them
    )


def downgrade() -> None:
    op.drop_table("cache_access_events")
