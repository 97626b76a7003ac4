"""Fault 2 of issue 36 (the cache-manager's part): the cache-manager killed with SIGKILL during the controlled
restart of an LMCache server that applies a plan's new L1 size.

Real processes: the optimizer and the cache-manager each in their own process (each on its SQLite database), a
real LMCache 0.5.6 server (the .venv-lmcache one, with an fs L2 adapter whose quotas a restart forgets) restarted
by the tests' restart command (tests/cache_manager/lmcache_restart.py). Plan v1, stored in the optimizer's
database and activated, doubles the pool's L1 size. The cache-manager journals the step and runs the restart
command; it is killed once the journaled step names the command and the old LMCache server is gone (the restart
window: the server is down, the new one not yet healthy).

What must hold: no APPLIED for v1 while it is down (``plan status`` says APPLYING); the restart command, in a
session of its own, is not cut by the kill; restarted on its database, the cache-manager finds the step, waits for
that command instead of starting a second restart beside it, finds the target size in force, puts the L2 quotas
back, records and reports v1 APPLIED saying what was interrupted, and leaves no journal row. Exactly one LMCache
server runs on the configured ports, and no restart command is left running. Run three times: the restart command
left to finish; killed as well before it started the new server (the restarted cache-manager then restarts the
server to the target itself); and killed with the target then refused by the command (rolled back to the previous
size, reported FAILED naming why, the quotas back all the same).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest
from greenserve.cache_manager.lmcache_admin import gib
from greenserve.common.persistence import Database
from greenserve.optimizer.plan_store import PlanStore
from greenserve.v1 import cache_manager_pb2 as cm_pb
from greenserve.v1 import cache_manager_pb2_grpc as cm_grpc
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc

from tests.cache_manager.conftest import running_lmcache_server
from tests.cache_manager.test_disk_tier import _l2_spec, _restart_command
from tests.conftest import free_port
from tests.faults.test_optimizer_killed import start_optimizer
from tests.plan_peer import interval
from tests.process import start_service_process, stop_process
from tests.up_process import pids_alive

from .conftest import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

APPLYING = optimizer_pb2.ENFORCEMENT_STATE_APPLYING
APPLIED = optimizer_pb2.ENFORCEMENT_STATE_APPLIED
FAILED = optimizer_pb2.ENFORCEMENT_STATE_FAILED
MIB = 1 << 20
QUOTAS = {"": 8 * MIB, "tenant-a": 4 * MIB}  # SetQuota salts -> bytes ("" is LMCache's _default)


def start_cache_manager(data_dir: Path, port: int, optimizer: str, restart_command: str) -> subprocess.Popen:
    return start_service_process(
        "greenserve.cache_manager", "greenserve.v1.CacheManagerService", data_dir, port, env={},
        log_name="cache_manager.log",
        extra_args=[f"--optimizer-addr={optimizer}", "--instance=cm1", f"--lmcache-restart-command={restart_command}",
                    "--log-level=WARNING"])


def steps(data_dir: Path) -> list[tuple[str, int | None, int, int, int | None]]:
    """(server, plan version, target bytes, previous bytes, restart pid) of every journaled resize step."""
    with sqlite3.connect(data_dir / "cache_manager.db") as db:
        return list(db.execute("SELECT server_id, plan_version, target_bytes, previous_bytes, restart_pid "
                               "FROM cache_resize_steps"))


def applications(data_dir: Path) -> list[tuple[str, int, str]]:
    with sqlite3.connect(data_dir / "cache_manager.db") as db:
        return list(db.execute("SELECT server_id, plan_version, state FROM cache_applications"))


def lmcache_servers(http_port: int) -> list[int]:
    """Pids of the `lmcache server` processes started on `http_port` (zombies not counted)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # argv[0] is the lmcache entry point, or the interpreter its #! line names with the entry point next
        if (b"server" in argv and b"--http-port" in argv and any(a.endswith(b"/lmcache") for a in argv[:2])
                and argv[argv.index(b"--http-port") + 1] == str(http_port).encode()):
            found.append(int(entry.name))
    return pids_alive(found)


def restart_commands(pidfile: Path) -> list[int]:
    """Pids of the test's restart commands (lmcache_restart.py) working on `pidfile`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(a.endswith(b"lmcache_restart.py") for a in argv) and str(pidfile).encode() in argv:
                found.append(int(entry.name))
    return pids_alive(found)


async def stop_all(procs: tuple[subprocess.Popen, ...], channels: tuple[grpc.aio.Channel, ...],
                   pidfile: Path) -> None:
    """SIGTERM to the services (SIGKILL past 30 s), the channels closed, and a restart command a failure left
    killed with its group: nothing outlives the test."""
    for proc in procs:
        await stop_process(proc)
    for channel in channels:
        await channel.close()
    for pid in restart_commands(pidfile):
        os.killpg(pid, signal.SIGKILL)


def quotas(url: str) -> dict[str, int]:
    users = httpx.get(url + "/quota", timeout=5).json()["users"]
    return {salt: round(q["limit_gb"] * (1 << 30)) for salt, q in users.items()}


def l1_bytes(url: str) -> int:
    return int(httpx.get(url + "/status", timeout=5).json()["storage_manager"]["l1_manager"]["memory_total_bytes"])


def store_plan(optimizer_dir: Path, pool: str, dram_bytes: int, disk_bytes: int) -> int:
    """Stores (proposed, not active) a one-hour plan sizing `pool`'s L1 and disk tier; its version."""
    now = time.time()
    target = common_pb2.CacheTarget(pool=pool, dram_bytes=dram_bytes, disk_bytes=disk_bytes)
    plan = common_pb2.Plan(intervals=[interval(now - 60, now + 3600, pools=[common_pb2.PoolInterval(pool=pool)],
                                               cache_targets=[target])])
    plan.created_at.FromSeconds(int(now))
    plan.valid_from.FromSeconds(int(now - 60))
    plan.valid_until.FromSeconds(int(now + 3600))
    db = Database.open(f"sqlite:///{optimizer_dir / 'optimizer.db'}", "optimizer")
    try:
        return PlanStore(db).store(plan, activate=False).version
    finally:
        db.close()


async def cache_manager_report(opt: optimizer_pb2_grpc.OptimizerServiceStub, version: int
                               ) -> optimizer_pb2.EnforcementReport | None:
    status = await opt.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest(version=version), timeout=5)
    return next((r for r in status.reports if r.component == "cache-manager"), None)


REFUSING_RESTART = """
import os, sys
flag, size_bytes, *restart = sys.argv[1:]
if os.path.exists(flag) and open(flag).read() == size_bytes:
    print(f"this test's restart command refuses {size_bytes} bytes")
    sys.exit(3)
os.execv(restart[0], restart)
"""


@pytest.mark.parametrize("mode", ["command-finishes", "command-killed-too", "target-unreachable"])
async def test_cache_manager_sigkilled_mid_restart_settles_the_step_on_restart(tmp_path: Path, mode: str) -> None:
    """command-finishes: the restart command runs on after the kill; command-killed-too: it is killed as well,
    before it starts the new server (as a host crash would); target-unreachable: killed too, and the command then
    refuses the target size (the restarted cache-manager rolls back to the previous size and reports FAILED)."""
    work = tmp_path / "lmcache"
    work.mkdir()
    folder = work / "l2"
    folder.mkdir()
    refuse = tmp_path / "refuse"  # holds the L1 size in bytes the restart command then refuses
    wrapper = tmp_path / "restart.py"
    wrapper.write_text(REFUSING_RESTART)
    with running_lmcache_server(work, "--l2-adapter", _l2_spec(folder)) as server:
        restart = f"{sys.executable} {wrapper} {refuse} {{l1_size_bytes}} {_restart_command(server, folder)}"
        opt_port, cm_port = free_port(), free_port()
        optimizer = await asyncio.to_thread(start_optimizer, tmp_path / "opt", opt_port, "127.0.0.1:9")
        cm_dir = tmp_path / "cm"
        cm = await asyncio.to_thread(start_cache_manager, cm_dir, cm_port, f"127.0.0.1:{opt_port}", restart)
        opt_channel = grpc.aio.insecure_channel(f"127.0.0.1:{opt_port}")
        cm_channel = grpc.aio.insecure_channel(f"127.0.0.1:{cm_port}")
        opt = optimizer_pb2_grpc.OptimizerServiceStub(opt_channel)
        stub = cm_grpc.CacheManagerServiceStub(cm_channel)
        try:
            await stub.RegisterCacheServer(cm_pb.RegisterCacheServerRequest(
                server=cm_pb.CacheServer(id="lm1", pool="chat", url=server.http_url)))
            for salt, limit in QUOTAS.items():
                await stub.SetQuota(cm_pb.SetQuotaRequest(server_id="lm1", salt=salt, quota_bytes=limit))
            held = quotas(server.http_url)
            assert held == {"_default": QUOTAS[""], "tenant-a": QUOTAS["tenant-a"]}
            before = l1_bytes(server.http_url)
            target = 2 * before
            old_pid = int(server.pidfile.read_text())
            # the disk tier (the default salt's quota) kept as it is: the quota restored is the recovery's work
            version = await asyncio.to_thread(store_plan, tmp_path / "opt", "chat", target, QUOTAS[""])
            await opt.ActivatePlan(optimizer_pb2.ActivatePlanRequest(version=version))

            # the restart window: the step journaled with its command, the old server gone
            await until(lambda: any(s[4] for s in steps(cm_dir)), 60, "the journaled restart step")
            await until(lambda: not pids_alive([old_pid]), 30, "the old LMCache server to stop")
            cm.send_signal(signal.SIGKILL)
            await asyncio.to_thread(cm.wait, 10)
            (step,) = steps(cm_dir)
            assert step[:4] == ("lm1", version, target, before)
            commands = restart_commands(server.pidfile)
            assert commands, "the kill cut the restart command (it must run on its own)"
            none_started = False
            if mode != "command-finishes":
                os.killpg(commands[0], signal.SIGKILL)
                await until(lambda: not restart_commands(server.pidfile), 10, "the restart command's end")
                # it waits for the old server's end before it starts the new one: none started yet, as a rule
                none_started = lmcache_servers(server.http_port) == []
            if mode == "target-unreachable":
                assert none_started, "the new server started before the restart command was killed"
                refuse.write_text(str(target))
            report = await cache_manager_report(opt, version)
            assert report is not None and report.state == APPLYING, report  # no APPLIED while the step is cut

            # restarted on its database: it settles the step, puts the quotas back and reports
            cm = await asyncio.to_thread(start_cache_manager, cm_dir, cm_port, f"127.0.0.1:{opt_port}", restart)

            async def settled() -> bool:
                report = await cache_manager_report(opt, version)
                return report is not None and report.state != APPLYING

            await until(settled, 180, "a final cache-manager report on the plan", every_s=0.5)
            report = await cache_manager_report(opt, version)
            assert report.detail.startswith(f"interrupted (service restart) during the controlled restart of lm1 "
                                            f"from {gib(before)} to {gib(target)}"), report.detail
            assert "2 L2 quota(s) put back" in report.detail
            status = await opt.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest(version=version))
            if mode == "target-unreachable":
                assert report.state == FAILED, report.detail
                assert ("the target could not be reached: restart command exited 3: this test's restart command "
                        f"refuses {target} bytes") in report.detail
                assert f"rolled back: L1 {gib(before)} in force" in report.detail
                assert not status.fleet_matches_plan
                size, outcome = before, "failed"
            else:
                assert report.state == APPLIED, report.detail
                if mode == "command-finishes":
                    assert "waited for its restart command" in report.detail
                    assert f"finished: L1 {gib(target)} in force" in report.detail
                elif none_started:
                    assert "finished: the server was not answering" in report.detail
                    assert f"restarted to {gib(target)}" in report.detail
                assert f"pool chat: dram {gib(target)} already in force (lm1); disk {gib(QUOTAS[''])} already in " \
                       "force (lm1)" in report.detail
                assert status.fleet_matches_plan and not status.pending_components
                size, outcome = target, "applied"

            assert l1_bytes(server.http_url) == size
            assert quotas(server.http_url) == held
            assert steps(cm_dir) == []
            assert ("lm1", version, outcome) in applications(cm_dir)
            listed = (await stub.ListCacheServers(cm_pb.ListCacheServersRequest(pool="chat"))).servers
            assert listed[0].dram_bytes == size
            servers = lmcache_servers(server.http_port)
            assert servers == [int(server.pidfile.read_text())], servers  # one server, the one the pidfile names
            assert restart_commands(server.pidfile) == []
        finally:
            await stop_all((cm, optimizer), (opt_channel, cm_channel), server.pidfile)
