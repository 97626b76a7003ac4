"""router: shared state of replicas (change counter, ejection verdicts, what each replica routes on)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25 15:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    table = op.create_table(
        "state_version",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("version", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_state_version")),
        sa.CheckConstraint("id = 1", name=op.f("ck_state_version_singleton")),
    )
    op.bulk_insert(table, [{"id": 1, "version": 0}])
    op.create_table(
        "engine_health",
        sa.Column("engine_id", sa.String(length=64), nullable=False),
        sa.Column("ejected_until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("eject_count", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(length=255), server_default="", nullable=False),
        sa.Column("replica_id", sa.String(length=128), server_default="", nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("engine_id", name=op.f("pk_engine_health")),
        sa.CheckConstraint("eject_count >= 1", name=op.f("ck_engine_health_eject_count_positive")),
    )
    op.create_table(
        "router_replicas",
        sa.Column("replica_id", sa.String(length=128), nullable=False),
        sa.Column("plan_version", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("state_version", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("replica_id", name=op.f("pk_router_replicas")),
    )


def downgrade() -> None:
    op.drop_table("router_replicas")
    op.drop_table("engine_health")
    op.drop_table("state_version")
