"""Alembic environment for the forecaster's tables (run by greenserve.common.persistence.migrate)."""
