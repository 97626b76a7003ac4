"""Revision 0002 renames 0001's sweep state 'done' to the proto's 'succeeded' and keeps the rows."""

from __future__ import annotations

from datetime import datetime, timezone

import sqlalchemy as sa

from greenserve.common.db_engine import make_engine
from greenserve.common.persistence import Database
from greenserve.common.schema_migrations import migrate


def test_done_sweeps_become_succeeded(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    engine = make_engine(url)
    try:
        migrate(engine, "profiler", "0001")
        t = datetime(2025, 1, 1, tzinfo=timezone.utc)
        with engine.begin() as conn:
            for sid, state in (("a", "done"), ("b", "running")):
                conn.execute(sa.text("INSERT INTO sweeps (id, state, created_at, updated_at, total_points, done_points,"
                                     " request) VALUES (:id, :state, :t, :t, 3, 1, x'00')"),
                             {"id": sid, "state": state, "t": t})
    finally:
        engine.dispose()
    db = Database.open(url, "profiler")  # migrates to head
    try:
        with db.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT id, state, skipped_points FROM sweeps ORDER BY id")).all()
        assert [tuple(r) for r in rows] == [("a", "succeeded", 0), ("b", "running", 0)]
        assert db.schema_diff() == []
    finally:
        db.close()
