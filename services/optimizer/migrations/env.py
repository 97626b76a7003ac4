"""Alembic env for the optimizer: its own tables, its own version table (alembic_version_optimizer)."""

from alembic import context

from greenserve.common.schema_migrations import run_migrations_from_env
from greenserve.optimizer.models import Base

run_migrations_from_env(context, service="optimizer", target_metadata=Base.metadata)
