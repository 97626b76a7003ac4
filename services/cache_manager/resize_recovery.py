"""Settling an L1 resize a kill cut: the resize step journal (journal.begin_resize) read at start.

A cache-manager killed during a controlled restart leaves a journaled step: target and previous size, the L2
quotas LMCache forgets on a restart, the plan version, the restart command's pid. At start, under the servicer's
resize lock (no RPC and no plan reconcile resizes meanwhile), ``recover`` settles every such step:

1. the restart command the killed process started runs in a session of its own and outlived the kill: it is
   waited for (its pid and start time name it), at most RESTART_TIMEOUT_S, then killed with its process group;
   so no second restart runs beside it and starts a second LMCache server;
2. the server at the target size: finished. Else the restart command runs again to the target; when that does
   not bring the server there, to the previous size (rolled back); when neither, failed, saying both reasons;
3. the L2 quotas are put back (a restart forgot them; putting back quotas still held changes nothing);
4. the outcome is recorded for the step's plan version (cache_applications), then the row goes.

A kill during this leaves the row, and the next start settles it again (each part can be done twice).
``report_recovered`` then tells the optimizer's ``plan status`` the truth for each plan version: a finished step
of the plan in force has the plan reconciled again (the servers not reached before the kill are sized too) and
reported with the recovery said first; a rolled-back or failed one is reported FAILED with why, not retried.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from greenserve.cache_manager import journal
from greenserve.cache_manager.lmcache_admin import LmcacheError, gib
from greenserve.cache_manager.resize import RESTART_TIMEOUT_S, kill_group, restart_argv, run_restart, start_ticks
from greenserve.common.clock import clock
from greenserve.common.plan_follow import APPLIED, FAILED, Outcome, PlanFollower, interval_at

if TYPE_CHECKING:
    from greenserve.cache_manager.enforcer import CacheEnforcer
    from greenserve.cache_manager.models import LmcacheServer
    from greenserve.cache_manager.service import CacheManagerServicer

log = logging.getLogger("greenserve.cache_manager")
POLL_S = 0.2


@dataclass(frozen=True)
class Settled:
    """How one cut resize step ended."""

    server_id: str
    plan_version: int | None
    finished: bool  # at the target size with its quotas back; else rolled back or failed
    dram_bytes: int  # the L1 size now (0: unknown)
    detail: str


def command_alive(pid: int | None, ticks: int | None) -> bool:
    """The journaled restart command is still running (the same process: its start time matches)."""
    if pid is None:
        return False
    now = start_ticks(pid)
    return now is not None and (ticks is None or now == ticks)


async def wait_for_command(step: journal.ResizeRecord, timeout_s: float = RESTART_TIMEOUT_S) -> str:
    """Waits for the cut step's restart command to end; past `timeout_s` kills its group. What happened, or ""."""
    if not command_alive(step.restart_pid, step.restart_start_ticks):
        return ""
    deadline = time.monotonic() + timeout_s
    while command_alive(step.restart_pid, step.restart_start_ticks):
        if time.monotonic() > deadline:
            kill_group(step.restart_pid)  # type: ignore[arg-type]
            return f"its restart command (pid {step.restart_pid}) still ran after {timeout_s:g} s and was killed"
        await asyncio.sleep(POLL_S)
    return f"waited for its restart command (pid {step.restart_pid}) to end"


async def _l1_bytes(servicer: CacheManagerServicer, row: LmcacheServer) -> tuple[int | None, str]:
    admin = servicer._admin(row.url)
    try:
        return (await admin.state()).l1_total_bytes, ""
    except LmcacheError as exc:
        return None, str(exc)
    finally:
        await admin.aclose()


async def _restart_to(servicer: CacheManagerServicer, row: LmcacheServer, size_bytes: int) -> str:
    """Runs the restart command to `size_bytes` (its pid journaled); "" once the server holds that size."""
    command = servicer.settings.lmcache_restart_command
    if not command:
        return "no --lmcache-restart-command is configured"
    try:
        argv = restart_argv(command, row.id, row.url, size_bytes)
    except ValueError as exc:
        return str(exc)
    db = servicer.ctx.db
    error = await run_restart(argv, RESTART_TIMEOUT_S,
                              lambda pid, ticks: journal.note_restart(db, row.id, pid, ticks))
    if error:
        return error
    now, why = await _l1_bytes(servicer, row)
    if now != size_bytes:
        return f"server not answering after restart: {why}" if now is None else \
            f"after restart L1 is {gib(now)}, not {gib(size_bytes)}"
    return ""


async def _put_back_quotas(servicer: CacheManagerServicer, row: LmcacheServer, quotas: dict[str, int]) -> str:
    admin = servicer._admin(row.url)
    try:
        for salt, limit in quotas.items():
            await admin.set_quota(salt, limit)
    except LmcacheError as exc:
        return f"putting back its {len(quotas)} L2 quota(s) failed: {exc}"
    finally:
        await admin.aclose()
    return ""


async def settle(servicer: CacheManagerServicer, row: LmcacheServer, step: journal.ResizeRecord) -> Settled:
    """Finishes or rolls back one cut step, puts the quotas back, records the outcome, clears the row."""
    said = [f"interrupted (service restart) during the controlled restart of {row.id} from "
            f"{gib(step.previous_bytes)} to {gib(step.target_bytes)}"]
    waited = await wait_for_command(step)
    if waited:
        said.append(waited)
    now, why = await _l1_bytes(servicer, row)
    finished = now == step.target_bytes
    if finished:
        said.append(f"finished: L1 {gib(step.target_bytes)} in force")
    else:
        seen = f"L1 {gib(now)}" if now is not None else f"not answering ({why})"
        error = await _restart_to(servicer, row, step.target_bytes)
        finished = not error
        if finished:
            said.append(f"finished: the server was {seen}, restarted to {gib(step.target_bytes)}")
        else:
            said.append(f"the server was {seen}; the target could not be reached: {error}")
            back = "" if now == step.previous_bytes else await _restart_to(servicer, row, step.previous_bytes)
            if back:
                said.append(f"rolling back to {gib(step.previous_bytes)} failed too: {back}")
            else:
                said.append(f"rolled back: L1 {gib(step.previous_bytes)} in force")
                now = step.previous_bytes
    if finished:
        now = step.target_bytes
    if step.quotas and now is not None:
        error = await _put_back_quotas(servicer, row, step.quotas)
        if error:
            said.append(error)
            finished = False
        else:
            said.append(f"{len(step.quotas)} L2 quota(s) put back")
    detail = "; ".join(said)
    if step.plan_version is not None:
        servicer._record(row.id, step.plan_version, step.target_bytes, None, finished, detail)
    if now is not None:
        servicer.note_server_bytes(row.id, row.pool, now)
    journal.end_resize(servicer.ctx.db, row.id)
    log.warning("resize step settled at start: %s", detail)
    return Settled(row.id, step.plan_version, finished, now or 0, detail)


async def recover(servicer: CacheManagerServicer) -> list[Settled]:
    """Settles every journaled resize step (at start, under the resize lock); one failing does not stop the rest
    (its row stays for the next start)."""
    out: list[Settled] = []
    async with servicer._lock:
        steps = journal.unfinished_resizes(servicer.ctx.db)
        if not steps:
            return out
        rows = {r.id: r for r in servicer._servers()}
        for step in steps:
            try:
                out.append(await settle(servicer, rows[step.server_id], step))
            except asyncio.CancelledError:
                raise
            except Exception:  # a database error, say: the row stays, the next start retries
                log.exception("resize step of %s not settled; kept for the next start", step.server_id)
    return out


async def report_recovered(follower: PlanFollower, enforcer: CacheEnforcer, settled: list[Settled]) -> None:
    """Tells the optimizer the truth about each plan version whose resize a kill cut (module docstring)."""
    by_version: dict[int, list[Settled]] = defaultdict(list)
    for s in settled:
        if s.plan_version is not None:
            by_version[s.plan_version].append(s)
    for version, items in by_version.items():
        note = "; ".join(s.detail for s in items)
        plan = follower.plan
        in_force = plan is not None and plan.version == version
        if in_force and all(s.finished for s in items):
            enforcer.recovered[version] = note
            await follower.reconcile_now(force=True)
            continue
        interval = interval_at(plan, clock().now_s())[1] if in_force else None  # type: ignore[arg-type]
        outcome = Outcome(APPLIED if all(s.finished for s in items) else FAILED, note)
        if in_force:
            follower.last_outcome = outcome
        follower.reporter.report(version, interval, outcome)
