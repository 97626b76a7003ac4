"""Fault 4 of issue 36 (the cache-manager's part): a plan whose cache target is more than the pool's LMCache server
can take.

Real processes: the optimizer and the cache-manager each in their own process (each on its SQLite database), the
cache-manager following the optimizer's plans, and a real LMCache 0.5.6 server (the .venv-lmcache one, L1
0.25 GiB) whose controlled restart goes through a wrapper that logs each time the cache-manager runs it. Plan v1,
activated in the optimizer, asks for more L1 for the server's pool than the cache-manager may give it: 2 GiB with
``--lmcache-max-dram-bytes`` at 1 GiB (the same on every machine), and, the flag unset, 1 GiB more than this
host's physical memory (the limit then for a server on this host).

What must hold: ``plan status`` shows the cache-manager's REFUSED report for v1 naming the server, the size asked
and the limit (and the flag it comes from), the fleet not matching the plan; the LMCache server keeps its size and
is not restarted (the same pid, the restart command never run); the refusal is final for that plan, not retried per
check: over the next ~10 s the restart command is never run, no resize is recorded and the report is not sent again
(its time in the optimizer's database unchanged). Then plan v2, within the limit (0.5 GiB), is activated and applied
with no operator call: APPLIED, one restart, the server at 0.5 GiB. About 35 s each at load 0.5.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from pathlib import Path

import grpc
import pytest
from greenserve.cache_manager.enforcer import host_memory_bytes
from greenserve.cache_manager.lmcache_admin import gib
from greenserve.v1 import cache_manager_pb2 as cm_pb
from greenserve.v1 import cache_manager_pb2_grpc as cm_grpc
from greenserve.v1 import optimizer_pb2, optimizer_pb2_grpc

from tests.cache_manager.conftest import running_lmcache_server
from tests.conftest import free_port
from tests.faults.test_cache_manager_killed_mid_restart import (
    applications,
    cache_manager_report,
    l1_bytes,
    lmcache_servers,
    restart_commands,
    stop_all,
    store_plan,
)
from tests.faults.test_optimizer_killed import start_optimizer
from tests.process import start_service_process

from .conftest import until
from .partitioner_node import plan_status_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

GIB = 1 << 30
LIMIT_BYTES = GIB  # --lmcache-max-dram-bytes
TOO_LARGE_BYTES = 2 * GIB
WATCH_S = 10.0  # how long the refusal is watched for a retry

REFUSED = optimizer_pb2.ENFORCEMENT_STATE_REFUSED
APPLIED = optimizer_pb2.ENFORCEMENT_STATE_APPLIED

# Logs one line per run of the controlled restart, then runs the real one (the tests' lmcache_restart.py).
COUNTING_RESTART = """
import os, sys
log, *restart = sys.argv[1:]
with open(log, "a") as fh:
    fh.write(" ".join(restart[-1:]) + "\\n")
os.execv(restart[0], restart)
"""


def report_time(optimizer_dir: Path, version: int) -> str | None:
    """When the optimizer last stored the cache-manager's report on plan ``version`` (None: no report yet)."""
    with sqlite3.connect(optimizer_dir / "optimizer.db") as db:
        row = db.execute("SELECT reported_at FROM enforcement_reports WHERE plan_version = ? AND component = ?",
                         (version, "cache-manager")).fetchone()
    return None if row is None else str(row[0])


def restarts(log: Path) -> list[str]:
    """The L1 size (GB) of each controlled restart the cache-manager ran."""
    return log.read_text().split() if log.exists() else []


@pytest.mark.parametrize("limit", ["flag", "host-memory"])
async def test_a_cache_target_over_the_limit_is_refused_once_and_a_fitting_one_then_applies(tmp_path: Path,
                                                                                            limit: str) -> None:
    """flag: --lmcache-max-dram-bytes 1 GiB and a 2 GiB target; host-memory: the flag unset, so the limit of a
    server on this host is the host's physical memory, and the target is 1 GiB more than that."""
    if limit == "flag":
        limit_bytes, too_large_bytes, source = LIMIT_BYTES, TOO_LARGE_BYTES, "--lmcache-max-dram-bytes"
        limit_args = [f"--lmcache-max-dram-bytes={LIMIT_BYTES}"]
    else:
        limit_bytes = host_memory_bytes()
        assert limit_bytes > 0
        too_large_bytes, source = limit_bytes + GIB, "this host's memory (--lmcache-max-dram-bytes is unset)"
        limit_args = []
    work = tmp_path / "lmcache"
    work.mkdir()
    wrapper, restart_log = tmp_path / "restart.py", tmp_path / "restarts.log"
    wrapper.write_text(COUNTING_RESTART)
    with running_lmcache_server(work) as server:
        restart = f"{sys.executable} {wrapper} {restart_log} {server.restart_command()}"
        opt_port, cm_port = free_port(), free_port()
        opt_dir, cm_dir = tmp_path / "opt", tmp_path / "cm"
        optimizer = await asyncio.to_thread(start_optimizer, opt_dir, opt_port, "127.0.0.1:9")
        cm = await asyncio.to_thread(
            start_service_process, "greenserve.cache_manager", "greenserve.v1.CacheManagerService", cm_dir, cm_port,
            env={}, log_name="cache_manager.log",
            extra_args=[f"--optimizer-addr=127.0.0.1:{opt_port}", "--instance=cm1",
                        f"--lmcache-restart-command={restart}", *limit_args, "--log-level=WARNING"])
        opt_channel = grpc.aio.insecure_channel(f"127.0.0.1:{opt_port}")
        cm_channel = grpc.aio.insecure_channel(f"127.0.0.1:{cm_port}")
        opt = optimizer_pb2_grpc.OptimizerServiceStub(opt_channel)
        stub = cm_grpc.CacheManagerServiceStub(cm_channel)
        try:
            await stub.RegisterCacheServer(cm_pb.RegisterCacheServerRequest(
                server=cm_pb.CacheServer(id="lm1", pool="chat", url=server.http_url)))
            before = l1_bytes(server.http_url)
            assert before < limit_bytes
            pid = int(server.pidfile.read_text())

            # v1: more for pool chat than the cache-manager may give a server
            v1 = await asyncio.to_thread(store_plan, opt_dir, "chat", too_large_bytes, 0)
            await opt.ActivatePlan(optimizer_pb2.ActivatePlanRequest(version=v1))

            async def final(version: int) -> bool:
                report = await cache_manager_report(opt, version)
                return report is not None and report.state not in (optimizer_pb2.ENFORCEMENT_STATE_APPLYING,
                                                                    optimizer_pb2.ENFORCEMENT_STATE_UNSPECIFIED)

            await until(lambda: final(v1), 60, "the cache-manager's report on v1", every_s=0.2)
            report = await cache_manager_report(opt, v1)
            assert report.state == REFUSED, report.detail
            assert (f"{gib(too_large_bytes)} is more than server lm1 of pool chat can take ({gib(limit_bytes)}); "
                    f"the limit is {source}") in report.detail, report.detail
            assert report.detail.startswith("plan.intervals[0].cache_targets[0].dram_bytes:"), report.detail
            assert report.detail.endswith("nothing changed"), report.detail
            status = await opt.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest(version=v1))
            assert not status.fleet_matches_plan
            # what an operator sees
            shown = await asyncio.to_thread(plan_status_cli, opt_port)
            assert shown.returncode == 3, shown.stderr  # the fleet does not match the plan
            status_json = json.loads(shown.stdout)
            assert status_json["version"] == v1
            (shown_report,) = status_json["reports"]
            assert shown_report["state"] == "refused", shown_report
            assert f"more than server lm1 of pool chat can take ({gib(limit_bytes)})" in shown_report["detail"], \
                shown_report

            # the server kept: its size, its process; the refusal not retried over WATCH_S
            first_report_at = report_time(opt_dir, v1)
            assert first_report_at is not None
            await asyncio.sleep(WATCH_S)
            assert l1_bytes(server.http_url) == before
            assert int(server.pidfile.read_text()) == pid
            assert lmcache_servers(server.http_port) == [pid]
            assert restarts(restart_log) == []
            assert [a for a in applications(cm_dir) if a[1] == v1] == []
            assert report_time(opt_dir, v1) == first_report_at, "the refusal was reported again"
            assert (await cache_manager_report(opt, v1)).state == REFUSED
            listed = (await stub.ListCacheServers(cm_pb.ListCacheServersRequest(pool="chat"))).servers
            assert [s.dram_bytes for s in listed] == [before]

            # v2 within the limit: applied by the same processes, no operator call
            target = 2 * before
            v2 = await asyncio.to_thread(store_plan, opt_dir, "chat", target, 0)
            await opt.ActivatePlan(optimizer_pb2.ActivatePlanRequest(version=v2))
            await until(lambda: final(v2), 120, "the cache-manager's report on v2", every_s=0.5)
            report = await cache_manager_report(opt, v2)
            assert report.state == APPLIED, report.detail
            assert f"pool chat: dram {gib(before)} -> {gib(target)} (lm1)" in report.detail, report.detail
            status = await opt.GetPlanStatus(optimizer_pb2.GetPlanStatusRequest(version=v2))
            assert status.fleet_matches_plan and not status.pending_components
            assert l1_bytes(server.http_url) == target
            assert len(restarts(restart_log)) == 1, restarts(restart_log)
            new_pid = int(server.pidfile.read_text())
            assert new_pid != pid and lmcache_servers(server.http_port) == [new_pid]
            assert ("lm1", v2, "applied") in applications(cm_dir)
            assert restart_commands(server.pidfile) == []
        finally:
            await stop_all((cm, optimizer), (opt_channel, cm_channel), server.pidfile)
