"""Fixtures for the persistence tests: a SQLite file per test, and a real PostgreSQL server.

The PostgreSQL server (``greenserve.bench.pg_server``, shared with the benchmarks) is started once per
test session from the installed server binaries (``initdb``/``pg_ctl``, Debian's ``postgresql``
package: ``bash scripts/install-postgres.sh``) in a temporary data directory, listening on a free
loopback port with password (SCRAM) authentication.
Every test gets a fresh database on it. When the binaries are missing the PostgreSQL-parametrised
tests are skipped with a reason saying so; set ``GREENSERVE_REQUIRE_POSTGRES=1`` (CI) to make that
an error instead.

Tests take the ``db_url`` fixture, parametrised over both backends (``[sqlite]``, ``[postgres]``);
the postgres cases carry ``@pytest.mark.postgres``, so ``-m "not postgres"`` runs SQLite only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from greenserve.common.db_engine import sqlite_url
from greenserve.common.persistence import Database
from greenserve.bench.pg_server import (
    INSTALL_HINT,
    PG_OS_USER,
    PostgresServer,
    pg_bindir,
)


def _unavailable(reason: str) -> None:
    if os.environ.get("GREENSERVE_REQUIRE_POSTGRES", "").strip() not in ("", "0", "false", "no"):
        pytest.fail(f"PostgreSQL required (GREENSERVE_REQUIRE_POSTGRES is set) but {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL tests skipped: {reason}")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bindir = pg_bindir()
    if bindir is None:
        _unavailable(
            "the PostgreSQL server binaries (initdb, pg_ctl) were not found in "
            f"/usr/lib/postgresql/*/bin or on PATH; {INSTALL_HINT}"
        )
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam(PG_OS_USER)
        except KeyError:
            _unavailable(
                f"tests run as root, initdb refuses root, and there is no '{PG_OS_USER}' system user "
                f"to run the server as; {INSTALL_HINT} (the package creates that user)"
            )
    server = PostgresServer(bindir)
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def db_url_factory(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[[], str]]:
    """Makes URLs of fresh, empty databases on the test's backend."""
    created: list[str] = []
    server: PostgresServer | None = None
    if backend == "postgres":
        server = request.getfixturevalue("postgres_server")

    def make() -> str:
        if server is None:
            # A not-yet-existing sub-folder: make_engine must create it.
            return sqlite_url(tmp_path / f"state{len(created)}" / "greenserve.db")
        name = server.create_database()
        created.append(name)
        return server.url(name)

    yield make
    if server is not None:
        for name in created:
            server.drop_database(name)


@pytest.fixture
def db_url(db_url_factory: Callable[[], str]) -> str:
    """URL of a fresh, empty database on the test's backend (sqlite file or postgres database)."""
    return db_url_factory()


@pytest.fixture
def open_db() -> Iterator[Callable[..., Database]]:
    """``open_db(url, service, **kw)``: Database.open, closed again at the end of the test."""
    opened: list[Database] = []

    def _open(url: str, service: str, **kwargs) -> Database:
        db = Database.open(url, service, **kwargs)
        opened.append(db)
        return db

    yield _open
    for db in opened:
        db.close()
