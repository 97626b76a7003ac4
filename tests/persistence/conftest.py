"""Fixtures for the persistence tests: a SQLite file per test, and a real PostgreSQL server.

The PostgreSQL server is started once per test session from the installed server binaries
(``initdb``/``pg_ctl``, Debian's ``postgresql`` package: ``bash scripts/install-postgres.sh``) in a
temporary data directory, listening on a free loopback port with password (SCRAM) authentication.
Every test gets a fresh database on it. When the binaries are missing the PostgreSQL-parametrised
tests are skipped with a reason saying so; set ``GREENSERVE_REQUIRE_POSTGRES=1`` (CI) to make that
an error instead.

Tests take the ``db_url`` fixture, parametrised over both backends (``[sqlite]``, ``[postgres]``);
the postgres cases carry ``@pytest.mark.postgres``, so ``-m "not postgres"`` runs SQLite only.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from greenserve.common.persistence import Database, sqlite_url

INSTALL_HINT = "install them with `bash scripts/install-postgres.sh` (Debian package `postgresql`)"
PG_OS_USER = "postgres"  # the server runs as this user when the tests run as root
PG_DB_USER = "greenserve"  # database superuser created by initdb


def _pg_bindir() -> Path | None:
    """Directory holding initdb and pg_ctl: $GREENSERVE_PG_BINDIR, Debian's layout, or PATH."""
    candidates: list[Path] = []
    if os.environ.get("GREENSERVE_PG_BINDIR"):
        candidates.append(Path(os.environ["GREENSERVE_PG_BINDIR"]))

    def major(p: Path) -> tuple[int, str]:
        name = p.parent.name
        return (int(name), name) if name.isdigit() else (-1, name)

    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=major, reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for d in candidates:
        if (d / "initdb").is_file() and (d / "pg_ctl").is_file() and os.access(d / "initdb", os.X_OK):
            return d
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """A throw-away PostgreSQL cluster in a temporary directory."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.password = secrets.token_urlsafe(18)
        self.port = 0
        self.root = Path(tempfile.mkdtemp(prefix="greenserve-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sock"
        self.log = self.root / "server.log"
        self.run_as: str | None = None
        self._db_counter = 0
        if os.geteuid() == 0:
            # initdb and postgres refuse to run as root: hand the directory to the postgres user.
            import pwd

            pw = pwd.getpwnam(PG_OS_USER)
            self.run_as = PG_OS_USER
            self.sockets.mkdir()
            for p in (self.root, self.sockets):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        else:
            self.sockets.mkdir()

    # -- process helpers -----------------------------------------------------------------

    def _cmd(self, *args: str | Path, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        kwargs: dict = {}
        env = dict(os.environ, LC_ALL="C", LANG="C")
        if self.run_as is not None:
            import pwd

            pw = pwd.getpwnam(self.run_as)
            kwargs.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
            env["HOME"] = str(self.root)
        # stdout/stderr to a file, not a pipe: pg_ctl's server child must not hold our pipe open.
        with tempfile.TemporaryFile(mode="w+") as out:
            proc = subprocess.run(
                [str(a) for a in args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.root,
                env=env,
                timeout=timeout,
                text=True,
                **kwargs,
            )
            out.seek(0)
            output = out.read()
        result = subprocess.CompletedProcess(proc.args, proc.returncode, output, "")
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(map(str, args))} failed (exit {proc.returncode}):\n{output}\n{self._log_tail()}"
            )
        return result

    def _log_tail(self) -> str:
        try:
            return "server log:\n" + "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
        except OSError:
            return ""

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self.run_as is not None:
            import pwd

            pw = pwd.getpwnam(self.run_as)
            os.chown(pwfile, pw.pw_uid, pw.pw_gid)
        pwfile.chmod(0o600)
        self._cmd(
            self.bindir / "initdb",
            "-D", self.data,
            "-U", PG_DB_USER,
            f"--pwfile={pwfile}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
        )
        pwfile.unlink()
        # Settings go to a file (no shell quoting of paths); the port is given at start.
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# greenserve test server\n"
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.sockets}'\n"
                "max_connections = 200\n"
                "fsync = off\n"  # throw-away cluster; process crashes are still fully covered
                "full_page_writes = off\n"
                "timezone = 'UTC'\n"
            )
        last_error: Exception | None = None
        for _attempt in range(5):
            self.port = _free_port()
            try:
                self._cmd(
                    self.bindir / "pg_ctl", "-D", self.data, "-l", self.log,
                    "-o", f"-p {self.port}", "-w", "-t", "60", "start",
                )
                return
            except RuntimeError as exc:  # port taken between probe and bind: try another
                last_error = exc
                time.sleep(0.2)
        raise RuntimeError(f"could not start PostgreSQL: {last_error}")

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._cmd(self.bindir / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop", check=False)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- databases -----------------------------------------------------------------------

    def url(self, dbname: str) -> str:
        return f"postgresql+psycopg://{PG_DB_USER}:{self.password}@127.0.0.1:{self.port}/{dbname}"

    def _admin(self):
        import psycopg

        return psycopg.connect(
            host="127.0.0.1", port=self.port, user=PG_DB_USER, password=self.password,
            dbname="postgres", autocommit=True, connect_timeout=10,
        )

    def create_database(self, prefix: str = "t") -> str:
        self._db_counter += 1
        name = f"{prefix}_{os.getpid()}_{self._db_counter}"
        with self._admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _unavailable(reason: str) -> None:
    if os.environ.get("GREENSERVE_REQUIRE_POSTGRES", "").strip() not in ("", "0", "false", "no"):
        pytest.fail(f"PostgreSQL required (GREENSERVE_REQUIRE_POSTGRES is set) but {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL tests skipped: {reason}")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bindir = _pg_bindir()
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
