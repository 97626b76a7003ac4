"""The controlled-restart command of a resize (--lmcache-restart-command) does not outlive its timeout (audit)."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from greenserve.cache_manager.lmcache_admin import LmcacheState
from greenserve.cache_manager.resize import resize_server
from tests.up_process import pids_alive

GIB = 1 << 30


class _Admin:
    """An LMCache admin API that answers its state (the restart command never returns here)."""

    url = "http://127.0.0.1:1"

    async def state(self) -> LmcacheState:
        return LmcacheState(healthy=True, l1_total_bytes=GIB, l1_used_bytes=0, l1_objects=0, eviction_policy="LRU",
                            l2_adapters=0)


async def test_a_restart_command_past_its_timeout_is_stopped(tmp_path: Path) -> None:
    """A restart command still running at its timeout was left running while the resize reported 'previous size
    stays in force': it could still stop and restart the LMCache server afterwards, and the next plan's resize
    started a second one beside it. Now it is killed (and reaped) before the failure is reported."""
    pidfile = tmp_path / "cmd.pid"
    command = f"sh -c {shlex.quote(f'echo $$ > {shlex.quote(str(pidfile))}; exec sleep 60')}"
    outcome = await resize_server(_Admin(), "s1", None, 2 * GIB, 0.0, command, timeout_s=1.0)  # type: ignore[arg-type]
    assert not outcome.applied and "restart command failed to run" in outcome.detail
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while pids_alive([pid]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pids_alive([pid]), f"restart command {pid} outlived its timeout"


async def test_a_restart_command_with_unbalanced_quotes_fails_the_resize_cleanly() -> None:
    """A template with an unclosed quote made shlex.split raise ValueError out of resize_server: ResizeCache and
    ApplyCachePlan answered INTERNAL instead of the failed outcome (previous size in force) a template with bad
    braces gets."""
    outcome = await resize_server(_Admin(), "s1", None, 2 * GIB, 0.0, "restart '{server_id}", timeout_s=1.0)  # type: ignore[arg-type]
    assert not outcome.applied
    assert "--lmcache-restart-command is not a valid" in outcome.detail and "stays in force" in outcome.detail
