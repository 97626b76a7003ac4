"""Alembic environment for the gpu_partitioner's tables (run by greenserve.common.schema_migrations.migrate)."""
