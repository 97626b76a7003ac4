"""optimizer: plans

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
        "plans",
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("valid_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("valid_until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("expected_total_carbon_g", sa.Double(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_plans")),
        sa.CheckConstraint("version >= 1", name=op.f("ck_plans_version_positive")),
        sa.CheckConstraint("valid_until > valid_from", name=op.f("ck_plans_valid_until_after_valid_from")),
        sa.CheckConstraint("state IN ('proposed', 'active', 'superseded')", name=op.f("ck_plans_state")),
        sa.CheckConstraint(
            "expected_total_carbon_g >= 0", name=op.f("ck_plans_expected_total_carbon_g_non_negative")
        ),
    )
    # At most one active plan.
    op.create_index(
        op.f("uq_plans_one_active"),
        "plans",
        ["state"],
        unique=True,
        sqlite_where=sa.text("state = 'active'"),
        postgresql_where=sa.text("state = 'active'"),
    )


def downgrade() -> None:
    op.drop_index(op.f("uq_plans_one_active"), table_name="plans")
    op.drop_table("plans")
