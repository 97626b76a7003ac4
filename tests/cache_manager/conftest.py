"""A real `lmcache server` (LMCache 0.5.6, CPU) for the integration tests, from its own virtualenv.

The virtualenv is made by scripts/install-lmcache.sh (.venv-lmcache in the repo, or GREENSERVE_LMCACHE_VENV).
Module-scoped: each start costs a few seconds. Tests that need it skip, saying why, when the venv is absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
LMCACHE_ENV = {**os.environ, "LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1", "LMCACHE_DISABLE_BANNER": "1"}


def lmcache_venv() -> Path:
    return Path(os.environ.get("GREENSERVE_LMCACHE_VENV", REPO / ".venv-lmcache"))


@dataclass
class LmcacheProc:
    http_url: str
    rpc_url: str
    http_port: int
    rpc_port: int
    pidfile: Path
    logfile: Path
    bin: Path
    python: Path

    def restart_command(self) -> str:
        return (f"{sys.executable} {HERE / 'lmcache_restart.py'} {self.pidfile} {self.bin} {self.http_port} "
                f"{self.rpc_port} {self.logfile} {{l1_size_gb}}")

    def status(self) -> dict:
        return httpx.get(self.http_url + "/status", timeout=5).json()

    def populate(self, sequences: int, salt: str = "", seed: int = 0) -> list[dict]:
        out = subprocess.run(
            [str(self.python), str(HERE / "lmcache_populate.py"), "--rpc-url", self.rpc_url,
             "--sequences", str(sequences), "--salt", salt, "--seed", str(seed)],
            capture_output=True, text=True, timeout=120, env=LMCACHE_ENV, check=False)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])["objects"]


def _wait_healthy(url: str, proc: subprocess.Popen, logfile: Path) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"lmcache server exited {proc.returncode}: {logfile.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/healthcheck", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"lmcache server not healthy in 90 s: {logfile.read_text()[-2000:]}")


@contextlib.contextmanager
def running_lmcache_server(work: Path, *extra_args: str) -> Iterator[LmcacheProc]:
    """A `lmcache server` (L1 0.25 GB, LRU) with its log and pidfile in `work`, `extra_args` added to its command
    line (e.g. an `--l2-adapter`), once healthy; skips the test when the LMCache virtualenv is absent. On exit
    it is stopped, and so is the process a controlled restart (lmcache_restart.py) left in the pidfile."""
    venv = lmcache_venv()
    binary = venv / "bin" / "lmcache"
    if not binary.exists():
        pytest.skip(f"LMCache virtualenv not found at {venv}: run scripts/install-lmcache.sh")
    http_port, rpc_port = free_port(), free_port()
    logfile, pidfile = work / "server.log", work / "server.pid"
    proc = subprocess.Popen(
        [str(binary), "server", "--l1-size-gb", "0.25", "--eviction-policy", "LRU", "--http-port", str(http_port),
         "--port", str(rpc_port), "--supported-transfer-mode", "auto", *extra_args],
        stdout=open(logfile, "wb"), stderr=subprocess.STDOUT, env=LMCACHE_ENV, start_new_session=True)
    pidfile.write_text(str(proc.pid))
    url = f"http://127.0.0.1:{http_port}"
    try:
        _wait_healthy(url, proc, logfile)
        yield LmcacheProc(url, f"tcp://127.0.0.1:{rpc_port}", http_port, rpc_port, pidfile, logfile, binary,
                          venv / "bin" / "python")
    finally:
        pid = int(pidfile.read_text())  # a controlled restart may have replaced the process
        for p in {pid, proc.pid}:
            try:
                os.kill(p, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def lmcache_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LmcacheProc]:
    with running_lmcache_server(tmp_path_factory.mktemp("lmcache")) as server:
        yield server
