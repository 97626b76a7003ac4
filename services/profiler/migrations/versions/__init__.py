"""Schema revisions of the profiler's tables (0001_initial.py, ...). Alembic skips this file."""
