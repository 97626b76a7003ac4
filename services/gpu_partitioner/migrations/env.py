"""Alembic env for the gpu_partitioner: its own tables, its own version table (alembic_version_gpu_partitioner)."""

from alembic import context

from greenserve.common.schema_migrations import run_migrations_from_env
from greenserve.gpu_partitioner.models import Base

run_migrations_from_env(context, service="gpu_partitioner", target_metadata=Base.metadata)
