"""Schema revisions of the router's tables (0001_initial.py, ...). Alembic skips this file."""
