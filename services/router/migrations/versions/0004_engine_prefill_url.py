"""router: the prefill URL of a disaggregated prefill/decode pair is stored (DPD)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25 18:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.add_column(sa.Column("prefill_url", sa.String(length=512), server_default="", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.drop_column("prefill_url")
