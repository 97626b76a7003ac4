"""Alembic env for the profiler: its own tables, its own version table (alembic_version_profiler)."""

from alembic import context

from greenserve.common.schema_migrations import run_migrations_from_env
from greenserve.profiler.models import Base

run_migrations_from_env(context, service="profiler", target_metadata=Base.metadata)
