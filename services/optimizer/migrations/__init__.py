"""Alembic environment for the optimizer's tables (run by greenserve.common.persistence.migrate)."""
