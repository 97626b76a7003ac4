"""profiler: calibrated simulator model versions

Revision ID: 0003
Revises: 0002
Create Date: 2025-01-04 00:00:00
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
        "model_versions",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("base_profile", sa.String(length=255), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_model_versions")),
        sa.UniqueConstraint("base_profile", "ordinal", name=op.f("uq_model_versions_base_profile_ordinal")),
        sa.CheckConstraint("length(name) > 0", name=op.f("ck_model_versions_name_not_empty")),
    )


def downgrade() -> None:
    op.drop_table("model_versions")
