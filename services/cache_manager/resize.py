"""Applying a target L1 size to one LMCache server (GreenCache §5.5: shrink evicts lowest scores first).

LMCache 0.5.6 fixes the DRAM L1 size at start (`--l1-size-gb`); it has no runtime resize for DRAM (only
Device-DAX arenas). A size change is therefore a controlled restart done by an operator-supplied command
(`--lmcache-restart-command`, a template with {server_id}, {url}, {l1_size_bytes}, {l1_size_gb}) that must
restart the server with the new size and return 0 once it is healthy again. Without that command a
resize to a different size fails with that reason and the previous size stays in force.

Order of a shrink: (1) choose the pool index's first entries in the eviction order in force (the adaptive
policy's leader, adaptive.py: lowest LCS score, or least recently accessed) until the indexed bytes fit the
target, (2) delete them on the server (`DELETE /cache/objects`), (3) restart at the new size. A grow only
restarts and records that the new space starts cold (warm-up). Idempotency by plan version is the
caller's job (service.py records every (server, plan version) outcome in cache_applications).

The step is journaled (``RestartJournal``: journal.begin_resize) before anything changes on the server (the
evictions of a shrink, then the restart command, which stops the old server): the sizes, the plan version and the
L2 quotas to put back; then the command's pid. The command
runs in a session of its own: a signal to the cache-manager's process group (a terminal's Ctrl-C, a kill of the
group) does not cut it halfway, and a cache-manager killed meanwhile leaves it to finish; the restarted one finds
the step and waits for it (resize_recovery.py). A command that times out, or is running when the service stops,
is killed with its process group: the LMCache server it starts must be detached from it (a session of its own,
or a service manager), as the test command and ``greenserve up``'s are.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
from collections.abc import Callable
from dataclasses import dataclass

from greenserve.common.cache_index.index import CacheIndex
from greenserve.cache_manager.lmcache_admin import GIB, LmcacheAdmin, LmcacheError


@dataclass(frozen=True)
class ResizeOutcome:
    """Result of one resize."""

    applied: bool
    detail: str
    dram_bytes: int
    evicted_entries: int
    evicted_keys: tuple[str, ...] = ()  # entries dropped from the index (the caller journals them)


@dataclass(frozen=True)
class RestartJournal:
    """Where a resize journals its restart step (journal.begin_resize, journal.note_restart)."""

    begin: Callable[[int, dict[str, int]], None]  # (previous L1 bytes, L2 quotas) before the command runs
    running: Callable[[int, int | None], None]  # (the command's pid, its start ticks) once it runs


def start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat field 22); None when it is gone,
    a zombie, or the platform has no /proc. With the pid it names one process, whatever pid reuse happens."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":
        return None
    return int(fields[19])


def restart_argv(restart_command: str, server_id: str, url: str, target_bytes: int) -> list[str]:
    """The restart command template filled in and split; ValueError saying why when it is not a valid template."""
    try:
        cmd = restart_command.format(server_id=server_id, url=url, l1_size_bytes=target_bytes,
                                     l1_size_gb=f"{target_bytes / GIB:.6g}")
        return shlex.split(cmd)  # ValueError on an unclosed quote
    except (KeyError, IndexError, ValueError) as exc:  # e.g. a literal { } not doubled in the template
        raise ValueError(f"--lmcache-restart-command is not a valid template ({type(exc).__name__}: {exc}; "
                         "literal braces must be doubled, quotes closed)") from None


def kill_group(pid: int) -> None:
    """SIGKILL to the process group led by `pid` (a restart command in its own session); gone already: nothing."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def run_restart(argv: list[str], timeout_s: float,
                      running: Callable[[int, int | None], None] | None = None) -> str:
    """Runs a restart command in a session of its own; "" once it exits 0, else why not. It is killed with its
    process group when it outlives `timeout_s` (it must not restart the server later) or when the caller is
    cancelled (the service stops: no child left behind)."""
    try:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        return f"restart command failed to run: {exc!r}"
    try:
        if running is not None:
            running(proc.pid, start_ticks(proc.pid))
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:
        kill_group(proc.pid)
        await proc.wait()
        return f"restart command failed to run: timed out after {timeout_s:g} s"
    except BaseException:
        kill_group(proc.pid)
        await asyncio.shield(proc.wait())
        raise
    if proc.returncode != 0:
        return f"restart command exited {proc.returncode}: {out.decode(errors='replace').strip()[-300:]}"
    return ""


def victims_to_fit(index: CacheIndex, target_bytes: int, now_s: float, order: str | None = None) -> list[str]:
    """Keys of the first entries in the index's eviction order (leaves first) to drop so that the indexed
    bytes are <= target_bytes. ``order`` ("lcs" / "lru") overrides the index's order for this choice."""
    excess = index.bytes_in_use - target_bytes
    if excess <= 0:
        return []
    if order is not None and order != index.order:
        kept = index.order
        index.set_order(order)
        try:
            return victims_to_fit(index, target_bytes, now_s)
        finally:
            index.set_order(kept)
    keys: list[str] = []
    batch = 256
    chosen: set[int] = set()
    while excess > 0:
        slots = index.choose_victims(min(len(index), len(chosen) + batch), now_s)
        fresh = [int(s) for s in slots if int(s) not in chosen]
        if not fresh:
            break
        for s in fresh:
            chosen.add(s)
            keys.append(index.key_of(s))
            excess -= int(index.size_bytes[s])
            if excess <= 0:
                break
    return keys


RESTART_TIMEOUT_S = 120.0  # longest a restart command may run


async def resize_server(admin: LmcacheAdmin, server_id: str, index: CacheIndex | None, target_bytes: int,
                        now_s: float, restart_command: str | None, timeout_s: float = RESTART_TIMEOUT_S,
                        journal: RestartJournal | None = None) -> ResizeOutcome:
    """Apply target_bytes as the server's L1 size; on failure the previous size stays and detail says why.
    With `journal`, the restart step is journaled before the restart command runs (module docstring)."""
    try:
        state = await admin.state()
    except LmcacheError as exc:
        return ResizeOutcome(False, f"cannot read the server's state: {exc}", 0, 0)
    current = state.l1_total_bytes
    if current == target_bytes:
        return ResizeOutcome(True, "size already in force", current, 0)
    if not restart_command:
        return ResizeOutcome(False, (
            "LMCache 0.5.6 cannot change the DRAM L1 size at run time (only Device-DAX arenas are "
            "reconfigurable) and no --lmcache-restart-command is configured for a controlled restart; "
            f"the previous size {current} bytes stays in force"), current, 0)
    # LMCache keeps L2 quotas in memory only (QuotaManager): a restart forgets them, and an IsolatedLRU L2 then
    # empties every salt without a quota at its next cycle. Read them now, put them back after the restart.
    quotas: dict[str, int] = {}
    if state.l2_adapters:
        try:
            quotas = {salt: int(round(float(q.get("limit_gb", 0.0)) * GIB))
                      for salt, q in (await admin.quotas()).items()}
        except LmcacheError as exc:
            return ResizeOutcome(False, f"cannot read the L2 quotas to keep across the restart: {exc}; previous "
                                 f"size {current} bytes stays in force", current, 0)
    try:
        argv = restart_argv(restart_command, server_id, admin.url, target_bytes)
    except ValueError as exc:
        return ResizeOutcome(False, f"{exc}; previous size {current} bytes stays in force", current, 0)
    if journal is not None:  # before anything changes on the server: a kill from here on leaves the step
        journal.begin(current, quotas)
    evicted = deleted = 0
    removed: tuple[str, ...] = ()
    if target_bytes < current and index is not None:
        keys = victims_to_fit(index, target_bytes, now_s)
        try:
            deleted, _ = await admin.delete_objects(keys, tier="all")
        except LmcacheError as exc:
            return ResizeOutcome(False, f"evicting {len(keys)} entries ({index.order.upper()} order) failed: {exc}; "
                                 f"previous size {current} bytes stays in force", current, 0)
        for k in keys:
            index.remove(k)
        evicted, removed = len(keys), tuple(keys)
    error = await run_restart(argv, timeout_s, None if journal is None else journal.running)
    if error:
        return ResizeOutcome(False, f"{error}; previous size {current} bytes stays in force", current, evicted,
                             removed)
    try:
        after = await admin.state()
    except LmcacheError as exc:
        return ResizeOutcome(False, f"server not answering after restart: {exc}", current, evicted, removed)
    if after.l1_total_bytes != target_bytes:
        return ResizeOutcome(False, f"after restart L1 is {after.l1_total_bytes} bytes, not {target_bytes}",
                             after.l1_total_bytes, evicted, removed)
    restored = ""
    if quotas:
        try:
            for salt, limit in quotas.items():
                await admin.set_quota(salt, limit)
        except LmcacheError as exc:
            return ResizeOutcome(False, f"L1 resized by restart, but re-applying the L2 quotas it forgot failed: "
                                 f"{exc}", after.l1_total_bytes, evicted, removed)
        restored = f"; re-applied {len(quotas)} L2 quota(s) the restart forgot"
    kind = "shrunk" if target_bytes < current else "grown (new space starts cold: warm-up)"
    order_name = "lowest-LCS" if index is None or index.order == "lcs" else "least-recently-used"
    return ResizeOutcome(True, f"L1 {kind} from {current} to {target_bytes} bytes by controlled restart; "
                         f"{evicted} {order_name} entries evicted first (LMCache deleted {deleted} objects)"
                         f"{restored}",
                         target_bytes, evicted, removed)
