"""A stopped router bench leaves nothing running: SIGTERM ends it through its ``finally`` blocks (engines,
router and load generators stopped), and on ``kill -9`` the kernel sends each of its processes SIGTERM
(``bench_launch.bench_popen``: PR_SET_PDEATHSIG). Before, either left the engines and the router orphaned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.up_process import children_of, pids_alive, wait_until_gone


def _start_bench_until_loaded() -> tuple[subprocess.Popen, list[int]]:
    """A bench router run (no-op engines, long enough not to end by itself) and its child processes once
    a load generator is running (engines, router and load generator all started)."""
    bench = subprocess.Popen([sys.executable, "-m", "greenserve.bench.router", "--engine", "noop", "--levels", "8",
                              "--protocols", "http", "--no-peer", "--duration-s", "120", "--no-pin",
                              "--throughput-max-tokens", "0"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert bench.poll() is None, f"bench exited {bench.returncode}: {bench.stderr.read()[-2000:]}"
        kids = children_of(bench.pid)
        cmdlines = [Path(f"/proc/{k}/cmdline").read_bytes() for k in kids if Path(f"/proc/{k}/cmdline").exists()]
        if len(kids) >= 4 and any(b"loadgen_entry" in c for c in cmdlines):  # 2 engines, the router, a load process
            return bench, kids
        time.sleep(0.3)
    bench.kill()
    pytest.fail("bench did not reach its load phase")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_stopped_bench_leaves_no_process(sig: int) -> None:
    bench, kids = _start_bench_until_loaded()
    try:
        os.kill(bench.pid, sig)
        bench.wait(timeout=30)
        left = wait_until_gone(kids, 20)
        assert not left, f"outlived the bench ({signal.Signals(sig).name}): {left}"
    finally:
        for pid in pids_alive(kids):
            os.kill(pid, signal.SIGKILL)
        if bench.poll() is None:
            bench.kill()
