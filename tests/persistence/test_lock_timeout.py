"""A write waiting on a lock is bounded on both backends: SQLite's busy timeout, PostgreSQL's lock_timeout (the
same length), so a stuck holder makes a call fail cleanly instead of hanging it."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from greenserve.common.db_engine import DEFAULT_SQLITE_BUSY_TIMEOUT_MS, make_engine


@pytest.mark.postgres
def test_postgres_connections_carry_the_lock_timeout(postgres_server) -> None:  # fixture
    engine = make_engine(postgres_server.url(postgres_server.create_database()))
    try:
        with engine.connect() as conn:
            shown = conn.execute(text("SHOW lock_timeout")).scalar_one()
    finally:
        engine.dispose()
    assert shown == f"{DEFAULT_SQLITE_BUSY_TIMEOUT_MS // 1000}s", shown
