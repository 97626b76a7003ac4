"""A throw-away PostgreSQL cluster in a temporary directory, for tests and benchmarks.

Started from the installed server binaries (``initdb``/``pg_ctl``, Debian's ``postgresql`` package:
``bash scripts/install-postgres.sh``), listening on a free loopback port with password (SCRAM)
authentication; ``create_database`` gives each user a fresh database. ``pg_bindir()`` is None when the
binaries are missing (callers skip, or fall back to SQLite, saying so). When run as root the server runs
as the ``postgres`` system user (initdb refuses root).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg

INSTALL_HINT = "install them with `bash scripts/install-postgres.sh` (Debian package `postgresql`)"
PG_OS_USER = "postgres"  # the server runs as this user when the tests run as root
PG_DB_USER = "greenserve"  # database superuser created by initdb


def pg_bindir() -> Path | None:
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
                check=False,  # the exit status is checked below, with the server log in the error
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

    def halt(self, timeout_s: float = 60) -> None:
        """Stop the server (fast shutdown: open sessions are cut), keeping its data and port for ``resume``.

        What ``pg_ctl stop -m fast`` does (SIGINT to the postmaster, wait for its pid file to go), without a child
        process: a process full of gRPC threads that forks can lose the child to a signal before its exec."""
        pid_file = self.data / "postmaster.pid"
        pid = int(pid_file.read_text().splitlines()[0])
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + timeout_s
        while pid_file.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL (pid {pid}) still running {timeout_s:g} s after a fast shutdown")
            time.sleep(0.02)

    def resume(self) -> None:
        """Start the halted server again on the same port (clients reconnect to the same URL)."""
        try:
            self._cmd(self.bindir / "pg_ctl", "-D", self.data, "-l", self.log, "-o", f"-p {self.port}",
                      "-w", "-t", "60", "start")
        except RuntimeError:
            # pg_ctl lost to a signal after launching the server (see halt): it is up once it takes a connection
            deadline = time.monotonic() + 60
            while True:
                try:
                    with self._admin():
                        return
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._cmd(self.bindir / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop", check=False)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- databases -----------------------------------------------------------------------

    def url(self, dbname: str) -> str:
        return f"postgresql+psycopg://{PG_DB_USER}:{self.password}@127.0.0.1:{self.port}/{dbname}"

    def _admin(self) -> psycopg.Connection:
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
