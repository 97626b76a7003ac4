"""router: engines and last_plan

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
        "engines",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("url", sa.String(length=512), nullable=False),
        sa.Column("pool", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=255), nullable=False),
        sa.Column("source", sa.String(length=8), nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("draining", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_engines")),
        sa.UniqueConstraint("url", name=op.f("uq_engines_url")),
        sa.CheckConstraint("length(id) > 0", name=op.f("ck_engines_id_not_empty")),
        sa.CheckConstraint("length(url) > 0", name=op.f("ck_engines_url_not_empty")),
        sa.CheckConstraint("source IN ('flag', 'rpc', 'plan')", name=op.f("ck_engines_source")),
    )
    op.create_table(
        "last_plan",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("plan_version", sa.Integer(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_last_plan")),
        sa.CheckConstraint("id = 1", name=op.f("ck_last_plan_singleton")),
        sa.CheckConstraint("plan_version >= 1", name=op.f("ck_last_plan_plan_version_positive")),
    )


def downgrade() -> None:
    op.drop_table("last_plan")
    op.drop_table("engines")
