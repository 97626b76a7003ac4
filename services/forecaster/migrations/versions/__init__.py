"""Schema revisions of the forecaster's tables (0001_initial.py, ...). Alembic skips this file."""
