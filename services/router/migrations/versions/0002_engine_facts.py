"""router: engine kind, GPU and MIG UUIDs and power are stored

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
    with op.batch_alter_table("engines") as batch:
        batch.add_column(sa.Column("kind", sa.Integer(), server_default=sa.text("1"), nullable=False))
        batch.add_column(sa.Column("gpu_uuid", sa.String(length=96), server_default="", nullable=False))
        batch.add_column(sa.Column("mig_uuid", sa.String(length=96), server_default="", nullable=False))
        batch.add_column(sa.Column("idle_power_w", sa.Float(), server_default=sa.text("0"), nullable=False))
        batch.add_column(sa.Column("busy_power_w", sa.Float(), server_default=sa.text("0"), nullable=False))
        batch.create_check_constraint(op.f("ck_engines_kind"), "kind IN (0, 1, 2)")
        batch.create_check_constraint(op.f("ck_engines_power_not_negative"),
                                      "idle_power_w >= 0 AND busy_power_w >= 0")


def downgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.drop_constraint(op.f("ck_engines_power_not_negative"), type_="check")
        batch.drop_constraint(op.f("ck_engines_kind"), type_="check")
        batch.drop_column("busy_power_w")
        batch.drop_column("idle_power_w")
        batch.drop_column("mig_uuid")
        batch.drop_column("gpu_uuid")
        batch.drop_column("kind")
