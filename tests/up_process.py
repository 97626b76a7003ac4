"""`greenserve up` (and `greenserve demo`) as a child process: ports for the six services, the start-and-wait
until it reports every service SERVING, and the processes left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from greenserve_client.services import SERVICES
from tests.conftest import free_port

CLI = [sys.executable, "-m", "greenserve_client.cli"]


def service_ports() -> dict[str, int]:
    """A distinct free port per service (by service name)."""
    ports: dict[str, int] = {}
    while len(set(ports.values())) < len(SERVICES):
        ports = {s.name: free_port() for s in SERVICES}
    return ports


def port_flags(ports: dict[str, int], kind: str) -> list[str]:
    """`--<service>-port=N` (kind "port") or `--<service>-addr=127.0.0.1:N` (kind "addr") for every service."""
    return [f"--{s.display}-{kind}={'127.0.0.1:' if kind == 'addr' else ''}{ports[s.name]}" for s in SERVICES]


def start_up(data_dir: Path, ports: dict[str, int], *flags: str,
             ready_within_s: float) -> tuple[subprocess.Popen, list[str]]:
    """`greenserve up --data-dir <data_dir>` with the services on `ports` and `flags`, returned with the lines it
    printed up to and including "all services SERVING". Fails (and kills it) if it exits first or does not
    report within `ready_within_s` (checked between lines)."""
    up = subprocess.Popen([*CLI, "up", "--data-dir", str(data_dir), *port_flags(ports, "port"), *flags],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + ready_within_s
        while time.monotonic() < deadline:
            line = up.stdout.readline()
            assert line or up.poll() is None, f"up exited {up.returncode}: {up.stderr.read()}"
            lines.append(line)
            if "all services SERVING" in line:
                return up, lines
        pytest.fail(f"up did not report SERVING: {lines}")
    except BaseException:
        if up.poll() is None:
            up.kill()
            up.wait()
        raise


def pids_alive(pids: list[int]) -> list[int]:
    """Those of `pids` that are still running (a zombie, dead but not yet reaped by whoever adopted it, is not)."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def engine_pids(data_dir: Path) -> list[str]:
    """PIDs of processes whose command line names this data dir (engines the gpu-partitioner started)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(data_dir) in cmdline and "engine" in cmdline:
                out.append(entry.name)
    return out


def _parents() -> dict[int, int]:
    """Every process's parent pid (from /proc)."""
    parent_of: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent_of[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return parent_of


def children_of(pid: int) -> list[int]:
    """The direct children of `pid`."""
    return [child for child, parent in _parents().items() if parent == pid]


def descendants_of(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, ...)."""
    parent_of = _parents()
    found, frontier = [], [pid]
    while frontier:
        above = frontier.pop()
        kids = [child for child, parent in parent_of.items() if parent == above]
        found += kids
        frontier += kids
    return found


def wait_until_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Waits up to `timeout_s` for `pids` to stop running; those still running then."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and pids_alive(pids):
        time.sleep(0.2)
    return pids_alive(pids)

