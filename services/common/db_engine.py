"""Database URLs and engines: which URLs greenserve accepts, and an Engine configured as every service needs it.

* SQLite (the default): ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``. The parent
  folder is created; every connection runs with WAL journaling, ``foreign_keys=ON`` and a busy
  timeout; transactions are real (``BEGIN`` is emitted by SQLAlchemy, so DDL is transactional too).
  ``sqlite://`` is an in-memory database shared by all sessions of one engine (for unit tests).
* PostgreSQL: ``postgresql+psycopg://user:password@host:port/dbname`` (psycopg 3). A bare
  ``postgresql://`` or ``postgres://`` URL is read as ``postgresql+psycopg://``.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Engine, create_engine, event, make_url
from sqlalchemy.engine import Connection
from sqlalchemy.pool import StaticPool

from greenserve.common.db_errors import PersistenceError

__all__ = [
    "DEFAULT_PG_CONNECT_TIMEOUT_S",
    "DEFAULT_SQLITE_BUSY_TIMEOUT_MS",
    "make_engine",
    "normalize_db_url",
    "redact_url",
    "sqlite_url",
]

DEFAULT_SQLITE_BUSY_TIMEOUT_MS = 15_000
DEFAULT_PG_CONNECT_TIMEOUT_S = 10

# Execution option read by the SQLite "begin" hook: how to open the transaction.
_SQLITE_BEGIN_OPTION = "greenserve_sqlite_begin"


def sqlite_url(path: str | Path) -> str:
    """``sqlite:///`` URL for a file path (relative paths stay relative to the working dir)."""
    return f"sqlite:///{Path(path)}"


def normalize_db_url(db_url: str | URL) -> URL:
    """Parse a database URL and pick the driver greenserve uses for it.

    ``postgresql://`` and ``postgres://`` become ``postgresql+psycopg://``; ``sqlite://`` stays on
    the standard library driver. Anything else raises ``ValueError``: the migrations are written
    and tested for SQLite and PostgreSQL only.
    """
    if isinstance(db_url, str):
        raw = db_url.strip()
        if raw.startswith("postgres://"):
            raw = "postgresql://" + raw[len("postgres://") :]
        try:
            url = make_url(raw)
        except Exception as exc:  # sqlalchemy.exc.ArgumentError; never echo a password back
            raise ValueError(f"not a database URL: {redact_url(raw)!r}") from exc
    else:
        url = db_url
    backend = url.get_backend_name()
    driver = url.get_driver_name()
    if backend == "postgresql":
        if url.drivername == "postgresql":
            url = url.set(drivername="postgresql+psycopg")
        elif driver != "psycopg":
            raise ValueError(
                f"unsupported PostgreSQL driver {driver!r} in {redact_url(url)}: "
                "use postgresql+psycopg:// (psycopg 3)"
            )
    elif backend == "sqlite":
        if driver not in ("pysqlite",):
            raise ValueError(f"unsupported SQLite driver {driver!r} in {redact_url(url)}: use sqlite://")
    else:
        raise ValueError(
            f"unsupported database {backend!r} in {redact_url(url)}: "
            "greenserve stores state in SQLite (sqlite:///file.db) or PostgreSQL (postgresql+psycopg://...)"
        )
    return url


def redact_url(db_url: str | URL) -> str:
    """The URL as text with any password replaced by ``***`` (safe for logs and status output)."""
    if isinstance(db_url, URL):
        return db_url.render_as_string(hide_password=True)
    try:
        return make_url(db_url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - whatever make_url refuses is masked below
        # Unparseable: drop everything between '//' and '@' rather than risk leaking a secret.
        head, sep, rest = db_url.partition("//")
        if sep and "@" in rest:
            return f"{head}//***@{rest.rsplit('@', 1)[1]}"
        return db_url


def _sqlite_is_memory(url: URL) -> bool:
    database = url.database or ""
    return database in ("", ":memory:") or "mode=memory" in database or url.query.get("mode") == "memory"


def make_engine(
    db_url: str | URL,
    *,
    application_name: str | None = None,
    sqlite_busy_timeout_ms: int = DEFAULT_SQLITE_BUSY_TIMEOUT_MS,
    pg_connect_timeout_s: int = DEFAULT_PG_CONNECT_TIMEOUT_S,
    echo: bool = False,
    **engine_kwargs: Any,
) -> Engine:
    """Create an Engine configured the way every greenserve service needs it.

    SQLite: the parent folder of the file is created; each new connection gets
    ``journal_mode=WAL``, ``foreign_keys=ON`` and ``busy_timeout``; SQLAlchemy (not the sqlite3
    module) emits ``BEGIN`` so that every statement, DDL included, runs in a real transaction.
    Write transactions begin ``IMMEDIATE`` (take the write lock up front, so two writers queue on
    the busy timeout instead of failing on a lock upgrade); read-only ones begin ``DEFERRED``.

    PostgreSQL: psycopg 3, ``pool_pre_ping``, a connect timeout, ``application_name``, and a ``lock_timeout`` as
    long as SQLite's busy timeout: a write waiting on a row another session holds fails (UNAVAILABLE upstream)
    instead of waiting for ever.
    """
    url = normalize_db_url(db_url)
    kwargs: dict[str, Any] = {"pool_pre_ping": True, "echo": echo}
    backend = url.get_backend_name()

    if backend == "sqlite":
        memory = _sqlite_is_memory(url)
        connect_args: dict[str, Any] = {
            "check_same_thread": False,
            "timeout": sqlite_busy_timeout_ms / 1000.0,
        }
        if memory:
            # One connection shared by every session: otherwise each would see its own empty DB.
            kwargs["poolclass"] = StaticPool
        else:
            database = url.database or ""
            if not database.startswith("file:"):
                Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        kwargs["connect_args"] = connect_args | engine_kwargs.pop("connect_args", {})
        kwargs.update(engine_kwargs)
        engine = create_engine(url, **kwargs)
        _install_sqlite_hooks(engine, busy_timeout_ms=sqlite_busy_timeout_ms, wal=not memory)
        return engine

    connect_args = {"connect_timeout": pg_connect_timeout_s, "options": f"-c lock_timeout={sqlite_busy_timeout_ms}"}
    if application_name:
        connect_args["application_name"] = application_name[:63]
    kwargs["connect_args"] = connect_args | engine_kwargs.pop("connect_args", {})
    kwargs.update(engine_kwargs)
    return create_engine(url, **kwargs)


def _enable_wal(cursor: Any, busy_timeout_ms: int) -> None:
    """Switch the file to WAL (persistent, so usually already done). Switching needs an exclusive
    lock and SQLite reports "database is locked" at once instead of waiting on the busy timeout
    when another connection holds one (several processes creating the same new file), so retry."""
    cursor.execute("PRAGMA journal_mode")
    row = cursor.fetchone()
    if row is not None and str(row[0]).lower() == "wal":
        return
    deadline = time.monotonic() + busy_timeout_ms / 1000.0
    delay = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            row = cursor.fetchone()
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
    if row is None or str(row[0]).lower() != "wal":
        raise PersistenceError(f"SQLite refused WAL journaling (journal_mode={row!r})")


def _install_sqlite_hooks(engine: Engine, *, busy_timeout_ms: int, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module (its legacy mode does not BEGIN
        # before DDL and COMMITs implicitly); the "begin" hook below emits BEGIN instead.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            cursor.execute("PRAGMA foreign_keys = ON")
            if wal:
                _enable_wal(cursor, busy_timeout_ms)
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get(_SQLITE_BEGIN_OPTION, "IMMEDIATE")
        conn.exec_driver_sql("BEGIN IMMEDIATE" if mode == "IMMEDIATE" else "BEGIN DEFERRED")
