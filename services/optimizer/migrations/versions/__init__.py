"""Schema revisions of the optimizer's tables (0001_initial.py, ...). Alembic skips this file."""
