"""Schema migrations: each service's Alembic environment, version table and upgrade, built in code.

Each service owns its tables, created by its own Alembic migrations in ``greenserve/<service>/migrations``,
and records its schema revision in its own version table, ``alembic_version_<service>``, so several
services can share one PostgreSQL database. Every service's ``env.py`` is one call to
:func:`run_migrations_from_env`; :func:`migrate` is what ``Database.open`` runs at start-up.
"""

from __future__ import annotations

import importlib
import importlib.resources
import io
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Engine, MetaData, text
from sqlalchemy.engine import Connection

from greenserve.common.db_engine import make_engine, normalize_db_url
from greenserve.common.db_errors import PersistenceError, SchemaVersionError

__all__ = [
    "SERVICES",
    "alembic_config",
    "head_revision",
    "migrate",
    "migration_sql",
    "migrations_path",
    "run_migrations_from_env",
    "service_metadata",
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


def _include_object_for(metadata: MetaData) -> Callable[[Any, str | None, str, bool, Any], bool]:
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
            "use greenserve.common.schema_migrations.migrate()"
        )
    engine = make_engine(url, application_name=f"greenserve-{name}-migrate")
    try:
        with engine.begin() as conn:
            run(conn)
    finally:
        engine.dispose()
