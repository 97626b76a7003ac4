"""Alembic environment for the cache_manager's tables (run by greenserve.common.persistence.migrate)."""
