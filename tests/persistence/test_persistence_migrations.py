"""Migrations: empty -> head on SQLite and PostgreSQL, schema == ORM models, shared databases."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from greenserve.common.db_engine import make_engine, normalize_db_url, redact_url
from greenserve.common.db_errors import PersistenceError, SchemaVersionError
from greenserve.common.persistence import Database
from greenserve.common.schema_migrations import (
    SERVICES,
    head_revision,
    migrate,
    migration_sql,
    migrations_path,
    service_metadata,
    version_table_name,
)

# The tables revision 0001 created; later revisions add more (the full set is the models' metadata).
INITIAL_TABLES = {
    "forecaster": {"series", "points"},
    "profiler": {"profiles", "sweeps"},
    "optimizer": {"plans"},
    "cache_manager": {"lmcache_servers", "cache_applications"},
    "gpu_partitioner": {"apply_journal", "simulated_gpus"},
    "router": {"engines", "last_plan"},
}


def _tables(service: str) -> set[str]:
    return set(service_metadata(service).tables)


def _table_names(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_every_service_has_migrations_and_tables() -> None:
    assert set(INITIAL_TABLES) == set(SERVICES)
    for service in SERVICES:
        versions = sorted(p.name for p in (migrations_path(service) / "versions").glob("[0-9]*.py"))
        assert versions[0] == "0001_initial.py"
        assert INITIAL_TABLES[service] <= _tables(service)
        # revisions are numbered 0001, 0002, ... and the head is the last one
        assert head_revision(service) == versions[-1].split("_")[0]


@pytest.mark.parametrize("service", SERVICES)
def test_migrate_empty_database_to_head(db_url: str, open_db, service: str) -> None:
    assert _table_names(db_url) == set()
    db = open_db(db_url, service)
    assert db.current_revision() == db.head_revision() == head_revision(service)
    # Its own tables plus its own version table; no shared "alembic_version" table.
    assert _table_names(db_url) == _tables(service) | {f"alembic_version_{service}"}


@pytest.mark.parametrize("service", SERVICES)
def test_migrated_schema_matches_models(db_url: str, service: str) -> None:
    """Alembic autogenerate finds nothing to change between the migrated DB and Base.metadata."""
    metadata = service_metadata(service)
    engine = make_engine(db_url)
    try:
        migrate(engine, service)
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={"compare_type": True, "version_table": version_table_name(service)},
            )
            diff = compare_metadata(ctx, metadata)
        assert diff == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("service", SERVICES)
def test_migrated_constraints_match_models(db_url: str, open_db, service: str) -> None:
    """compare_metadata does not look at CHECK constraints or partial indexes: compare those by name."""
    db = open_db(db_url, service)
    inspector = sa.inspect(db.engine)
    for table in service_metadata(service).tables.values():
        model_checks = {c.name for c in table.constraints if isinstance(c, sa.CheckConstraint)}
        db_checks = {c["name"] for c in inspector.get_check_constraints(table.name)}
        assert db_checks == model_checks, table.name
        model_uniques = {c.name for c in table.constraints if isinstance(c, sa.UniqueConstraint)}
        db_uniques = {c["name"] for c in inspector.get_unique_constraints(table.name)}
        assert db_uniques == model_uniques, table.name
        model_indexes = {i.name for i in table.indexes}
        # (PostgreSQL also lists the index behind each UNIQUE constraint; those are compared above.)
        db_indexes = {
            i["name"] for i in inspector.get_indexes(table.name) if not i.get("duplicates_constraint")
        }
        assert db_indexes == model_indexes, table.name
        model_fks = {c.name for c in table.foreign_key_constraints}
        db_fks = {fk["name"] for fk in inspector.get_foreign_keys(table.name)}
        assert db_fks == model_fks, table.name


def test_schema_diff_detects_drift(db_url: str, open_db) -> None:
    """The comparison above can fail: a column the models do not have shows up as drift."""
    db = open_db(db_url, "router")
    assert db.schema_diff() == []
    with db.engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE engines ADD COLUMN weight_pct INTEGER"))
    diff = db.schema_diff()
    assert diff, "added column not detected"
    assert any(d[0] == "remove_column" and d[3].name == "weight_pct" for d in diff)


def test_reopen_is_idempotent(db_url: str) -> None:
    from greenserve.router.models import Engine

    from datetime import datetime, timezone

    db = Database.open(db_url, "router")
    with db.session() as s:
        s.add(Engine(id="e1", url="http://e1:8000", pool="p", model="m", source="flag",
                     registered_at=datetime(2025, 1, 1, tzinfo=timezone.utc)))
    db.close()
    for _ in range(2):
        db = Database.open(db_url, "router")
        try:
            assert db.current_revision() == head_revision("router")
            with db.session(readonly=True) as s:
                assert s.scalar(sa.select(sa.func.count()).select_from(Engine)) == 1
            with db.engine.connect() as conn:
                rows = conn.execute(sa.text("SELECT version_num FROM alembic_version_router")).all()
            assert [r[0] for r in rows] == [head_revision("router")]
        finally:
            db.close()


def test_all_services_share_one_database(db_url: str, open_db) -> None:
    """Six services, one database: separate version tables, no clash, no cross-service drift."""
    dbs = {service: open_db(db_url, service) for service in SERVICES}
    # Opening them all again (every service restarting) changes nothing.
    for service in SERVICES:
        open_db(db_url, service)
    tables = _table_names(db_url)
    assert {f"alembic_version_{s}" for s in SERVICES} <= tables
    assert "alembic_version" not in tables
    assert tables == set().union(*(_tables(s) for s in SERVICES)) | {f"alembic_version_{s}" for s in SERVICES}
    for service, db in dbs.items():
        assert db.current_revision() == head_revision(service)
        # The other services' tables are not "extra tables" for this one.
        assert db.schema_diff() == [], service


def test_concurrent_first_open(db_url: str) -> None:
    """Several replicas starting at once on an empty database: one migrates, all succeed."""
    errors: list[BaseException] = []
    revisions: list[str | None] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        try:
            barrier.wait()
            db = Database.open(db_url, "profiler")
            try:
                revisions.append(db.current_revision())
            finally:
                db.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert revisions == [head_revision("profiler")] * 8


def test_failed_migration_leaves_nothing(db_url: str) -> None:
    """DDL is transactional on both backends: a migration failing half-way creates no table."""
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:  # someone else's table in the way of the second CREATE TABLE
            conn.execute(sa.text("CREATE TABLE points (x INTEGER)"))
        with pytest.raises(sa.exc.DatabaseError):
            migrate(engine, "forecaster")
        tables = set(sa.inspect(engine).get_table_names())
        assert tables == {"points"}  # no "series", no alembic_version_forecaster
    finally:
        engine.dispose()


def test_unknown_revision_is_refused(db_url: str) -> None:
    db = Database.open(db_url, "optimizer")
    with db.engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version_optimizer SET version_num = '9999_future'"))
    db.close()
    with pytest.raises(SchemaVersionError, match="9999_future"):
        Database.open(db_url, "optimizer")
    # and the database was not touched
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version_optimizer")).scalar() == "9999_future"
    finally:
        engine.dispose()


def test_open_without_migrate_requires_head(db_url: str, open_db) -> None:
    with pytest.raises(SchemaVersionError, match="migrate=True"):
        Database.open(db_url, "router", migrate=False)
    assert _table_names(db_url) == set()
    open_db(db_url, "router")
    db = open_db(db_url, "router", migrate=False)
    assert db.current_revision() == head_revision("router")


def test_offline_sql_for_postgresql() -> None:
    sql = migration_sql("postgresql+psycopg://u:secret@db.example/greenserve", "optimizer")
    assert "CREATE TABLE plans" in sql
    assert "CREATE UNIQUE INDEX uq_plans_one_active ON plans (state) WHERE state = 'active'" in sql
    assert "alembic_version_optimizer" in sql
    assert "TIMESTAMP WITH TIME ZONE" in sql
    assert "secret" not in sql


def test_unknown_service_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown service"):
        Database.open(f"sqlite:///{tmp_path}/x.db", "billing")


def test_closed_database_refuses_sessions(tmp_path: Path) -> None:
    db = Database.open(f"sqlite:///{tmp_path}/x.db", "cache-manager")
    assert db.service == "cache_manager"
    db.close()
    db.close()  # idempotent
    with pytest.raises(PersistenceError, match="closed"):
        with db.session():
            pass


# -- engines and URLs ------------------------------------------------------------------------


def test_sqlite_engine_settings(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "state.db"
    engine = make_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 15000
        assert path.is_file()
        assert engine.pool._pre_ping  # type: ignore[attr-defined]
    finally:
        engine.dispose()


def test_sqlite_in_memory_is_shared_between_sessions() -> None:
    from greenserve.router.models import LastPlan
    from datetime import datetime, timezone

    db = Database.open("sqlite://", "router")
    try:
        with db.session() as s:
            s.add(LastPlan(plan_version=3, received_at=datetime.now(timezone.utc), body=b"x"))
        with db.session(readonly=True) as s:
            assert s.get(LastPlan, 1).plan_version == 3
    finally:
        db.close()


@pytest.mark.postgres
def test_postgres_engine_settings(postgres_server, open_db) -> None:
    name = postgres_server.create_database()
    try:
        db = open_db(postgres_server.url(name), "forecaster")
        assert db.backend == "postgresql"
        assert db.engine.url.drivername == "postgresql+psycopg"
        assert postgres_server.password not in db.url and "***" in db.url
        with db.engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW application_name").scalar() == "greenserve-forecaster"
        db.close()
    finally:
        postgres_server.drop_database(name)


def test_url_normalisation() -> None:
    assert normalize_db_url("postgres://u:p@h/db").drivername == "postgresql+psycopg"
    assert normalize_db_url("postgresql://u:p@h/db").drivername == "postgresql+psycopg"
    assert normalize_db_url("postgresql+psycopg://u:p@h/db").drivername == "postgresql+psycopg"
    assert normalize_db_url("sqlite:///x.db").drivername == "sqlite"
    with pytest.raises(ValueError, match="unsupported database") as exc_info:
        normalize_db_url("mysql+pymysql://root:hunter2@h/db")
    assert "hunter2" not in str(exc_info.value)
    with pytest.raises(ValueError, match="psycopg"):
        normalize_db_url("postgresql+psycopg2://u:p@h/db")
    assert redact_url("postgresql+psycopg://u:hunter2@h:5432/db") == "postgresql+psycopg://u:***@h:5432/db"
