"""Alembic environment for the gpu_partitioner's tables (run by greenserve.common.persistence.migrate)."""
