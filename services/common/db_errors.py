"""The errors of greenserve's persistence layer, apart so that the engine, migration and session modules
(``db_engine``, ``schema_migrations``, ``persistence``) can all raise them without an import cycle."""

from __future__ import annotations

__all__ = ["PersistenceError", "ReadOnlySessionError", "SchemaVersionError", "unavailable_reason"]


class PersistenceError(RuntimeError):
    """Base class for the errors of greenserve's persistence layer."""


class SchemaVersionError(PersistenceError):
    """The database's schema revision is not one this build knows, or is not at head."""


class ReadOnlySessionError(PersistenceError):
    """Something tried to write through a session opened with ``readonly=True``."""


def unavailable_reason(exc: BaseException) -> str | None:
    """Why the database could not serve a call, when ``exc`` says it is locked or unreachable (the call may be
    retried: its transaction was not committed), else None (a bug, a schema problem: INTERNAL).

    * SQLite ``database is locked`` / ``busy``: another writer held the write lock past the busy timeout;
    * PostgreSQL: a connection that failed or broke (``OperationalError``, ``InterfaceError``, or a connection
      SQLAlchemy invalidated: the server restarted or is unreachable).

    The services' interceptor answers these UNAVAILABLE, which the clients' retry policy
    retries for idempotent methods (not INTERNAL: the request may succeed once the database is back)."""
    from sqlalchemy import exc as sa_exc  # local: this module is imported by the engine module before SQLAlchemy

    if not isinstance(exc, sa_exc.DBAPIError):
        return None
    orig = exc.orig if exc.orig is not None else exc
    text = (str(orig).strip().splitlines() or [""])[0][:200]
    dialect = type(orig).__module__ or ""
    if dialect.startswith("sqlite3"):
        if isinstance(exc, sa_exc.OperationalError) and ("locked" in text or "busy" in text):
            return f"the database is locked by another writer past the busy timeout ({text}); not committed: retry"
        return None
    if exc.connection_invalidated or isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError):
        return f"the database is unreachable ({text or type(exc).__name__}); not committed: retry"
    return None
