"""Alembic environment for the router's tables (run by greenserve.common.persistence.migrate)."""
