"""router: a DPD pair's prefill kv_transfer_params are stored (LMCache's PD disagg_spec)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 18:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.add_column(sa.Column("prefill_kv_transfer_params", sa.String(length=1024), server_default="",
                                   nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.drop_column("prefill_kv_transfer_params")
