"""Revision 0004 gives the open StreamLoad hours of 0003 a span of the whole hour: they read as before; revision
0005 keys them by (pool, hour) so that a pool keeps two (late samples within a grace)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
import sqlalchemy as sa
from alembic import command

from greenserve.common.db_engine import make_engine
from greenserve.common.persistence import Database
from greenserve.common.schema_migrations import alembic_config, migrate
from greenserve.forecaster.stream_load import LoadAccumulator, Sample

from .conftest import DAY0_S


def test_open_hours_of_0003_get_the_whole_hour(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    engine = make_engine(url)
    try:
        migrate(engine, "forecaster", "0003")
        with engine.begin() as conn:  # 600 requests over 1,200 summed seconds of window, stored by 0003
            conn.execute(sa.text("INSERT INTO load_buckets (pool, hour_start, covered_s, requests, input_tokens,"
                                 " output_tokens) VALUES ('p', :h, 1200, 600, 6000, 600)"),
                         {"h": datetime.fromtimestamp(DAY0_S, tz=timezone.utc)})
    finally:
        engine.dispose()
    db = Database.open(url, "forecaster")  # migrates to head
    try:
        assert db.schema_diff() == []
        with db.engine.connect() as conn:
            row = conn.execute(sa.text("SELECT covered_s, span_start_s, span_end_s FROM load_buckets")).one()
        assert tuple(row) == (1200.0, 0.0, 3600.0)
        acc = LoadAccumulator()
        with db.session(readonly=True) as s:
            acc.restore(s)
        # a sample of the next hour, past the grace, completes it: 600 / min(1200, 3600) as 0003 read it
        plan = acc.plan([Sample(0, "p", DAY0_S + 3600, 60.0, 600.0, 1, 0, 0)])
        (_, times, rates, _), *_ = plan.emitted
        assert times.tolist() == [DAY0_S] and rates.tolist() == [pytest.approx(0.5)]
        with db.engine.begin() as conn, pytest.raises(sa.exc.IntegrityError):  # an empty span is refused
            conn.execute(sa.text("UPDATE load_buckets SET span_end_s = span_start_s"))
    finally:
        db.close()


def test_0005_keys_open_hours_by_pool_and_hour_and_its_downgrade_keeps_the_newest(tmp_path) -> None:
    """Revision 0005: a pool keeps up to two open hours (late samples within a grace); 0004's row stays."""
    url = f"sqlite:///{tmp_path / 'f.db'}"
    insert = sa.text("INSERT INTO load_buckets (pool, hour_start, covered_s, requests, input_tokens, output_tokens,"
                     " span_start_s, span_end_s) VALUES ('p', :h, 60, 60, 0, 0, 0, 60)")
    engine = make_engine(url)
    try:
        migrate(engine, "forecaster", "0004")
        with engine.begin() as conn:
            conn.execute(insert, {"h": datetime.fromtimestamp(DAY0_S, tz=timezone.utc)})
            with pytest.raises(sa.exc.IntegrityError), conn.begin_nested():  # 0004: one open hour per pool
                    conn.execute(insert, {"h": datetime.fromtimestamp(DAY0_S + 3600, tz=timezone.utc)})
    finally:
        engine.dispose()
    db = Database.open(url, "forecaster")  # migrates to head
    try:
        assert db.schema_diff() == []
        with db.engine.begin() as conn:  # a second open hour of the pool
            conn.execute(insert, {"h": datetime.fromtimestamp(DAY0_S + 3600, tz=timezone.utc)})
        acc = LoadAccumulator()
        with db.session(readonly=True) as s:
            acc.restore(s)
        assert [b.hour_s for b in acc.buckets["p"]] == [DAY0_S, DAY0_S + 3600]
        with db.engine.begin() as conn:
            command.downgrade(alembic_config("forecaster", connection=conn), "0004")
        with db.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT pool, hour_start FROM load_buckets")).all()
        assert len(rows) == 1 and rows[0][0] == "p" and "01:00" in str(rows[0][1])  # the newest hour only
    finally:
        db.close()
