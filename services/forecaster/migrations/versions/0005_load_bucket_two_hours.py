"""forecaster: up to two open StreamLoad hours per pool (late samples within a grace period)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 00:00:00

A pool keeps its current hour and the one before it open until the earlier hour's grace has passed
(``--stream-load-late-s``), so ``load_buckets`` is keyed by (pool, hour_start) instead of pool. Rows of 0004
(one per pool) are kept as they are. The downgrade keeps each pool's newest hour only: the older open hour's
acknowledged samples are lost (0004 has room for one).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("load_buckets") as batch:
        batch.drop_constraint(op.f("pk_load_buckets"), type_="primary")
        batch.create_primary_key(op.f("pk_load_buckets"), ["pool", "hour_start"])


def downgrade() -> None:
    op.execute("DELETE FROM load_buckets WHERE hour_start < (SELECT MAX(newer.hour_start) FROM load_buckets newer "
               "WHERE newer.pool = load_buckets.pool)")
    with op.batch_alter_table("load_buckets") as batch:
        batch.drop_constraint(op.f("pk_load_buckets"), type_="primary")
        batch.create_primary_key(op.f("pk_load_buckets"), ["pool"])
