"""forecaster: the span of an open StreamLoad hour (several router workers and replicas report)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25 00:00:00

An open hour's covered seconds become min(summed windows, span, 1 h) instead of min(summed windows, 1 h).
Rows of 0003 have no span: they get the whole hour (0 .. 3600 s after hour_start), which reads them as before.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("load_buckets") as batch:
        batch.add_column(sa.Column("span_start_s", sa.Double(), server_default=sa.text("0"), nullable=False))
        batch.add_column(sa.Column("span_end_s", sa.Double(), server_default=sa.text("3600"), nullable=False))
        batch.create_check_constraint(op.f("ck_load_buckets_span_not_empty"), "span_start_s < span_end_s")


def downgrade() -> None:
    with op.batch_alter_table("load_buckets") as batch:
        batch.drop_constraint(op.f("ck_load_buckets_span_not_empty"), type_="check")
        batch.drop_column("span_end_s")
        batch.drop_column("span_start_s")
