"""forecaster: fitted models persisted per series

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02 00:00:00
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
        "fitted_models",
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("requested_model", sa.String(length=64), nullable=False),
        sa.Column("model_name", sa.String(length=512), nullable=False),
        sa.Column("format_version", sa.Integer(), nullable=False),
        sa.Column("fitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("history_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("fit_s", sa.Double(), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("series_id", name=op.f("pk_fitted_models")),
        sa.ForeignKeyConstraint(
            ["series_id"], ["series.id"], name=op.f("fk_fitted_models_series_id_series"), ondelete="CASCADE"
        ),
        sa.CheckConstraint("format_version > 0", name=op.f("ck_fitted_models_format_version_positive")),
    )


def downgrade() -> None:
    op.drop_table("fitted_models")
