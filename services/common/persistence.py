"""Persistence for every greenserve service: one service's ``Database`` and its transactional sessions.

Each service owns its tables. They are declared in ``greenserve.<service>.models`` on the service's
own ``DeclarativeBase`` (own ``MetaData``, see ``greenserve.common.orm_conventions``) and created by the
service's own Alembic migrations in ``greenserve/<service>/migrations`` (``greenserve.common.schema_migrations``).
Each service records its schema revision in its own version table, ``alembic_version_<service>``, so
several services can share one PostgreSQL database. Which URLs are accepted (SQLite, the default, and
PostgreSQL) and how their engines are set up is in ``greenserve.common.db_engine``.

Typical use::

    db = Database.open("sqlite:///.greenserve/router.db", service="router")
    with db.session() as s:           # one transaction: commit on success, rollback on error
        s.add(Engine(...))
    db.close()

A process that dies inside ``with db.session()`` leaves nothing behind: the transaction was never
committed, and both SQLite (journal/WAL) and PostgreSQL discard it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import URL, Engine, event
from sqlalchemy.orm import Session

from greenserve.common.db_engine import _SQLITE_BEGIN_OPTION, make_engine, redact_url
from greenserve.common.db_errors import PersistenceError, ReadOnlySessionError, SchemaVersionError
from greenserve.common.schema_migrations import (
    _check_service,
    _current_revision,
    _include_object_for,
    head_revision,
    service_metadata,
    version_table_name,
)

# ``Database.open`` has a parameter called ``migrate``; import the function under another name.
from greenserve.common.schema_migrations import migrate as _migrate_fn

__all__ = ["Database"]


class _GreenserveSession(Session):
    """Session that refuses to flush changes when opened read-only."""


@event.listens_for(_GreenserveSession, "before_flush")
def _refuse_readonly_flush(session: Session, _flush_context: Any, _instances: Any) -> None:
    if session.info.get("greenserve_readonly") and (session.new or session.dirty or session.deleted):
        raise ReadOnlySessionError("this session was opened with readonly=True; it cannot write")


class Database:
    """One service's database: an engine, its migrated schema, and transactional sessions."""

    def __init__(self, engine: Engine, service: str) -> None:
        self.engine = engine
        self.service = _check_service(service)
        backend = engine.dialect.name
        if backend == "sqlite":
            self._rw_bind: Engine = engine.execution_options(**{_SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            self._ro_bind = engine.execution_options(**{_SQLITE_BEGIN_OPTION: "DEFERRED"})
        else:
            self._rw_bind = engine
            self._ro_bind = engine.execution_options(postgresql_readonly=True)
        self._closed = False
        self._lock = threading.Lock()

    @classmethod
    def open(
        cls,
        db_url: str | URL,
        service: str,
        *,
        migrate: bool = True,
        **engine_kwargs: Any,
    ) -> Database:
        """Connect to ``db_url`` and bring ``service``'s tables to the newest revision.

        With ``migrate=False`` nothing is changed, and a schema that is not at head raises
        ``SchemaVersionError`` (for tools that must not write, such as status commands).
        """
        name = _check_service(service)
        engine_kwargs.setdefault("application_name", f"greenserve-{name.replace('_', '-')}")
        engine = make_engine(db_url, **engine_kwargs)
        try:
            db = cls(engine, name)
            if migrate:
                _migrate_fn(engine, name)
            else:
                current, head = db.current_revision(), db.head_revision()
                if current != head:
                    raise SchemaVersionError(
                        f"{name}: database schema is at {current!r}, this build expects {head!r}; "
                        "open it with migrate=True (the service does this at start-up)"
                    )
        except BaseException:
            engine.dispose()
            raise
        return db

    # -- information ---------------------------------------------------------------------

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self.engine.dialect.name

    @property
    def url(self) -> str:
        """The database URL with the password hidden."""
        return redact_url(self.engine.url)

    def current_revision(self) -> str | None:
        """The schema revision recorded in ``alembic_version_<service>`` (None: never migrated)."""
        with self.engine.connect() as conn:
            return _current_revision(conn, self.service)

    def head_revision(self) -> str:
        """The newest schema revision this build has for the service."""
        return head_revision(self.service)

    def schema_diff(self) -> list[Any]:
        """Differences between the live schema and the ORM models (Alembic autogenerate).

        An empty list means the tables match ``Base.metadata``; anything else is drift.
        """
        from alembic.autogenerate import compare_metadata
        from alembic.runtime.migration import MigrationContext

        metadata = service_metadata(self.service)
        with self.engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "version_table": version_table_name(self.service),
                    "compare_type": True,
                    "include_object": _include_object_for(metadata),
                    "target_metadata": metadata,
                },
            )
            return list(compare_metadata(ctx, metadata))

    # -- work ----------------------------------------------------------------------------

    @contextmanager
    def session(self, *, readonly: bool = False) -> Iterator[Session]:
        """A ``Session`` inside one transaction: committed when the block ends normally, rolled back
        (nothing written) when it raises.

        ``readonly=True``: the transaction is never committed and flushing changes raises
        ``ReadOnlySessionError``; on PostgreSQL it is a READ ONLY transaction, on SQLite it does not
        take the write lock. Objects stay usable after the block (``expire_on_commit=False``).
        """
        if self._closed:
            raise PersistenceError(f"database for {self.service} is closed")
        bind = self._ro_bind if readonly else self._rw_bind
        session = _GreenserveSession(bind=bind, expire_on_commit=False)
        session.info["greenserve_readonly"] = readonly
        try:
            yield session
            if readonly:
                session.rollback()
            else:
                session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def close(self) -> None:
        """Close every pooled connection. The object cannot open sessions afterwards."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self.engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Database(service={self.service!r}, url={self.url!r})"
