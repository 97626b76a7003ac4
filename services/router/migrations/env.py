"""Alembic env for the router: its own tables, its own version table (alembic_version_router)."""

from alembic import context

from greenserve.common.schema_migrations import run_migrations_from_env
from greenserve.router.models import Base

run_migrations_from_env(context, service="router", target_metadata=Base.metadata)
