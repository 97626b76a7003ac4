"""Alembic env for the forecaster: its own tables, its own version table (alembic_version_forecaster)."""

from alembic import context

from greenserve.common.schema_migrations import run_migrations_from_env
from greenserve.forecaster.models import Base

run_migrations_from_env(context, service="forecaster", target_metadata=Base.metadata)
