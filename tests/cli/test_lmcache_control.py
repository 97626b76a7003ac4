"""`greenserve up`'s controlled LMCache restart: the cache-manager's restart command asks the supervisor,
which restarts its own sidecar at the new size on the same ports."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from greenserve.cache_manager.lmcache_admin import LmcacheAdmin
from greenserve.cache_manager.lmcache_admin import GIB
from greenserve.cache_manager.resize import resize_server
from greenserve_client import lmcache_control, sidecars


@contextmanager
def serving(controller: lmcache_control.LmcacheController) -> Iterator[None]:
    """Polls the controller in a thread, as the supervisor's loop does."""
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            controller.poll()
            done.wait(0.05)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)


def controller_with(tmp_path: Path, restart: Callable[[float], str]) -> lmcache_control.LmcacheController:
    return lmcache_control.LmcacheController(tmp_path / "control", restart)


def test_request_is_answered_with_the_supervisors_outcome(tmp_path: Path) -> None:
    sizes: list[float] = []

    def restart(gb: float) -> str:
        sizes.append(gb)
        if gb > 4:
            raise RuntimeError("no room for that")
        return f"restarted at {gb:g} GB"

    controller = controller_with(tmp_path, restart)
    with serving(controller):
        assert lmcache_control.request_restart(controller.control_dir, 2.5, timeout_s=10) == (True, "restarted at 2.5 GB")
        ok, detail = lmcache_control.request_restart(controller.control_dir, 8, timeout_s=10)
    assert not ok and "no room for that" in detail
    assert sizes == [2.5, 8.0]
    assert list(controller.control_dir.iterdir()) == [], "requests and responses are consumed"


def test_no_supervisor_means_a_clear_failure(tmp_path: Path) -> None:
    ok, detail = lmcache_control.request_restart(tmp_path / "absent", 1.0, timeout_s=1)
    assert not ok and "not a folder" in detail
    controller = controller_with(tmp_path, lambda gb: "never")  # folder exists, nobody polls it
    ok, detail = lmcache_control.request_restart(controller.control_dir, 1.0, timeout_s=0.3)
    assert not ok and "no answer" in detail
    assert list(controller.control_dir.iterdir()) == [], "a request nobody answered is withdrawn"


def test_a_bad_request_file_is_refused_without_calling_restart(tmp_path: Path) -> None:
    calls: list[float] = []
    controller = controller_with(tmp_path, lambda gb: calls.append(gb) or "x")
    (controller.control_dir / "request-abc.json").write_text('{"l1_size_gb": -1}')
    (controller.control_dir / "request-def.json").write_text("not json")
    assert controller.poll() == 2
    assert calls == []
    for rid in ("abc", "def"):
        answer = (controller.control_dir / f"response-{rid}.json").read_text()
        assert '"ok": false' in answer


def test_cli_exit_codes(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "greenserve_client.lmcache_control", "--control-dir", str(tmp_path / "none")]
    bad = subprocess.run([*cmd, "--l1-size-gb", "nan"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--l1-size-gb" in bad.stderr
    missing = subprocess.run([*cmd, "--l1-size-gb", "1", "--timeout-s", "1"], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "not a folder" in missing.stderr
    assert "{l1_size_gb}" in lmcache_control.restart_command(tmp_path)


@pytest.mark.slow
def test_cache_manager_resize_restarts_the_supervised_server(tmp_path: Path) -> None:
    """The cache-manager's resize path, with the template `greenserve up` gives it, against a real LMCache."""
    binary = sidecars.find_lmcache()
    if binary is None:
        pytest.skip("no lmcache executable (scripts/install-lmcache.sh installs it)")
    logs = tmp_path / "logs"
    logs.mkdir()
    cars = [sidecars.start_lmcache(binary, l1_size_gb=1, logs=logs)]
    try:
        sidecars.wait_ready(cars, 120)
        first_pid, ports = cars[0].process.pid, cars[0].ports

        def restart(gb: float) -> str:
            fresh, failure = sidecars.restart_lmcache(cars[0], binary, l1_size_gb=gb, previous_gb=1, logs=logs,
                                                      grace_s=10, timeout_s=120)
            cars[0] = fresh
            assert failure is None, failure
            return f"restarted at {gb:g} GB"

        controller = controller_with(tmp_path, restart)
        admin = LmcacheAdmin(cars[0].url)

        async def resize() -> tuple[bool, str, int]:
            out = await resize_server(admin, "local", None, 2 * GIB, now_s=0.0,
                                      restart_command=lmcache_control.restart_command(controller.control_dir))
            state = await admin.state()
            await admin.aclose()
            return out.applied, out.detail, state.l1_total_bytes

        with serving(controller):
            ok, detail, l1_bytes = asyncio.run(resize())
        assert ok, detail
        assert l1_bytes == 2 * GIB
        assert cars[0].process.pid != first_pid and cars[0].ports == ports
        assert cars[0].process.poll() is None
    finally:
        sidecars.stop(cars, 10)
