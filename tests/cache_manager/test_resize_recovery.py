"""Settling at start an L1 resize a kill cut (resize_recovery.py, the journal's resize steps): finished when the
server came up at the target, restarted again when it did not, rolled back (FAILED, saying why) when the target
cannot be reached, the L2 quotas put back, the restart command of the killed process waited for (or killed past
its timeout), and what the optimizer is told. The servers are the fake ones of test_enforcer.py (an L1 size is a
file, the restart command writes it or fails for the servers named)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from sqlalchemy import select

from greenserve.cache_manager import journal
from greenserve.cache_manager.lmcache_admin import GIB
from greenserve.cache_manager.models import CacheApplication
from greenserve.cache_manager.resize import run_restart, start_ticks
from greenserve.cache_manager.resize_recovery import recover, report_recovered, wait_for_command
from greenserve.common.plan_follow import APPLIED, FAILED, PlanFollower

from tests.cache_manager.test_enforcer import FakeAdmin, Fleet, _plan, _target, fleet  # noqa: F401  (fixture)
from tests.up_process import pids_alive


class QuotaAdmin(FakeAdmin):
    """FakeAdmin that also keeps the L2 quotas set on it (a JSON file per server)."""

    async def set_quota(self, salt: str, quota_bytes: int) -> None:
        path = self.path.with_suffix(".quotas")
        held = json.loads(path.read_text()) if path.exists() else {}
        held[salt] = quota_bytes
        path.write_text(json.dumps(held))


def with_quotas(servers: Fleet) -> None:
    servers.servicer._admin = lambda url: QuotaAdmin(url, servers.state)  # type: ignore[method-assign]


def records(servers: Fleet) -> list[tuple[str, int, str, str]]:
    with servers.db.session(readonly=True) as s:
        return [(r.server_id, r.plan_version, r.state, r.detail) for r in s.scalars(select(CacheApplication))]


async def test_a_step_whose_server_came_up_at_the_target_is_finished_quotas_put_back(fleet) -> None:  # noqa: F811
    with_quotas(fleet)
    journal.begin_resize(fleet.db, "s1", 5, 2 * GIB, GIB, {"": 8 << 20, "tenant-a": 4 << 20})
    (fleet.state / "s1").write_text(str(2 * GIB))  # the restart command finished after the kill
    (settled,) = await recover(fleet.servicer)
    assert settled.finished and settled.dram_bytes == 2 * GIB and settled.plan_version == 5
    assert settled.detail == ("interrupted (service restart) during the controlled restart of s1 from 1.0 GiB to "
                              "2.0 GiB; finished: L1 2.0 GiB in force; 2 L2 quota(s) put back")
    assert fleet.runs() == []  # nothing restarted again
    assert json.loads((fleet.state / "s1.quotas").read_text()) == {"": 8 << 20, "tenant-a": 4 << 20}
    assert records(fleet) == [("s1", 5, "applied", settled.detail)]
    assert journal.unfinished_resizes(fleet.db) == []


async def test_a_step_whose_server_is_down_is_restarted_to_the_target(fleet) -> None:  # noqa: F811
    journal.begin_resize(fleet.db, "s2", 6, 3 * GIB, GIB, {})
    (fleet.state / "s2").unlink()  # killed with the old server stopped and no new one started
    (settled,) = await recover(fleet.servicer)
    assert settled.finished and fleet.size("s2") == 3 * GIB
    assert fleet.runs() == [f"s2:{3 * GIB}"]
    assert "finished: the server was not answering" in settled.detail and "restarted to 3.0 GiB" in settled.detail
    assert journal.unfinished_resizes(fleet.db) == []


async def test_a_step_cut_before_its_restart_ran_is_restarted_to_the_target(fleet) -> None:  # noqa: F811
    journal.begin_resize(fleet.db, "s3", 9, 2 * GIB, GIB, {})  # killed while a shrink evicted: no command ran
    (settled,) = await recover(fleet.servicer)
    assert settled.finished and fleet.size("s3") == 2 * GIB and fleet.runs() == [f"s3:{2 * GIB}"]
    assert "finished: the server was L1 1.0 GiB, restarted to 2.0 GiB" in settled.detail


async def test_an_unreachable_target_is_rolled_back_and_reported_failed(fleet) -> None:  # noqa: F811
    journal.begin_resize(fleet.db, "s1", 7, 4 * GIB, GIB, {})
    (fleet.state / "s1").unlink()
    fleet.fail(f"s1:{4 * GIB}")
    (settled,) = await recover(fleet.servicer)
    assert not settled.finished and fleet.size("s1") == GIB and settled.dram_bytes == GIB
    assert fleet.runs() == [f"s1:{4 * GIB}", f"s1:{GIB}"]
    assert "the target could not be reached: restart command exited 1" in settled.detail
    assert settled.detail.endswith("rolled back: L1 1.0 GiB in force")
    assert records(fleet) == [("s1", 7, "failed", settled.detail)]
    assert journal.unfinished_resizes(fleet.db) == []

    follower = PlanFollower(component="cache-manager", instance="cm", channel=None, reconcile=fleet.enforcer.reconcile)
    follower.plan = _plan(7, _target("chat", 4))
    await report_recovered(follower, fleet.enforcer, [settled])
    report = follower.reporter.last
    assert report is not None and (report.plan_version, report.state, report.detail) == (7, FAILED, settled.detail)
    assert fleet.runs() == [f"s1:{4 * GIB}", f"s1:{GIB}"]  # reported, not retried


async def test_a_finished_step_of_the_plan_in_force_has_the_plan_reconciled_and_said_first(fleet) -> None:  # noqa: F811
    journal.begin_resize(fleet.db, "s1", 8, 2 * GIB, GIB, {})
    (fleet.state / "s1").write_text(str(2 * GIB))  # s1 done before the kill; s2 of the same pool never started
    settled = await recover(fleet.servicer)
    follower = PlanFollower(component="cache-manager", instance="cm", channel=None, reconcile=fleet.enforcer.reconcile)
    follower.plan = _plan(8, _target("chat", 2))
    await report_recovered(follower, fleet.enforcer, settled)
    report = follower.reporter.last
    assert report is not None and (report.plan_version, report.state) == (8, APPLIED)
    assert report.detail.startswith("interrupted (service restart) during the controlled restart of s1 ")
    assert "; pool chat: dram 1.0 GiB -> 2.0 GiB (s1, s2)" in report.detail
    assert fleet.size("s2") == 2 * GIB and fleet.runs() == [f"s2:{2 * GIB}"]
    assert journal.unfinished_resizes(fleet.db) == []  # the reconcile's own steps ended with it too


async def test_the_killed_process_restart_command_is_waited_for_then_killed_past_its_timeout(fleet) -> None:  # noqa: F811
    quick = subprocess.Popen(["sleep", "1"], start_new_session=True)
    try:
        journal.begin_resize(fleet.db, "s1", None, 2 * GIB, GIB, {})
        journal.note_restart(fleet.db, "s1", quick.pid, start_ticks(quick.pid))
        (fleet.state / "s1").write_text(str(2 * GIB))
        started = time.monotonic()
        (settled,) = await recover(fleet.servicer)
        assert time.monotonic() - started >= 0.5  # it waited for the command
        assert f"waited for its restart command (pid {quick.pid}) to end" in settled.detail and settled.finished
        assert records(fleet) == []  # no plan version: nothing to record, the row still goes
        assert journal.unfinished_resizes(fleet.db) == []
    finally:
        quick.kill()
        quick.wait()

    stuck = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        step = journal.ResizeRecord("s1", None, 2 * GIB, GIB, {}, stuck.pid, start_ticks(stuck.pid))
        said = await wait_for_command(step, timeout_s=0.5)
        assert said == f"its restart command (pid {stuck.pid}) still ran after 0.5 s and was killed"
        stuck.wait(5)
        assert not pids_alive([stuck.pid])
        # a pid now naming another process (its start time differs) is not waited for
        assert await wait_for_command(journal.ResizeRecord("s1", None, 0, 0, {}, os.getpid(), 1)) == ""
    finally:
        stuck.kill()
        stuck.wait()


async def test_the_restart_command_runs_in_a_session_of_its_own(tmp_path) -> None:
    out = tmp_path / "sid"
    seen: list[int] = []
    error = await run_restart([sys.executable, "-c", f"import os; open({str(out)!r}, 'w').write(str(os.getsid(0)))"],
                              30, lambda pid, ticks: seen.append(pid))
    assert error == ""
    assert int(out.read_text()) == seen[0] != os.getsid(0)  # its own session, led by itself


def test_a_journaled_step_is_one_row_per_server_replaced_and_ended(tmp_path) -> None:
    from greenserve.cache_manager.models import LmcacheServer
    from greenserve.common.orm_conventions import utcnow
    from greenserve.common.persistence import Database

    db = Database.open(f"sqlite:///{tmp_path / 'cm.db'}", "cache_manager")
    try:
        with db.session() as s:
            s.add(LmcacheServer(id="s1", pool="p", url="http://s1:1", registered_at=utcnow()))
        journal.begin_resize(db, "s1", 3, 2 * GIB, GIB, {"": 5})
        journal.note_restart(db, "s1", 1234, 99)
        journal.begin_resize(db, "s1", 4, 3 * GIB, 2 * GIB, {})  # the next step of that server replaces it
        assert journal.unfinished_resizes(db) == [journal.ResizeRecord("s1", 4, 3 * GIB, 2 * GIB, {}, None, None)]
        journal.end_resize(db, "s1")
        assert journal.unfinished_resizes(db) == []
    finally:
        db.close()
