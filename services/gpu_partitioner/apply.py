"""Journaled apply of a MIG layout: validate -> drain -> destroy -> create -> verify -> report -> undrain.

Protocol (one GPU at a time):

1. **validate** the target against the GPU's geometry and compute the minimal plan (`layout_diff`);
   a dry run stops here and returns the steps.
2. **journal**: one transaction writes the run (previous layout, target) and every step as ``pending``.
3. **drain**: ask the router (``RouterService.Drain`` with ``wait``) to stop sending work to the engines
   attached to the GIs that will be destroyed and wait, bounded by the drain timeout. Busy engines after
   the timeout abort the apply before anything changed. Then the router is asked again: an engine it
   knows on a GI to destroy that is not drained (registered during the drain, undrained meanwhile) makes
   the apply refuse (``EngineNotDrained``, FAILED_PRECONDITION naming the engine) before anything changed.
4. **destroy**, then **create** each step, marking it ``done`` in the journal after it ran.
5. **verify**: the GPU's layout read back from the backend must equal the target and every GI must have
   its MIG UUID.
6. **report** the new instances with their UUIDs (``CUDA_VISIBLE_DEVICES=MIG-<uuid>``).
7. **undrain** the engines drained in step 3, whatever the outcome.

A failure at any step restores the previous layout: the restore plan is computed from what the device
*really* holds now (not from the journal), so it is correct even when a step half-ran. Journal rows end as
``done``, ``failed`` or ``rolled_back``; none stays ``pending``. A run still ``running`` at start-up was cut
by a crash: `recover` rolls it back (default) or, with the ``resume`` policy and once the drain was
done, finishes it, again from the device's real state. Unlike mig-parted, whose failed apply leaves the
GPU empty, the previous GIs (at their previous placements) are back; their UUIDs are new, since a
re-created GI gets a new UUID, and the record reports them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from greenserve.common.orm_conventions import utcnow
from greenserve.common.persistence import Database
from greenserve.gpu_partitioner import layout_diff
from greenserve.gpu_partitioner.backend import GpuState, MigBackend
from greenserve.gpu_partitioner.energy import EnergyAccountant
from greenserve.common.mig_geometry import GpuGeometry, LayoutError, Placement
from greenserve.gpu_partitioner.models import ApplyJournalEntry, ApplyRun
from greenserve.gpu_partitioner.layout_diff import Step
from sqlalchemy import select

log = logging.getLogger("greenserve.gpu_partitioner.apply")

DEFAULT_DRAIN_TIMEOUT_S = 120.0
RECOVERY_POLICIES = ("rollback", "resume")


class ApplyBusy(Exception):
    """Another apply is running on the same GPU."""


class ApplyPreconditionError(Exception):
    """The GPU is not in a state that allows the apply (no MIG, mode change pending a reset, ...)."""


class EngineNotDrained(ApplyPreconditionError):
    """A GPU instance to destroy still hosts an engine the router knows and has not drained."""


class RouterLink(Protocol):
    """What the apply protocol needs from the router."""

    async def engines_by_mig_uuid(self) -> dict[str, list[str]]:
        """MIG UUID -> ids of the engines the router knows on it."""

    async def drain(self, engine_ids: Sequence[str], timeout_s: float) -> list[str]:
        """Drain and wait up to `timeout_s`; returns the engines still busy."""

    async def undrained_engines(self, mig_uuids: Sequence[str]) -> list[tuple[str, str]]:
        """(engine id, MIG UUID) of the engines the router knows on these instances that are not drained."""

    async def undrain(self, engine_ids: Sequence[str]) -> None:
        """Make the engines eligible again."""


@dataclass
class ApplyResult:
    """What ApplyLayout and GetApply report."""

    apply_id: str
    gpu_uuid: str
    steps: list[Step]
    done_steps: int
    state: str  # "pending" (dry run), "running", "succeeded", "rolled_back", "failed"
    error: str = ""
    instances: list[dict[str, Any]] = field(default_factory=list)
    started_at: datetime | None = None
    ended_at: datetime | None = None
    kept: list[Placement] = field(default_factory=list)


def _instances_json(gpu: GpuState, geo: GpuGeometry | None) -> list[dict[str, Any]]:
    return [
        {"uuid": i.uuid, "profile": i.profile, "start": i.start, "size": i.size, "gpu_instance_id": i.gpu_instance_id,
         "memory_bytes": i.memory_bytes,
         "kubernetes_resource": geo.profile(i.profile).kubernetes_resource if geo and geo.has_profile(i.profile) else "",
         "cuda_visible_devices": i.uuid}
        for i in gpu.instances
    ]


class ApplyCoordinator:
    """Runs applies and start-up recovery against one backend, journaling in the service database."""

    def __init__(
        self, db: Database, backend: MigBackend, router: RouterLink | None, *,
        energy: EnergyAccountant | None = None, recovery_policy: str = "rollback", require_router: bool = True,
    ) -> None:
        if recovery_policy not in RECOVERY_POLICIES:
            raise ValueError(f"recovery_policy must be one of {RECOVERY_POLICIES}, got {recovery_policy!r}")
        self.db = db
        self.backend = backend
        self.router = router
        self.energy = energy
        self.recovery_policy = recovery_policy
        self.require_router = require_router
        self._locks: dict[str, asyncio.Lock] = {}

    # ---------------------------------------------------------------------------------------------
    # Planning
    # ---------------------------------------------------------------------------------------------

    async def prepare(
        self, gpu_uuid: str, placed: Sequence[Placement], unplaced: Sequence[str]
    ) -> tuple[GpuState, GpuGeometry, layout_diff.LayoutPlan]:
        """Validate the target for the GPU and compute the plan (LayoutError on a bad target)."""
        gpu = await asyncio.to_thread(self.backend.gpu, gpu_uuid)
        if not gpu.mig_capable:
            raise ApplyPreconditionError(f"GPU {gpu_uuid} ({gpu.name}) does not support MIG")
        if gpu.mig_pending:
            raise ApplyPreconditionError(f"GPU {gpu_uuid} has a MIG mode change pending a GPU reset")
        geo = await asyncio.to_thread(self.backend.geometry, gpu_uuid)
        driver = self.backend.driver_branch()
        target = layout_diff.resolve_target(geo, placed, unplaced, gpu.layout, driver=driver)
        plan = layout_diff.plan(geo, gpu.layout, target, mig_enabled=gpu.mig_enabled, driver=driver)
        if any(s.kind == layout_diff.ENABLE_MIG for s in plan.steps) and geo.mode_change_needs_reset:
            # A100: the mode change only takes effect after a GPU reset, which this service never triggers on
            # a shared GPU (MIG User Guide, "Enable MIG Mode"). The operator enables MIG (nvidia-smi -i N -mig 1 +
            # reset) first.
            raise ApplyPreconditionError(
                f"MIG mode is disabled on GPU {gpu_uuid} ({geo.model}); enabling it needs a GPU reset: run "
                "`nvidia-smi -i <index> -mig 1` and reset the GPU when it is idle, then apply again")
        return gpu, geo, plan

    # ---------------------------------------------------------------------------------------------
    # Apply
    # ---------------------------------------------------------------------------------------------

    async def apply(
        self, gpu_uuid: str, placed: Sequence[Placement], unplaced: Sequence[str] = (), *,
        plan_version: int | None = None, dry_run: bool = False, drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
    ) -> ApplyResult:
        lock = self._locks.get(gpu_uuid)
        if lock is None:  # a lock only for a GPU the backend has (NotFoundError first): requests cannot grow the dict
            await asyncio.to_thread(self.backend.gpu, gpu_uuid)
            lock = self._locks.setdefault(gpu_uuid, asyncio.Lock())
        if lock.locked():
            raise ApplyBusy(f"an apply is already running on GPU {gpu_uuid}")
        async with lock:
            gpu, geo, plan = await self.prepare(gpu_uuid, placed, unplaced)
            if dry_run:
                return ApplyResult(apply_id="", gpu_uuid=gpu_uuid, steps=list(plan.steps), done_steps=0,
                                   state="pending", kept=list(plan.kept))
            apply_id = str(uuidlib.uuid4())
            now = utcnow()
            with self.db.session() as s:
                s.add(ApplyRun(
                    apply_id=apply_id, gpu_uuid=gpu_uuid, plan_version=plan_version or None, state="running",
                    phase="drain", previous_layout=[p.to_json() for p in gpu.layout],
                    previous_mig_enabled=gpu.mig_enabled, target_layout=[p.to_json() for p in plan.target],
                    drained_engines=[], instances=[], error="", started_at=now, ended_at=None,
                ))
                for index, step in enumerate(plan.steps):
                    s.add(ApplyJournalEntry(apply_id=apply_id, gpu_uuid=gpu_uuid, plan_version=plan_version or None,
                                            step_index=index, step=step.to_json(), state="pending", updated_at=now))
            if not plan.steps:
                self._finish(apply_id, "succeeded", "", gpu, geo)
                return self.get(apply_id)
            await self._run(apply_id, gpu, geo, plan, drain_timeout_s)
            return self.get(apply_id)

    async def _run(self, apply_id: str, gpu: GpuState, geo: GpuGeometry, plan: layout_diff.LayoutPlan, drain_timeout_s: float) -> None:
        gpu_uuid = gpu.uuid
        destroyed = {s.placement for s in plan.steps if s.kind == layout_diff.DESTROY}
        affected = [i.uuid for i in gpu.instances if i.placement in destroyed and i.uuid]
        # --- drain ------------------------------------------------------------------------------
        try:
            engines = await self._engines_on(affected)
            if engines:
                self._set_run(apply_id, drained_engines=engines)
                assert self.router is not None
                busy = await self.router.drain(engines, drain_timeout_s)
                if busy:
                    raise RuntimeError(f"drain timed out after {drain_timeout_s:g}s; engines still busy: {', '.join(busy)}")
            left = await self._undrained_on(affected)
            if left:
                names = ", ".join(f"{engine_id} (on {mig_uuid})" for engine_id, mig_uuid in left)
                raise EngineNotDrained(
                    f"GPU {gpu_uuid}: refusing to destroy GPU instances that host engines registered with the router "
                    f"and not drained: {names}; drain or deregister them first (apply {apply_id} rolled back, "
                    "nothing was changed)")
        except Exception as exc:  # nothing changed on the GPU yet
            self._close_steps(apply_id, failed_index=None, done_state="rolled_back")
            self._set_run(apply_id, state="rolled_back", error=f"drain: {exc}", ended_at=utcnow())
            await self._undrain(apply_id)
            if isinstance(exc, EngineNotDrained):
                raise
            return
        await self._sample_energy(gpu_uuid)
        # --- destroy / create ---------------------------------------------------------------------
        self._set_run(apply_id, phase="steps")
        for index, step in enumerate(plan.steps):
            try:
                await asyncio.to_thread(self._execute, gpu_uuid, step)
            except Exception as exc:  # noqa: BLE001 - any failure here must lead to restore/report, never escape
                log.warning("apply step failed; restoring the previous layout",
                            extra={"apply_id": apply_id, "step": str(step), "error": str(exc)})
                await self._rollback(apply_id, f"step {index} ({step}): {type(exc).__name__}: {exc}", failed_index=index)
                return
            self._mark_step(apply_id, index, "done")
        # --- verify ------------------------------------------------------------------------------
        self._set_run(apply_id, phase="verify")
        try:
            after = await asyncio.to_thread(self.backend.gpu, gpu_uuid)
            self._verify(after, plan.target)
        except Exception as exc:  # noqa: BLE001 - any failure here must lead to restore/report, never escape
            await self._rollback(apply_id, f"verify: {exc}", failed_index=None)
            return
        self._finish(apply_id, "succeeded", "", after, geo)
        await self._undrain(apply_id)

    @staticmethod
    def _verify(gpu: GpuState, target: Sequence[Placement]) -> None:
        if sorted(gpu.layout) != sorted(target):
            raise RuntimeError(f"layout read back {[str(p) for p in gpu.layout]} differs from target {[str(p) for p in target]}")
        missing = [str(i.placement) for i in gpu.instances if not i.uuid]
        if missing:
            raise RuntimeError(f"GPU instances without a MIG device UUID: {', '.join(missing)}")

    def _execute(self, gpu_uuid: str, step: Step) -> None:
        if step.kind == layout_diff.DESTROY:
            assert step.placement is not None
            self.backend.destroy_instance(gpu_uuid, step.placement)
        elif step.kind == layout_diff.CREATE:
            assert step.placement is not None
            self.backend.create_instance(gpu_uuid, step.placement)
        elif step.kind == layout_diff.ENABLE_MIG:
            self.backend.set_mig_mode(gpu_uuid, True)
        elif step.kind == layout_diff.DISABLE_MIG:
            self.backend.set_mig_mode(gpu_uuid, False)
        else:
            raise ValueError(f"unknown step kind {step.kind!r}")

    async def _converge(self, gpu_uuid: str, goal: Sequence[Placement], goal_mig_enabled: bool) -> GpuState:
        """Bring the GPU from whatever it holds now to `goal`; returns the state read back (raises on failure)."""
        now = await asyncio.to_thread(self.backend.gpu, gpu_uuid)
        geo = await asyncio.to_thread(self.backend.geometry, gpu_uuid)
        steps = layout_diff.plan(geo, now.layout, goal, mig_enabled=now.mig_enabled,
                             target_mig_enabled=goal_mig_enabled or bool(goal)).steps
        for step in steps:
            await asyncio.to_thread(self._execute, gpu_uuid, step)
        after = await asyncio.to_thread(self.backend.gpu, gpu_uuid)
        self._verify(after, goal)
        return after

    async def _rollback(self, apply_id: str, error: str, *, failed_index: int | None) -> None:
        run = self._run_row(apply_id)
        self._set_run(apply_id, phase="rollback", error=error)
        previous = [Placement.from_json(p) for p in run["previous_layout"]]
        try:
            after = await self._converge(run["gpu_uuid"], previous, run["previous_mig_enabled"])
        except Exception as exc:  # noqa: BLE001 - any failure here must lead to restore/report, never escape
            log.error("restoring the previous layout failed", extra={"apply_id": apply_id, "error": str(exc)})
            self._close_steps(apply_id, failed_index=failed_index, done_state="failed")
            self._set_run(apply_id, state="failed", error=f"{error}; restoring the previous layout failed: {exc}",
                          ended_at=utcnow())
        else:
            self._close_steps(apply_id, failed_index=failed_index, done_state="rolled_back")
            geo = await asyncio.to_thread(self.backend.geometry, run["gpu_uuid"])
            self._finish(apply_id, "rolled_back", error, after, geo)
        await self._undrain(apply_id)

    # ---------------------------------------------------------------------------------------------
    # Recovery at start-up
    # ---------------------------------------------------------------------------------------------

    async def recover(self) -> list[str]:
        """Finish or roll back every run a crash left ``running``; returns their ids."""
        with self.db.session(readonly=True) as s:
            ids = list(s.scalars(select(ApplyRun.apply_id).where(ApplyRun.state == "running")))
        for apply_id in ids:
            run = self._run_row(apply_id)
            resume = self.recovery_policy == "resume" and run["phase"] in ("steps", "verify")
            goal_json = run["target_layout"] if resume else run["previous_layout"]
            goal = [Placement.from_json(p) for p in goal_json]
            note = "interrupted (service restart); " + ("resumed to the target" if resume else "rolled back")
            try:
                after = await self._converge(run["gpu_uuid"], goal, True if resume else run["previous_mig_enabled"])
            except Exception as exc:  # noqa: BLE001 - any failure here must lead to restore/report, never escape
                if resume:  # could not finish: fall back to the previous layout
                    self._set_run(apply_id, phase="rollback")
                    await self._rollback(apply_id, f"{note} failed: {exc}", failed_index=None)
                    continue
                self._close_steps(apply_id, failed_index=None, done_state="failed")
                self._set_run(apply_id, state="failed", error=f"{note} failed: {exc}", ended_at=utcnow())
                await self._undrain(apply_id)
                continue
            geo = await asyncio.to_thread(self.backend.geometry, run["gpu_uuid"])
            if resume:
                self._close_steps(apply_id, failed_index=None, done_state="done", pending_state="done")
                self._finish(apply_id, "succeeded", note, after, geo)
            else:
                self._close_steps(apply_id, failed_index=None, done_state="rolled_back")
                self._finish(apply_id, "rolled_back", note, after, geo)
            await self._undrain(apply_id)
        return ids

    # ---------------------------------------------------------------------------------------------
    # Router and energy
    # ---------------------------------------------------------------------------------------------

    async def _engines_on(self, mig_uuids: Sequence[str]) -> list[str]:
        if not mig_uuids:
            return []
        if self.router is None:
            if self.require_router:
                raise RuntimeError("no router configured to drain the engines on the GPU instances to destroy")
            return []
        try:
            by_uuid = await self.router.engines_by_mig_uuid()
        except Exception as exc:
            if self.require_router:
                raise RuntimeError(f"router unreachable, cannot drain engines: {exc}") from exc
            log.warning("router unreachable; applying without draining", extra={"error": str(exc)})
            return []
        return sorted({e for u in mig_uuids for e in by_uuid.get(u, [])})

    async def _undrained_on(self, mig_uuids: Sequence[str]) -> list[tuple[str, str]]:
        """Engines the router knows on these instances that are not drained (empty without a router when
        none is required)."""
        if not mig_uuids or self.router is None:
            return []
        try:
            return await self.router.undrained_engines(mig_uuids)
        except Exception as exc:
            if self.require_router:
                raise RuntimeError(f"router unreachable, cannot check that the engines are drained: {exc}") from exc
            log.warning("router unreachable; applying without checking the drain", extra={"error": str(exc)})
            return []

    async def _undrain(self, apply_id: str) -> None:
        engines = self._run_row(apply_id)["drained_engines"]
        if not engines or self.router is None:
            return
        try:
            await self.router.undrain(engines)
        except Exception as exc:  # noqa: BLE001 - the layout outcome stands; say so in the record
            run = self._run_row(apply_id)
            self._set_run(apply_id, error=(run["error"] + "; " if run["error"] else "") + f"undrain failed: {exc}")

    async def _sample_energy(self, gpu_uuid: str) -> None:
        if self.energy is None:
            return
        try:
            gpu = await asyncio.to_thread(self.backend.gpu, gpu_uuid)
            geo = await asyncio.to_thread(self.backend.geometry, gpu_uuid)
            reading = await asyncio.to_thread(self.backend.read_power, gpu_uuid)
            activity = await asyncio.to_thread(self.backend.instance_activity, gpu_uuid)
            self.energy.sample(gpu, geo, reading, activity)
        except Exception as exc:  # noqa: BLE001 - energy accounting never blocks a layout change
            log.warning("energy sample before apply failed", extra={"gpu": gpu_uuid, "error": str(exc)})

    # ---------------------------------------------------------------------------------------------
    # Journal
    # ---------------------------------------------------------------------------------------------

    def _run_row(self, apply_id: str) -> dict[str, Any]:
        with self.db.session(readonly=True) as s:
            run = s.get(ApplyRun, apply_id)
            if run is None:
                raise KeyError(apply_id)
            return {c.name: getattr(run, c.name) for c in ApplyRun.__table__.columns}

    def _set_run(self, apply_id: str, **values: Any) -> None:
        with self.db.session() as s:
            run = s.get(ApplyRun, apply_id)
            assert run is not None
            for key, value in values.items():
                setattr(run, key, value)

    def _mark_step(self, apply_id: str, index: int, state: str) -> None:
        with self.db.session() as s:
            row = s.scalars(select(ApplyJournalEntry).where(
                ApplyJournalEntry.apply_id == apply_id, ApplyJournalEntry.step_index == index)).one()
            row.state = state
            row.updated_at = utcnow()

    def _close_steps(self, apply_id: str, *, failed_index: int | None, done_state: str, pending_state: str = "rolled_back") -> None:
        """End every step row: done -> `done_state`, the failed one -> failed, never-run ones -> `pending_state`."""
        with self.db.session() as s:
            for row in s.scalars(select(ApplyJournalEntry).where(ApplyJournalEntry.apply_id == apply_id)):
                if row.step_index == failed_index:
                    row.state = "failed"
                elif row.state == "done":
                    row.state = done_state
                elif row.state == "pending":
                    row.state = pending_state if done_state != "failed" else "failed"
                row.updated_at = utcnow()

    def _finish(self, apply_id: str, state: str, error: str, gpu: GpuState, geo: GpuGeometry | None) -> None:
        self._set_run(apply_id, state=state, phase="done", error=error, instances=_instances_json(gpu, geo),
                      ended_at=utcnow())

    def get(self, apply_id: str) -> ApplyResult:
        """The record of one apply; KeyError when unknown."""
        with self.db.session(readonly=True) as s:
            run = s.get(ApplyRun, apply_id)
            if run is None:
                raise KeyError(apply_id)
            rows = list(s.scalars(select(ApplyJournalEntry).where(ApplyJournalEntry.apply_id == apply_id)
                                  .order_by(ApplyJournalEntry.step_index)))
            return ApplyResult(
                apply_id=run.apply_id, gpu_uuid=run.gpu_uuid, steps=[Step.from_json(r.step) for r in rows],
                done_steps=sum(1 for r in rows if r.state == "done"), state=run.state, error=run.error,
                instances=list(run.instances), started_at=run.started_at, ended_at=run.ended_at,
            )

    def journal_is_clean(self) -> bool:
        """No run left ``running`` and no step left ``pending``."""
        with self.db.session(readonly=True) as s:
            running = s.scalars(select(ApplyRun).where(ApplyRun.state == "running")).first()
            pending = s.scalars(select(ApplyJournalEntry).where(ApplyJournalEntry.state == "pending")).first()
            return running is None and pending is None


__all__ = ["ApplyBusy", "ApplyCoordinator", "ApplyPreconditionError", "EngineNotDrained", "ApplyResult", "LayoutError", "RouterLink"]
