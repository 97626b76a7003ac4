"""Persistence for every greenserve service: SQLAlchemy 2 engines, sessions and Alembic migrations.

Each service owns its tables. They are declared in ``greenserve.<service>.models`` on the service's
own ``DeclarativeBase`` (own ``MetaData``) and created by the service's own Alembic migrations in
``greenserve/<service>/migrations``. Each service records its schema revision in its own version
table, ``alembic_version_<service>``, so several services can share one PostgreSQL database.

Backends:

* SQLite (the default): ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``. The parent
  folder is created; every connection runs with WAL journaling, ``foreign_keys=ON`` and a busy
  timeout; transactions are real (``BEGIN`` is emitted by SQLAlchemy, so DDL is transactional too).
  ``sqlite://`` is an in-memory database shared by all sessions of one engine (for unit tests).
* PostgreSQL: ``postgresql+psycopg://user:password@host:port/dbname`` (psycopg 3). A bare
  ``postgresql://`` or ``postgres://`` URL is read as ``postgresql+psycopg://``.

Typical use::

    db = Database.open("sqlite:///.greenserve/router.db", service="router")
    with db.session() as s:           # one transaction: commit on success, rollback on error
        s.add(Engine(...))
    db.close()

A process that dies inside ``with db.session()`` leaves nothing behind: the transaction was never
committed, and both SQLite (journal/WAL) and PostgreSQL discard it.
"""

from __future__ import annotations

import importlib
import importlib.resources
import io
import sqlite3
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Dialect, Engine, MetaData, create_engine, event, make_url, text
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Mapper, Session
from sqlalchemy.pool import StaticPool
from sqlalchemy.types import DateTime, TypeDecorator

__all__ = [
    "NAMING_CONVENTION",
    "SERVICES",
    "Database",
    "PersistenceError",
    "ReadOnlySessionError",
    "SchemaVersionError",
    "UtcDateTime",
    "alembic_config",
    "head_revision",
    "make_engine",
    "migrate",
    "migration_sql",
    "migrations_path",
    "normalize_db_url",
    "redact_url",
    "run_migrations_from_env",
    "service_metadata",
    "sqlite_url",
    "utcnow",
    "version_table_name",
]

#: The services that own tables, by their package name under ``greenserve``.
SERVICES: tuple[str, ...] = (
    "forecaster",
    "profiler",
    "optimizer",
    "cache_manager",
    "gpu_partitioner",
    "router",
)

#: Constraint/index naming used by every service's MetaData, so names are the same on every backend
#: and migrations can refer to them (``ck_<table>_<name>``, ``uq_<table>_<cols>``, ...).
NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

DEFAULT_SQLITE_BUSY_TIMEOUT_MS = 15_000
DEFAULT_PG_CONNECT_TIMEOUT_S = 10

# Execution option read by the SQLite "begin" hook: how to open the transaction.
_SQLITE_BEGIN_OPTION = "greenserve_sqlite_begin"


class PersistenceError(RuntimeError):
    """Base class for errors raised by this module."""


class SchemaVersionError(PersistenceError):
    """The database's schema revision is not one this build knows, or is not at head."""


class ReadOnlySessionError(PersistenceError):
    """Something tried to write through a session opened with ``readonly=True``."""


# --------------------------------------------------------------------------------------------
# Types
# --------------------------------------------------------------------------------------------


def utcnow() -> datetime:
    """The current time as a timezone-aware UTC datetime (what ``UtcDateTime`` columns store)."""
    return datetime.now(timezone.utc)


class UtcDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always returned as a timezone-aware UTC ``datetime``.

    Binding a naive datetime raises ``ValueError``: a timestamp without a zone is ambiguous, and
    silently assuming local time or UTC is how carbon data ends up shifted by hours. Aware values in
    any zone are converted to UTC. On PostgreSQL the column is ``timestamp with time zone``; on
    SQLite (which has no zone support) the UTC wall time is stored as ISO text, which also sorts in
    time order, and UTC is attached again on the way out.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    @property
    def python_type(self) -> type[datetime]:
        return datetime

    def process_bind_param(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError(f"UtcDateTime expects a datetime, got {type(value).__name__}")
        value = _aware_utc(value)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):  # defensive: raw text in a SQLite column
            value = datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


def _aware_utc(value: Any) -> Any:
    """ORM attribute hook for ``UtcDateTime`` columns: refuse naive datetimes when they are
    assigned (a plain ``ValueError`` at the caller's line, not a wrapped error at flush time) and
    keep the in-memory value in UTC, as it will read back."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
            raise ValueError(
                f"naive datetime {value.isoformat()} refused: store timezone-aware datetimes "
                "(e.g. datetime.now(timezone.utc))"
            )
        return value.astimezone(timezone.utc)
    return value


def _on_utc_attribute_set(_target: Any, value: Any, _oldvalue: Any, _initiator: Any) -> Any:
    return _aware_utc(value)


@event.listens_for(Mapper, "mapper_configured")
def _install_utc_attribute_checks(mapper: Mapper[Any], _class: type) -> None:
    for prop in mapper.column_attrs:
        if any(isinstance(getattr(col, "type", None), UtcDateTime) for col in prop.columns):
            event.listen(prop.class_attribute, "set", _on_utc_attribute_set, retval=True)


# --------------------------------------------------------------------------------------------
# URLs and engines
# --------------------------------------------------------------------------------------------


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
    except Exception:
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

    PostgreSQL: psycopg 3, ``pool_pre_ping``, a connect timeout and ``application_name``.
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

    connect_args = {"connect_timeout": pg_connect_timeout_s}
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


# --------------------------------------------------------------------------------------------
# Migrations
# --------------------------------------------------------------------------------------------


def _check_service(service: str) -> str:
    name = service.replace("-", "_")
    if name not in SERVICES:
        raise ValueError(f"unknown service {service!r}; expected one of {', '.join(SERVICES)}")
    return name


def version_table_name(service: str) -> str:
    """Name of the table in which ``service`` records its schema revision."""
    return f"alembic_version_{_check_service(service)}"


def migrations_path(service: str) -> Path:
    """The folder holding ``service``'s Alembic environment (``env.py``, ``versions/``)."""
    name = _check_service(service)
    root = importlib.resources.files(f"greenserve.{name}") / "migrations"
    path = Path(str(root))
    if not (path / "env.py").is_file():
        raise PersistenceError(f"migrations for {name} not found (expected {path}/env.py)")
    return path


def service_metadata(service: str) -> MetaData:
    """The ``MetaData`` of ``service``'s ORM models (``greenserve.<service>.models.Base``)."""
    name = _check_service(service)
    module = importlib.import_module(f"greenserve.{name}.models")
    return module.Base.metadata


def alembic_config(
    service: str,
    *,
    connection: Connection | None = None,
    db_url: str | URL | None = None,
    output_buffer: io.StringIO | None = None,
) -> Any:
    """An Alembic ``Config`` for ``service``, built in code (no alembic.ini).

    The connection (online) or URL (offline ``--sql`` mode) travels in ``config.attributes``;
    the service's ``env.py`` hands it to :func:`run_migrations_from_env`.
    """
    from alembic.config import Config

    name = _check_service(service)
    cfg = Config(output_buffer=output_buffer)
    # ConfigParser interpolates '%': escape it so any path survives.
    cfg.set_main_option("script_location", str(migrations_path(name)).replace("%", "%%"))
    cfg.set_main_option("path_separator", "os")
    cfg.attributes["greenserve_service"] = name
    if connection is not None:
        cfg.attributes["connection"] = connection
    if db_url is not None:
        cfg.attributes["db_url"] = normalize_db_url(db_url)
    return cfg


def head_revision(service: str) -> str:
    """The newest schema revision this build has for ``service``."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config(service)).get_current_head()
    if head is None:
        raise PersistenceError(f"no migrations found for {service}")
    return head


def _advisory_lock_key(service: str) -> int:
    # Stable signed 64-bit key per service (Python's hash() is salted per process).
    value = zlib.crc32(f"greenserve:migrate:{service}".encode()) | (0x6772 << 32)
    return value


def _current_revision(connection: Connection, service: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    ctx = MigrationContext.configure(connection, opts={"version_table": version_table_name(service)})
    return ctx.get_current_revision()


def migrate(engine: Engine, service: str, revision: str = "head") -> str | None:
    """Upgrade ``service``'s tables in ``engine`` to ``revision`` in one transaction.

    Concurrent callers are serialised: on PostgreSQL by a transaction-scoped advisory lock per
    service, on SQLite by ``BEGIN IMMEDIATE``. A failure rolls the whole upgrade back. A database
    whose revision this build does not know (written by a newer release) raises
    ``SchemaVersionError`` instead of being touched. Returns the revision afterwards.
    """
    from alembic import command
    from alembic.script import ScriptDirectory
    from alembic.util.exc import CommandError

    name = _check_service(service)
    with engine.connect() as conn:
        with conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _advisory_lock_key(name)})
            cfg = alembic_config(name, connection=conn)
            current = _current_revision(conn, name)
            if current is not None:
                try:
                    ScriptDirectory.from_config(cfg).get_revision(current)
                except CommandError as exc:
                    raise SchemaVersionError(
                        f"{name}: the database is at schema revision {current!r}, which this "
                        "greenserve build does not know (was it written by a newer release?)"
                    ) from exc
            command.upgrade(cfg, revision)
            return _current_revision(conn, name)


def migration_sql(db_url: str | URL, service: str, revision: str = "head") -> str:
    """The SQL that would bring an empty database to ``revision`` (Alembic offline mode).

    Only the URL's dialect matters; nothing is connected to. For DBAs who apply DDL by hand.
    """
    buffer = io.StringIO()
    cfg = alembic_config(service, db_url=db_url, output_buffer=buffer)
    from alembic import command

    command.upgrade(cfg, revision, sql=True)
    return buffer.getvalue()


def _include_object_for(metadata: MetaData):
    own_tables = set(metadata.tables)

    def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        # Only this service's tables: other services (and their version tables) may share the DB.
        if type_ == "table":
            return name in own_tables
        table = getattr(obj, "table", None)
        if table is not None:
            return table.name in own_tables
        return True

    return include_object


def run_migrations_from_env(context: Any, *, service: str, target_metadata: MetaData) -> None:
    """Body of every service's Alembic ``env.py``.

    Online: uses the connection that :func:`migrate` put into ``config.attributes`` (or opens one
    from the URL when run some other way). Offline (``--sql``): renders SQL for the URL's dialect.
    """
    name = _check_service(service)
    config = context.config
    opts: dict[str, Any] = {
        "target_metadata": target_metadata,
        "version_table": version_table_name(name),
        "compare_type": True,
        "include_object": _include_object_for(target_metadata),
    }

    if context.is_offline_mode():
        url = config.attributes.get("db_url") or config.get_main_option("sqlalchemy.url")
        if url is None:
            raise PersistenceError("offline migration needs a database URL (for its dialect)")
        url = normalize_db_url(url)
        context.configure(
            url=url,
            literal_binds=True,
            dialect_opts={"paramstyle": "named"},
            render_as_batch=url.get_backend_name() == "sqlite",
            **opts,
        )
        with context.begin_transaction():
            context.run_migrations()
        return

    def run(connection: Connection) -> None:
        context.configure(
            connection=connection,
            render_as_batch=connection.dialect.name == "sqlite",
            **opts,
        )
        with context.begin_transaction():
            context.run_migrations()

    connection = config.attributes.get("connection")
    if connection is not None:
        run(connection)
        return
    url = config.attributes.get("db_url") or config.get_main_option("sqlalchemy.url")
    if url is None:
        raise PersistenceError(
            "no connection in config.attributes['connection'] and no sqlalchemy.url: "
            "use greenserve.common.persistence.migrate()"
        )
    engine = make_engine(url, application_name=f"greenserve-{name}-migrate")
    try:
        with engine.begin() as conn:
            run(conn)
    finally:
        engine.dispose()


# --------------------------------------------------------------------------------------------
# Database
# --------------------------------------------------------------------------------------------


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
            self._rw_bind = engine.execution_options(**{_SQLITE_BEGIN_OPTION: "IMMEDIATE"})
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


# ``Database.open`` has a parameter called ``migrate``; keep a module-level alias to the function.
_migrate_fn = migrate

