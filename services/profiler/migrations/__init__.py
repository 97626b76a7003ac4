"""Alembic environment for the profiler's tables (run by greenserve.common.schema_migrations.migrate)."""
