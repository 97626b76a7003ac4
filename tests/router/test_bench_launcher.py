"""The bench's launcher (services/bench/router_launch.py ``pinned``): with ``--nice`` a started process gets a
session, hence a scheduler autogroup, of its own carrying that nice, so that the nice ranks it against
other sessions' jobs too (issue 22: the router's group lost its CPU to other sessions on the
development VM). Positive nice only: lowering a priority needs no privilege."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from greenserve.bench import router_launch as bench_launch

_PROBE = ("import json, os; a = '/proc/self/autogroup'; "
          "print(json.dumps({'pid': os.getpid(), 'sid': os.getsid(0), 'nice': os.nice(0), "
          "'cpus': sorted(os.sched_getaffinity(0)), "
          "'autogroup': open(a).read() if os.path.exists(a) else None}))")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sessions and autogroups")
def test_nice_gives_the_process_its_own_session_and_autogroup_nice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_launch, "NICE", 3)
    cpu = max(os.sched_getaffinity(0))
    out = subprocess.run(bench_launch.pinned([sys.executable, "-c", _PROBE], [cpu]), capture_output=True, text=True,
                         timeout=30, check=True).stdout
    got = json.loads(out)
    assert got["sid"] == got["pid"] != os.getsid(0)  # a session of its own
    assert got["nice"] == os.nice(0) + 3 and got["cpus"] == [cpu]
    if got["autogroup"] is not None and Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1":
        assert got["autogroup"].strip().endswith("nice 3")


def test_without_nice_the_process_stays_in_the_bench_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_launch, "NICE", 0)
    cmd = bench_launch.pinned([sys.executable, "-c", _PROBE], [min(os.sched_getaffinity(0))])
    got = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout)
    assert got["sid"] == os.getsid(0)
