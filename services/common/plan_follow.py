"""Enforcers follow the plan in force: watch ``WatchPlans``, reconcile the interval that covers now, report back.

Every enforcing component (router, cache-manager, each gpu-partitioner) runs one ``PlanFollower``:

* it subscribes to ``OptimizerService.WatchPlans`` and reconnects with capped exponential backoff; while the
  optimizer is down the last plan stays in force (degraded mode: nothing is undone);
* it calls the component's ``reconcile(plan, interval)`` for a new plan and again whenever the clock
  (``greenserve.common.clock``) enters the plan's next interval; reconciles never overlap;
* it reports every outcome (``applied``, ``failed``, ``rolled back``, ``refused``) with ``ReportEnforcement``;
  reports made while the optimizer is unreachable are kept (the latest per plan) and sent when it is back;
* the plan can be persisted by the component (``save``/``load``) so a restart during an optimizer outage
  still knows what is in force.

A reconcile that raises is reported as ``failed`` with the exception text; it never stops the follower.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from greenserve.common.clock import clock
from greenserve.common.tasks import cancel_and_wait
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc

log = logging.getLogger("greenserve.plan_follow")

APPLYING = optimizer_pb2.ENFORCEMENT_STATE_APPLYING
APPLIED = optimizer_pb2.ENFORCEMENT_STATE_APPLIED
FAILED = optimizer_pb2.ENFORCEMENT_STATE_FAILED
ROLLED_BACK = optimizer_pb2.ENFORCEMENT_STATE_ROLLED_BACK
REFUSED = optimizer_pb2.ENFORCEMENT_STATE_REFUSED

MAX_DETAIL_CHARS = 2000
# Longest real wait between two looks at the clock: a clock that jumps (forward past the boundary the timer waits
# for, or backward into an earlier interval) is seen within it. A look with the interval unchanged costs a lock.
MAX_TIMER_WAIT_S = 1.0


@dataclass(frozen=True)
class Outcome:
    """What a reconcile did: an EnforcementState value and a human-readable detail."""

    state: optimizer_pb2.EnforcementState
    detail: str = ""


def interval_at(plan: common_pb2.Plan, instant_s: float) -> tuple[int, common_pb2.PlanInterval | None]:
    """Index and interval of ``plan`` covering ``instant_s``; past the end, the last one; before it, the first."""
    if not plan.intervals:
        return -1, None
    for i, interval in enumerate(plan.intervals):
        if interval.start.ToSeconds() <= instant_s < interval.end.ToSeconds():
            return i, interval
    if instant_s < plan.intervals[0].start.ToSeconds():
        return 0, plan.intervals[0]
    return len(plan.intervals) - 1, plan.intervals[-1]


def next_boundary_s(plan: common_pb2.Plan, instant_s: float) -> float:
    """The next interval start after ``instant_s`` (inf when none)."""
    later = [iv.start.ToSeconds() for iv in plan.intervals if iv.start.ToSeconds() > instant_s]
    return min(later) if later else math.inf


Reconcile = Callable[[common_pb2.Plan, common_pb2.PlanInterval | None], Awaitable[Outcome]]


class EnforcementReporter:
    """Sends ``ReportEnforcement`` calls in the background; keeps the latest unsent report per plan version."""

    def __init__(self, channel: grpc.aio.Channel | None, component: str, instance: str,
                 backoff_max_s: float = 10.0, max_pending: int = 16) -> None:
        self.stub = None if channel is None else optimizer_pb2_grpc.OptimizerServiceStub(channel)
        self.component = component
        self.instance = instance
        self.backoff_max_s = backoff_max_s
        self.max_pending = max_pending
        self._pending: dict[tuple[int, int], optimizer_pb2.EnforcementReport] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.last: optimizer_pb2.EnforcementReport | None = None

    def start(self) -> None:
        if self.stub is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"{self.component}-reporter")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def report(self, plan_version: int, interval: common_pb2.PlanInterval | None, outcome: Outcome) -> None:
        """Queues a report (replacing an unsent one about the same plan interval)."""
        report = optimizer_pb2.EnforcementReport(
            component=self.component, instance=self.instance, plan_version=plan_version,
            state=outcome.state, detail=outcome.detail[:MAX_DETAIL_CHARS],
        )
        if interval is not None and interval.HasField("start"):
            report.interval_start.CopyFrom(interval.start)
        stamp = Timestamp()
        stamp.FromNanoseconds(int(clock().now_s() * 1e9))
        report.reported_at.CopyFrom(stamp)
        self.last = report
        key = (plan_version, report.interval_start.seconds)
        self._pending.pop(key, None)
        self._pending[key] = report
        while len(self._pending) > self.max_pending:
            self._pending.pop(next(iter(self._pending)))
        self._wake.set()

    async def _run(self) -> None:
        assert self.stub is not None
        backoff = 0.2
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                key, report = next(iter(self._pending.items()))
                try:
                    await self.stub.ReportEnforcement(optimizer_pb2.ReportEnforcementRequest(report=report), timeout=5.0)
                except asyncio.CancelledError:
                    raise
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:  # never deliverable: drop it
                        log.warning("enforcement report refused: %s", exc.details())
                        self._pending.pop(key, None)
                        continue
                    await asyncio.sleep(backoff)
                    backoff = min(self.backoff_max_s, backoff * 2)
                    continue
                backoff = 0.2
                self.sent += 1
                if self._pending.get(key) is report:
                    self._pending.pop(key, None)


class PlanFollower:
    """Follows the plan in force for one component and reconciles it (see the module docstring)."""

    def __init__(
        self,
        *,
        component: str,
        instance: str,
        channel: grpc.aio.Channel | None,
        reconcile: Reconcile,
        save: Callable[[common_pb2.Plan], Awaitable[None]] | None = None,
        load: Callable[[], Awaitable[common_pb2.Plan | None]] | None = None,
        backoff_max_s: float = 10.0,
    ) -> None:
        self.component = component
        self.instance = instance
        self.stub = None if channel is None else optimizer_pb2_grpc.OptimizerServiceStub(channel)
        self.reconcile_fn = reconcile
        self.save = save
        self.load = load
        self.backoff_max_s = backoff_max_s
        self.reporter = EnforcementReporter(channel, component, instance, backoff_max_s)
        self.plan: common_pb2.Plan | None = None
        self.connected = False
        self.last_outcome: Outcome | None = None
        self.reconciled: tuple[int, float] | None = None  # (plan version, interval start) last reconciled
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._watch_generation = 0  # moved on by resubscribe: what the WatchPlans call before still sends is dropped
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def version(self) -> int:
        return 0 if self.plan is None else self.plan.version

    async def start(self) -> None:
        if self.load is not None:
            try:
                stored = await self.load()
            except Exception as exc:  # noqa: BLE001 - a bad stored plan must not stop the service
                log.warning("%s: stored plan unreadable: %s", self.component, exc)
                stored = None
            if stored is not None and stored.version > 0:
                self.plan = stored  # in force already: not re-applied until the clock or a new plan says so
                _, interval = interval_at(stored, clock().now_s())
                self.reconciled = (stored.version, interval.start.ToSeconds() if interval is not None else 0.0)
        self.reporter.start()
        loop = asyncio.get_running_loop()
        if self.stub is not None:
            self._tasks.append(loop.create_task(self._watch(), name=f"{self.component}-plan-watch"))
        self._tasks.append(loop.create_task(self._timer(), name=f"{self.component}-plan-timer"))

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()
        await self.reporter.stop()

    async def offer(self, plan: common_pb2.Plan) -> None:
        """A plan from the watch stream (or a test): put it in force, then reconcile.

        Every plan the optimizer streams is the plan in force, so an older version is a rollback and is taken too;
        only the version already held is ignored."""
        if plan.version == self.version:
            return
        self.plan = plan
        if self.save is not None:
            try:
                await self.save(plan)
            except Exception as exc:  # noqa: BLE001 - persisting is best effort; enforcing is not
                log.warning("%s: could not persist plan v%d: %s", self.component, plan.version, exc)
        await self.reconcile_now()
        self._changed.set()

    def resubscribe(self, plan: common_pb2.Plan) -> None:
        """The component put ``plan`` in force from elsewhere, ahead of the stream (the router: a plan another replica
        stored in the shared database). The follower holds it (its next timed reconcile reports on it) and watches
        again after its version: the plans the current call still has queued were activated before it (a stream
        gives activations in commit order), so they are dropped unread, and a new call starts with the plan in
        force if that is another one (a rollback past it, a newer plan)."""
        self.plan = plan
        self.reconciled = None
        self._watch_generation += 1
        self._changed.set()

    def _drop(self, plan: common_pb2.Plan) -> None:
        """A plan the call before a resubscribe delivered: not applied; reported when older than the plan held (a
        rollback to it comes again as the new call's first plan, and its report then replaces this one)."""
        log.info("%s: plan v%d from the stream dropped: v%d was put in force ahead of the stream; watching again "
                 "after it", self.component, plan.version, self.version)
        if 0 < plan.version < self.version:
            self.reporter.report(plan.version, None, Outcome(
                REFUSED, f"plan v{plan.version} skipped as stale: v{self.version}, newer, was put in force before "
                         "this stream delivered it"))

    async def reconcile_now(self, force: bool = False) -> Outcome | None:
        """Reconciles the interval in force (skipped when that interval of that plan is already done)."""
        async with self._lock:
            plan = self.plan
            if plan is None:
                return None
            _, interval = interval_at(plan, clock().now_s())
            key = (plan.version, interval.start.ToSeconds() if interval is not None else 0.0)
            if not force and key == self.reconciled:
                return self.last_outcome
            self.reporter.report(plan.version, interval, Outcome(APPLYING, "applying"))
            try:
                outcome = await self.reconcile_fn(plan, interval)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # reported, never fatal
                log.exception("%s: reconcile of plan v%d failed", self.component, plan.version)
                outcome = Outcome(FAILED, f"{type(exc).__name__}: {exc}")
            self.reconciled = key
            self.last_outcome = outcome
            self.reporter.report(plan.version, interval, outcome)
            log.info("%s: plan v%d %s: %s", self.component, plan.version,
                     optimizer_pb2.EnforcementState.Name(outcome.state), outcome.detail)
            return outcome

    async def _watch(self) -> None:
        assert self.stub is not None
        backoff = 0.2
        while True:
            generation = self._watch_generation
            try:
                call = self.stub.WatchPlans(optimizer_pb2.WatchPlansRequest(after_version=self.version))
                async for event in call:
                    self.connected = True
                    backoff = 0.2
                    if generation != self._watch_generation:
                        self._drop(event.plan)
                        break
                    await self.offer(event.plan)
                if generation != self._watch_generation:
                    call.cancel()
                    continue  # at once: the stream is up
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                if self.connected:
                    log.warning("%s: plan stream lost (%s); keeping plan v%d", self.component, exc.code().name,
                                self.version)
            except Exception:
                log.exception("%s: plan watch error", self.component)
            self.connected = False
            await asyncio.sleep(backoff)
            backoff = min(self.backoff_max_s, backoff * 2)

    async def _timer(self) -> None:
        """Reconciles again when the clock enters the plan's next interval."""
        while True:
            self._changed.clear()
            plan = self.plan
            c = clock()
            wait_s = MAX_TIMER_WAIT_S
            if plan is not None:
                boundary = next_boundary_s(plan, c.now_s())
                if math.isfinite(boundary):
                    wait_s = min(MAX_TIMER_WAIT_S, c.real_delay_s(boundary - c.now_s()) + 0.001)
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that lands as the event
                # is set (offer() then stop()), and stop() then waited for the next timer round.
                async with asyncio.timeout(wait_s):
                    await self._changed.wait()
                continue
            except TimeoutError:
                pass
            try:
                await self.reconcile_now()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: timed reconcile failed", self.component)


def plan_file_store(path: str | os.PathLike[str]) -> tuple[
    Callable[[common_pb2.Plan], Awaitable[None]], Callable[[], Awaitable[common_pb2.Plan | None]]
]:
    """``save``/``load`` keeping the last plan in one file (written to a unique temp file, fsynced, renamed)."""
    import tempfile
    from pathlib import Path

    target = Path(path)

    def _save(body: bytes) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(body)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _load() -> common_pb2.Plan | None:
        if not target.exists():
            return None
        plan = common_pb2.Plan()
        plan.ParseFromString(target.read_bytes())
        return plan

    async def save(plan: common_pb2.Plan) -> None:
        await asyncio.to_thread(_save, plan.SerializeToString())

    async def load() -> common_pb2.Plan | None:
        return await asyncio.to_thread(_load)

    return save, load
