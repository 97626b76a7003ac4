"""Alembic environment for the cache_manager's tables (run by greenserve.common.schema_migrations.migrate)."""
