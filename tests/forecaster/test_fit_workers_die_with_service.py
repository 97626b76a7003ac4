"""The forecaster's fit workers die with it: a ``ProcessPoolExecutor``'s workers each hold the pool's call queue
open, so after a ``kill -9`` of the service none of them ever read its end and they (and multiprocessing's
resource tracker) ran on for good. Found in a CI run: the workers of test_crash_consistency's killed forecaster
were still there 40 minutes later. ``FitPool`` now starts its workers with ``parent_death.exit_with_parent``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from tests.up_process import descendants_of, pids_alive, wait_until_gone

_SERVICE = """
import asyncio, sys
import numpy as np
from greenserve.forecaster.fitting import FitPool

async def main():
    pool = FitPool(2)
    out = await asyncio.gather(*(pool.fit("seasonal_naive", np.arange(96.0), 24) for _ in range(4)))
    print("fitted", len(out), flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_fit_workers_die_with_a_killed_forecaster() -> None:
    service = subprocess.Popen([sys.executable, "-c", _SERVICE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    workers: list[int] = []
    try:
        line = service.stdout.readline()
        assert line.startswith("fitted 4"), f"{line!r} {service.stderr.read() if service.poll() is not None else ''}"
        workers = descendants_of(service.pid)
        assert len(workers) >= 2, workers  # two fit workers (and the resource tracker)
        os.kill(service.pid, signal.SIGKILL)
        service.wait(timeout=10)
        left = wait_until_gone(workers, 15)
        assert not left, f"outlived kill -9 of their service: {left}"
    finally:
        for pid in pids_alive(workers):
            os.kill(pid, signal.SIGKILL)
        if service.poll() is None:
            service.kill()
