"""The controlled restart of the local LMCache server that `greenserve up` owns.

LMCache 0.5.6 cannot resize its DRAM (L1) tier at run time, so the cache-manager resizes it by running an
operator-supplied `--lmcache-restart-command` that must restart the server at the new size and exit 0 once it
is healthy again (services/cache_manager/resize.py). Under `greenserve up` the server is a sidecar of the
supervisor, which watches it and stops everything when a sidecar dies: the restart must therefore be done by
the supervisor, not by the command. The two meet in a control folder (DATA_DIR/lmcache-control):

- the command (`python -m greenserve_client.lmcache_control --control-dir D --l1-size-gb G`) writes a request
  file ``request-<id>.json`` and waits for ``response-<id>.json``;
- the supervisor's loop (``LmcacheController.poll``) takes the oldest request, restarts the server on the
  same ports with the new size, waits for its health endpoint, and writes the response (ok, detail).

Files are written to a temporary name and renamed, so neither side ever reads half a file.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from greenserve.common.cli_parser import Parser

REQUEST_PREFIX = "request-"
RESPONSE_PREFIX = "response-"


def _write_atomic(path: Path, payload: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def restart_command(control_dir: Path) -> str:
    """The cache-manager's --lmcache-restart-command template for this control folder."""
    return " ".join([shlex.quote(sys.executable), "-m", "greenserve_client.lmcache_control",
                     "--control-dir", shlex.quote(str(control_dir)), "--l1-size-gb", "{l1_size_gb}"])


class LmcacheController:
    """Supervisor side: serves restart requests with ``restart(l1_size_gb) -> detail`` (raises on failure)."""

    def __init__(self, control_dir: Path, restart: Callable[[float], str]) -> None:
        self.control_dir = control_dir
        self.control_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.control_dir.glob("*.json"):  # requests of a previous run have no waiter any more
            stale.unlink(missing_ok=True)
        self._restart = restart

    def poll(self) -> int:
        """Serves every pending request, oldest first; returns how many were served."""
        requests = sorted(self.control_dir.glob(f"{REQUEST_PREFIX}*.json"), key=lambda p: p.stat().st_mtime_ns)
        for req in requests:
            request_id = req.name[len(REQUEST_PREFIX):-len(".json")]
            try:
                size_gb = float(json.loads(req.read_text())["l1_size_gb"])
                if not math.isfinite(size_gb) or size_gb < 0:
                    raise ValueError(f"l1_size_gb must be a number >= 0, got {size_gb}")
                response = {"ok": True, "detail": self._restart(size_gb)}
            except Exception as exc:  # noqa: BLE001 - the failure goes back to the waiting command
                response = {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}
            req.unlink(missing_ok=True)
            _write_atomic(self.control_dir / f"{RESPONSE_PREFIX}{request_id}.json", response)
        return len(requests)


def request_restart(control_dir: Path, l1_size_gb: float, timeout_s: float) -> tuple[bool, str]:
    """Command side: asks the supervisor for a restart at ``l1_size_gb`` and waits for its answer."""
    if not control_dir.is_dir():
        return False, f"{control_dir} is not a folder: is `greenserve up` running with an LMCache server?"
    request_id = uuid.uuid4().hex
    _write_atomic(control_dir / f"{REQUEST_PREFIX}{request_id}.json", {"l1_size_gb": l1_size_gb})
    response = control_dir / f"{RESPONSE_PREFIX}{request_id}.json"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if response.exists():
            answer = json.loads(response.read_text())
            response.unlink(missing_ok=True)
            return bool(answer.get("ok")), str(answer.get("detail", ""))
        time.sleep(0.1)
    (control_dir / f"{REQUEST_PREFIX}{request_id}.json").unlink(missing_ok=True)
    return False, f"no answer from the supervisor within {timeout_s:g} s"


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m greenserve_client.lmcache_control",
                    description="Ask `greenserve up` to restart its LMCache server at a new L1 size.")
    parser.add_argument("--control-dir", required=True, type=Path)
    parser.add_argument("--l1-size-gb", required=True, type=float)
    parser.add_argument("--timeout-s", type=float, default=110.0)
    ns = parser.parse_args(argv)
    if not math.isfinite(ns.l1_size_gb) or ns.l1_size_gb < 0:
        parser.error("--l1-size-gb: must be a number >= 0 (0: no DRAM tier)")
    ok, detail = request_restart(ns.control_dir, ns.l1_size_gb, ns.timeout_s)
    print(detail, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
