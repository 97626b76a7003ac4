"""Writes are transactional: all of a session's rows or none, including when the process dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from greenserve.common.db_errors import ReadOnlySessionError
from greenserve.common.persistence import Database
from greenserve.forecaster.models import Point, Series
from greenserve.router.models import Engine

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
N_POINTS = 500

# Runs in a child process: open the forecaster DB, write a series and its points in one
# transaction, flush them to the database, then end according to MODE.
CHILD = textwrap.dedent(
    """
    import os, sys, time
    from datetime import datetime, timedelta, timezone
    from greenserve.common.persistence import Database
    from greenserve.forecaster.models import Point, Series

    url, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
    db = Database.open(url, "forecaster")
    with db.session() as s:
        series = Series(kind="ci", key="crash-" + mode, signal="direct", unit="gCO2e/kWh", resolution_s=60)
        s.add(series)
        s.flush()
        s.add_all(Point(series_id=series.id, ts=t0 + timedelta(minutes=i), value=float(i)) for i in range(n))
        s.flush()  # the rows are in the database now, inside the open transaction
        if mode == "exit":
            os._exit(1)  # no commit, no rollback, no cleanup
        if mode == "kill":
            print("flushed", flush=True)
            time.sleep(600)  # the parent kills us with SIGKILL here
    # mode == "commit": the with-block committed
    print("committed", flush=True)
    os._exit(0)
    """
)


def _child(url: str, mode: str, n: int = N_POINTS) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, url, mode, str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _rows(db: Database, key: str) -> tuple[int, int]:
    with db.session(readonly=True) as s:
        n_series = s.scalar(sa.select(sa.func.count()).select_from(Series).where(Series.key == key))
        n_points = s.scalar(
            sa.select(sa.func.count()).select_from(Point).join(Series).where(Series.key == key)
        )
    return n_series, n_points


def _can_still_write(db: Database) -> None:
    with db.session() as s:
        s.add(Series(kind="load", key="after-crash", signal="requests_per_s", unit="1/s", resolution_s=60))
    assert _rows(db, "after-crash") == (1, 0)


def test_committed_child_rows_are_visible(db_url: str, open_db) -> None:
    """Control for the crash tests: when the child commits, the parent does see its rows."""
    db = open_db(db_url, "forecaster")
    proc = _child(db_url, "commit")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "committed" in out
    assert _rows(db, "crash-commit") == (1, N_POINTS)


def test_crash_before_commit_leaves_no_half_rows(db_url: str, open_db) -> None:
    """os._exit(1) after flushing, before commit: none of the rows exist afterwards."""
    db = open_db(db_url, "forecaster")
    proc = _child(db_url, "exit")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert _rows(db, "crash-exit") == (0, 0)
    # Also after reopening from scratch (SQLite replays/discards its WAL on open).
    db.close()
    db2 = open_db(db_url, "forecaster")
    assert _rows(db2, "crash-exit") == (0, 0)
    _can_still_write(db2)


def test_sigkill_mid_write_leaves_no_half_rows(db_url: str, open_db) -> None:
    """SIGKILL while the transaction is open: uncommitted rows were never visible, and never are."""
    db = open_db(db_url, "forecaster")
    proc = _child(db_url, "kill")
    try:
        line = proc.stdout.readline()
        assert line.strip() == "flushed", proc.stderr.read()
        # In flight: another connection does not see the uncommitted rows.
        assert _rows(db, "crash-kill") == (0, 0)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert _rows(db, "crash-kill") == (0, 0)
    # The dead writer's locks are gone: the database takes writes again.
    _can_still_write(db)


def test_exception_in_session_rolls_back(db_url: str, open_db) -> None:
    db = open_db(db_url, "router")

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with db.session() as s:
            s.add(Engine(id="e1", url="http://e1", pool="a", model="m", source="flag", registered_at=T0))
            s.flush()  # really written to the database, then undone
            raise Boom
    with db.session(readonly=True) as s:
        assert s.scalars(sa.select(Engine)).all() == []


def test_successful_session_commits_and_objects_stay_usable(db_url: str, open_db) -> None:
    db = open_db(db_url, "router")
    with db.session() as s:
        engine = Engine(id="e1", url="http://e1", pool="a", model="m", source="flag", registered_at=T0)
        s.add(engine)
    # Attributes are still loaded after the session closed (expire_on_commit=False).
    assert (engine.id, engine.draining) == ("e1", False)
    with db.session(readonly=True) as s:
        assert s.get(Engine, "e1").url == "http://e1"


def test_batch_with_duplicate_last_row_stores_none_of_the_batch(db_url: str, open_db) -> None:
    db = open_db(db_url, "forecaster")
    with db.session() as s:
        series = Series(kind="ci", key="DE", signal="direct", unit="gCO2e/kWh", resolution_s=3600)
        s.add(series)
        s.flush()
        series_id = series.id
    batch = [Point(series_id=series_id, ts=T0 + timedelta(hours=h), value=float(h)) for h in range(99)]
    batch.append(Point(series_id=series_id, ts=T0, value=-1.0))  # same (series_id, ts) as the first
    with pytest.raises(IntegrityError):
        with db.session() as s:
            s.add_all(batch)
    with db.session(readonly=True) as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Point)) == 0


def test_readonly_session_cannot_write(db_url: str, open_db) -> None:
    db = open_db(db_url, "router")
    with pytest.raises(ReadOnlySessionError):
        with db.session(readonly=True) as s:
            s.add(Engine(id="e1", url="http://e1", pool="a", model="m", source="flag", registered_at=T0))
            s.flush()
    # Core statements too: never committed (and refused outright by PostgreSQL).
    try:
        with db.session(readonly=True) as s:
            s.execute(sa.insert(Engine.__table__).values(id="e2", url="http://e2", pool="a", model="m",
                                                         source="flag", registered_at=T0))
    except sa.exc.DBAPIError:
        assert db.backend == "postgresql"
    else:
        assert db.backend == "sqlite"
    with db.session(readonly=True) as s:
        assert s.scalars(sa.select(Engine)).all() == []


def test_concurrent_writers(db_url: str, open_db) -> None:
    """Many threads writing at once (as a grpc.aio server's worker threads do): nothing lost, no
    'database is locked'."""
    db = open_db(db_url, "forecaster")
    with db.session() as s:
        series = Series(kind="load", key="m/p", signal="requests_per_s", unit="1/s", resolution_s=1)
        s.add(series)
        s.flush()
        series_id = series.id
    errors: list[BaseException] = []
    n_threads, per_thread = 8, 25

    def writer(t: int) -> None:
        try:
            for i in range(per_thread):
                with db.session() as s:
                    # read-then-write in one transaction: the pattern that deadlocks deferred SQLite txns
                    n = s.scalar(sa.select(sa.func.count()).select_from(Point))
                    s.add(Point(series_id=series_id, ts=T0 + timedelta(seconds=t * 1000 + i), value=float(n)))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    with db.session(readonly=True) as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Point)) == n_threads * per_thread
        if db.backend == "sqlite":
            # Write transactions are serialised: each saw all the rows committed before it.
            values = sorted(s.scalars(sa.select(Point.value)).all())
            assert values == [float(i) for i in range(n_threads * per_thread)]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_child_script_really_imports_the_package() -> None:
    """Guard against the crash tests passing because the child failed before writing anything."""
    proc = subprocess.run([sys.executable, "-c", "import greenserve.forecaster.models"], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
