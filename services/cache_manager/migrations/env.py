"""Alembic env for the cache_manager: its own tables, its own version table (alembic_version_cache_manager)."""

from alembic import context

from greenserve.common.schema_migrations import run_migrations_from_env
from greenserve.cache_manager.models import Base

run_migrations_from_env(context, service="cache_manager", target_metadata=Base.metadata)
