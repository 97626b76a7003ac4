"""`kill -9` of `greenserve up` leaves nothing running: its services get SIGTERM and its sidecars (emulated engines,
LMCache) SIGKILL from the kernel when it dies (PR_SET_PDEATHSIG, services/common/parent_death.py); the services
then stop what they started themselves (the gpu-partitioner its engines, the router its workers)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from greenserve_client.sidecars import find_lmcache
from tests.up_process import engine_pids, pids_alive, service_ports, start_up


@pytest.mark.slow
def test_kill_9_of_up_leaves_no_process(tmp_path: Path) -> None:
    lmcache = "on" if find_lmcache() is not None else "off"
    up, lines = start_up(tmp_path, service_ports(), "--engines=2", "--engine-time-scale=20", "--router-http-port=0",
                         f"--lmcache={lmcache}", ready_within_s=150)
    pids = [int(row[2]) for row in (line.split() for line in lines) if len(row) > 2 and row[2].isdigit()]
    assert len(pids) >= 8, lines  # six services and two engines (and LMCache when it runs)
    try:
        os.kill(up.pid, signal.SIGKILL)
        up.wait()
        deadline = time.monotonic() + 60  # the services stop gracefully (their grace periods), then check again
        while time.monotonic() < deadline and (pids_alive(pids) or pids_alive([int(p) for p in engine_pids(tmp_path)])):
            time.sleep(0.5)
        assert not pids_alive(pids), f"outlived kill -9 of greenserve up: {pids_alive(pids)}"
        assert not pids_alive([int(p) for p in engine_pids(tmp_path)]), "engines on MIG instances outlived it"
    finally:
        for pid in pids_alive(pids) + pids_alive([int(p) for p in engine_pids(tmp_path)]):
            os.kill(pid, signal.SIGKILL)
