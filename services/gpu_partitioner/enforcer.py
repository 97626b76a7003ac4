"""The gpu-partitioner's part of the plan: MIG layouts of this node's GPUs and the engines on their instances.

`MigEnforcer.reconcile(plan, interval)` is the `reconcile` of the node's `PlanFollower` (component
"gpu-partitioner", instance = the node name). For the interval in force it:

1. takes the ``mig_layouts`` whose GPU is on this node (the others belong to other nodes' partitioners); a layout
   for a GPU of this node that NVML no longer lists (fallen off the bus: the plan's layout names this node, as the
   fleet inventory has it, or this process listed the GPU earlier) is not applied,
   the other GPUs' are, and the outcome is FAILED ("partially applied", naming the GPU), retried by the watchdog;
2. validates every one of them against its GPU's geometry (layout_diff/geometry, the same checks as
   ``ApplyLayout``), every placement's pool and model variant against the fleet inventory, and the serving mode
   of every pool it runs against what its launcher's engines can run, before anything changes: one invalid part
   -> REFUSED naming it, nothing changed;
3. per GPU: drains (router ``Drain`` with wait) the engines on instances to be destroyed and on kept instances
   whose pool/variant changes, stops and deregisters the ones it launched there, applies the layout with the
   journaled apply (`ApplyCoordinator`: a failure midway restores the previous layout -> ROLLED_BACK with the
   reason, and the stopped engines are started again on the restored instances), deregisters whatever the
   router still had on destroyed instances, then starts an engine on every instance whose placement names a
   pool, waits for its health and registers it with the router (``RegisterEngine``). Placements without a pool
   get no engine.

Re-applying the same interval changes nothing. An engine launched earlier that exited on its own is reported
in the next reconcile and started again. Engine ids are stable per instance (node + MIG UUID), so a restarted
partitioner re-registers the same ids. Outcomes: APPLIED (detail: what changed), REFUSED, ROLLED_BACK (a GPU's
apply failed and was undone), FAILED (a drain or the router failed before anything changed, or an engine did
not start: the layout stays applied, the next reconcile retries the engine).

This module holds the reconcile itself (steps 1 and 3); the validation of step 2 is in layout_targets.py, the
engines' start, registration and retirement in instance_engines.py, the router and optimizer calls in
peer_clients.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from greenserve.common.plan_follow import APPLIED, FAILED, REFUSED, ROLLED_BACK, Outcome
from greenserve.gpu_partitioner import layout_diff
from greenserve.gpu_partitioner.apply import (
    DEFAULT_DRAIN_TIMEOUT_S,
    ApplyBusy,
    ApplyCoordinator,
    ApplyPreconditionError,
)
from greenserve.gpu_partitioner.backend import GpuState, MigBackend, MigBackendError
from greenserve.common.engine_launch import EngineProcess, EngineSupervisor
from greenserve.common.mig_geometry import LayoutError, Placement
from greenserve.gpu_partitioner.instance_engines import InstanceEngines
from greenserve.gpu_partitioner.layout_targets import GpuTarget, LayoutTargets, Refusal, Want
from greenserve.gpu_partitioner.peer_clients import FleetPools, RouterEngines
from greenserve.v1 import common_pb2, optimizer_pb2

log = logging.getLogger("greenserve.gpu_partitioner.enforcer")

COMPONENT = "gpu-partitioner"
# severity of an outcome state, to report the worst over the node's GPUs
_SEVERITY = {APPLIED: 0, FAILED: 1, ROLLED_BACK: 2, REFUSED: 3}


class MigEnforcer(LayoutTargets, InstanceEngines):
    """Reconciles this node's MIG layouts and engines with the plan in force (see the module docstring)."""

    def __init__(
        self, *, backend: MigBackend, coordinator: ApplyCoordinator, node: str, fleet: FleetPools,
        router: RouterEngines | None, supervisor: EngineSupervisor | None,
        lmcache_servers: dict[str, str] | None = None,
        drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S, health_timeout_s: float = 600.0,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.backend = backend
        self.coordinator = coordinator
        self.node = node
        self.fleet = fleet
        self.router = router
        self.supervisor = supervisor
        self.lmcache_servers = dict(lmcache_servers or {})
        self.drain_timeout_s = drain_timeout_s
        self.health_timeout_s = health_timeout_s
        self.on_change = on_change
        self.modes: dict[str, common_pb2.ServingModeTarget] = {}  # the interval's serving mode per pool
        self.mode_index: dict[str, int] = {}  # its index in interval.serving_modes (to name it in a refusal)
        self.mode_targets: list[common_pb2.ServingModeTarget] = []  # interval.serving_modes as the plan lists them
        self.whole_gpus: list[GpuState] = []  # this node's GPUs without MIG (or MIG off): DPD decoders run there
        # Every GPU this process has listed on the node: a layout for one that is no longer listed is for a GPU that
        # vanished (fell off the bus), not for another node's.
        self.seen_gpus: set[str] = set()
        self.vanished: set[str] = set()  # the GPUs whose layouts the last reconcile could not apply: gone

    # ---------------------------------------------------------------------------------------------
    # Reconcile
    # ---------------------------------------------------------------------------------------------

    async def reconcile(self, plan: common_pb2.Plan, interval: common_pb2.PlanInterval | None) -> Outcome:
        notes: list[str] = self._crashed_notes()
        if interval is None:
            return Outcome(APPLIED, "; ".join(["the plan has no interval: nothing to do", *notes]))
        self.mode_targets = list(interval.serving_modes)
        self.modes = {t.pool: t for t in interval.serving_modes}
        self.mode_index = {t.pool: k for k, t in enumerate(interval.serving_modes)}
        gpus = {g.uuid: g for g in await asyncio.to_thread(self.backend.list_gpus)}
        self.seen_gpus.update(gpus)
        self.whole_gpus = sorted((g for g in gpus.values() if g.whole), key=lambda g: g.index)
        mine = [(i, layout) for i, layout in enumerate(interval.mig_layouts) if layout.gpu_uuid in gpus]
        # Not listed but this node's: the plan says so (the fleet inventory's node), or this process listed it before
        lost = [layout.gpu_uuid for layout in interval.mig_layouts if layout.gpu_uuid not in gpus
                and ((layout.node and layout.node == self.node) or layout.gpu_uuid in self.seen_gpus)]
        others = len(interval.mig_layouts) - len(mine) - len(lost)
        if others:
            notes.append(f"{others} layout(s) for other nodes' GPUs ignored")
        try:
            targets, lost_now = await self._validate(mine)
        except Refusal as exc:
            return Outcome(REFUSED, "; ".join([f"nothing changed: {exc}", *notes]))
        lost += lost_now
        self.vanished = set(lost)
        state = APPLIED
        details: list[str] = []
        applied = 0
        for target in targets:
            gpu_state, detail = await self._reconcile_gpu(plan.version, target)
            details.append(f"GPU {target.gpu.uuid}: {detail}")
            applied += gpu_state == APPLIED
            if _SEVERITY[gpu_state] > _SEVERITY[state]:
                state = gpu_state
        for uuid in lost:
            # Not a refusal of the plan (REFUSED is final): the GPU may come back, so FAILED, retried with back-off
            # by the watchdog and at once when the GPU is listed again.
            details.append(f"GPU {uuid}: layout refused: the GPU is not on this node any more (NVML no longer lists "
                           "it: fallen off the bus or removed); nothing changed on it, tried again when it is back")
            if _SEVERITY[FAILED] > _SEVERITY[state]:
                state = FAILED
        if lost:
            total = len(targets) + len(lost)
            details.insert(0, f"partially applied: {applied} of {total} GPU layouts of node {self.node}" if applied
                           else f"not applied: 0 of {total} GPU layouts of node {self.node}")
        if not targets and not lost:
            details.append("no MIG layout for this node's GPUs")
        if self.on_change is not None:
            self.on_change()
        return Outcome(state, "; ".join(details + notes))

    async def vanished_back(self) -> bool:
        """Whether a GPU whose layout the last reconcile could not apply (gone) is listed again."""
        if not self.vanished:
            return False
        try:
            listed = {g.uuid for g in await asyncio.to_thread(self.backend.list_gpus)}
        except MigBackendError as exc:
            log.warning("listing the node's GPUs failed: %s", exc)
            return False
        return bool(self.vanished & listed)

    def _crashed_notes(self) -> list[str]:
        if self.supervisor is None:
            return []
        return [f"engine {e.spec.engine_id} on {e.spec.device} had exited (code {e.returncode}); it is restarted "
                "where the plan still wants it" for e in self.supervisor.exited()]
    async def _reconcile_gpu(self, plan_version: int, target: GpuTarget,
                             ) -> tuple[optimizer_pb2.EnforcementState, str]:
        gpu = target.gpu
        lplan = target.plan
        target_set = set(lplan.target)
        owned = self.supervisor.by_mig_uuid() if self.supervisor is not None else {}
        destroyed = [i for i in gpu.instances if i.placement not in target_set]
        # engines of ours to stop before the layout changes: on destroyed GIs, or whose role changes / goes
        retire: list[tuple[Placement, EngineProcess]] = []
        for inst in gpu.instances:
            engine = owned.get(inst.uuid)
            if engine is None:
                continue
            want = target.wants.get(inst.placement)
            if inst.placement not in target_set or want is None or Want(*engine.spec.role) != want \
                    or engine.returncode is not None:
                retire.append((inst.placement, engine))
        changed: list[str] = []
        # --- drain and stop what must go before the GPU is touched ----------------------------------
        to_drain = sorted({e.spec.engine_id for _, e in retire if e.returncode is None})
        if destroyed and self.router is not None:
            try:
                by_mig = await self.router.engines_by_mig_uuid()
            except Exception as exc:  # noqa: BLE001 - nothing changed yet
                if self.coordinator.require_router:
                    return FAILED, f"nothing changed: router unreachable, cannot drain engines: {exc}"
                by_mig = {}
            to_drain = sorted(set(to_drain) | {e for i in destroyed for e in by_mig.get(i.uuid, [])})
        if to_drain:
            if self.router is None:
                if self.coordinator.require_router:
                    return FAILED, "nothing changed: no router to drain the engines on the instances to change"
            else:
                try:
                    busy = await self.router.drain(to_drain, self.drain_timeout_s)
                except Exception as exc:  # noqa: BLE001 - nothing changed yet
                    return FAILED, f"nothing changed: drain failed: {exc}"
                if busy:
                    with contextlib.suppress(Exception):
                        await self.router.undrain(to_drain)
                    return FAILED, (f"nothing changed: drain timed out after {self.drain_timeout_s:g} s; engines "
                                    f"still busy: {', '.join(busy)}")
                changed.append(f"drained {', '.join(to_drain)}")
        for _, engine in retire:
            await self._retire(engine)
            changed.append(f"stopped engine {engine.spec.engine_id}")
        # --- the layout ---------------------------------------------------------------------------
        if lplan.steps:
            try:
                result = await self.coordinator.apply(gpu.uuid, list(lplan.target), [], plan_version=plan_version,
                                                      drain_timeout_s=self.drain_timeout_s)
            except (ApplyBusy, ApplyPreconditionError, LayoutError, MigBackendError) as exc:
                await self._undrain_others(to_drain, retire)
                restarted = await self._restart_retired(gpu.uuid, retire)
                return FAILED, "; ".join([f"layout not applied: {exc}", *restarted])
            if result.state != "succeeded":
                await self._undrain_others(to_drain, retire)
                restarted = await self._restart_retired(gpu.uuid, retire)
                state = ROLLED_BACK if result.state == "rolled_back" else FAILED
                what = "rolled back to the previous layout" if state == ROLLED_BACK else "failed"
                return state, "; ".join([f"apply {result.apply_id} {what}: {result.error}", *restarted])
            creates = sum(1 for s in lplan.steps if s.kind == layout_diff.CREATE)
            destroys = sum(1 for s in lplan.steps if s.kind == layout_diff.DESTROY)
            changed.append(f"layout applied (apply {result.apply_id}: {destroys} GI destroyed, {creates} created, "
                           f"{len(lplan.kept)} kept)")
            # engines somebody else registered on instances that are gone now
            if self.router is not None and destroyed:
                for engine_id in to_drain:
                    if engine_id not in {e.spec.engine_id for _, e in retire}:
                        try:
                            await self.router.deregister(engine_id)
                            changed.append(f"deregistered {engine_id}")
                        except Exception as exc:  # noqa: BLE001 - the layout stands; say so
                            changed.append(f"deregistering {engine_id} failed: {exc}")
            # The optimizer hears of the new layout now, not once the new engines are healthy (a real vLLM engine
            # takes minutes): until then its fleet listed the destroyed instances' engines, URLs included.
            if self.on_change is not None:
                self.on_change()
        # --- engines on the instances the plan gives a pool -----------------------------------------
        after = await asyncio.to_thread(self.backend.gpu, gpu.uuid)
        started, errors = await self._ensure_engines(after, target)
        changed += started
        if errors:
            return FAILED, "; ".join(changed + errors)
        return APPLIED, "; ".join(changed) if changed else "no change"

    async def _undrain_others(self, drained: list[str], retire: list[tuple[Placement, EngineProcess]]) -> None:
        """After a layout change that did not happen: the engines of others drained for it take work again."""
        ours = {e.spec.engine_id for _, e in retire}
        others = [e for e in drained if e not in ours]
        if others and self.router is not None:
            try:
                await self.router.undrain(others)
            except Exception as exc:  # noqa: BLE001 - the outcome stands; the router logs it
                log.warning("undraining %s failed: %s", ", ".join(others), exc)
