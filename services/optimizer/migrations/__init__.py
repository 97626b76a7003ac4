"""Alembic environment for the optimizer's tables (run by greenserve.common.schema_migrations.migrate)."""
