"""Schema revisions of the gpu_partitioner's tables (0001_initial.py, ...). Alembic skips this file."""
