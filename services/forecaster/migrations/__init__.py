"""Alembic environment for the forecaster's tables (run by greenserve.common.schema_migrations.migrate)."""
