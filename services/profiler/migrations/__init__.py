"""Alembic environment for the profiler's tables (run by greenserve.common.persistence.migrate)."""
