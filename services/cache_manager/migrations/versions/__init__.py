"""Schema revisions of the cache_manager's tables (0001_initial.py, ...). Alembic skips this file."""
