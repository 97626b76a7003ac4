"""The gpu-partitioner's part of the plan: MIG layouts of this node's GPUs and the engines on their instances.

`MigEnforcer.reconcile(plan, interval)` is the `reconcile` of the node's `PlanFollower` (component
"gpu-partitioner", instance = the node name). For the interval in force it:

1. takes the ``mig_layouts`` whose GPU is on this node (the others belong to other nodes' partitioners);
2. validates every one of them against its GPU's geometry (planner/geometry, the same checks as
   ``ApplyLayout``) and every placement's pool and model variant against the fleet inventory, before anything
   changes: one invalid part -> REFUSED naming it, nothing changed;
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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import grpc

from greenserve.common.client import ChannelConfig, create_channel
from greenserve.common.plan_follow import APPLIED, FAILED, REFUSED, ROLLED_BACK, Outcome
from greenserve.gpu_partitioner import planner
from greenserve.gpu_partitioner.apply import (
    DEFAULT_DRAIN_TIMEOUT_S,
    ApplyBusy,
    ApplyCoordinator,
    ApplyPreconditionError,
)
from greenserve.gpu_partitioner.backend import GpuState, InstanceState, MigBackend, MigBackendError, simulator_gpus
from greenserve.gpu_partitioner.engine_launch import (
    EngineProcess,
    EngineSpec,
    EngineStartError,
    EngineSupervisor,
    decoder_id,
    mig_hardware,
    mode_name,
    pd_kv_transfer_params,
)
from greenserve.gpu_partitioner.geometry import GpuGeometry, LayoutError, Placement
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc, router_pb2, router_pb2_grpc

log = logging.getLogger("greenserve.gpu_partitioner.enforcer")

COMPONENT = "gpu-partitioner"
# severity of an outcome state, to report the worst over the node's GPUs
_SEVERITY = {APPLIED: 0, FAILED: 1, ROLLED_BACK: 2, REFUSED: 3}


def engine_id_for(node: str, mig_uuid: str) -> str:
    """Stable id of the engine this node runs on a MIG instance (at most 64 characters, as the router wants)."""
    return f"{node[:40]}-{mig_uuid.removeprefix('MIG-')[:18]}"


class RouterEngines:
    """The router calls of the gpu-partitioner: list, drain/undrain, register and deregister engines. It is the
    enforcer's router and the journaled apply's `RouterLink` (a drained engine is one whose state the router
    reports as DRAINED: draining and nothing in flight)."""

    def __init__(self, config: ChannelConfig) -> None:
        self.config = config
        self._channel: grpc.aio.Channel | None = None

    def _stub(self) -> router_pb2_grpc.RouterServiceStub:
        if self._channel is None:
            self._channel = create_channel(self.config)
        return router_pb2_grpc.RouterServiceStub(self._channel)

    async def engines_by_mig_uuid(self) -> dict[str, list[str]]:
        reply = await self._stub().ListEngines(router_pb2.ListEnginesRequest(), timeout=5.0)
        out: dict[str, list[str]] = {}
        for status in reply.engines:
            if status.engine.mig_uuid:
                out.setdefault(status.engine.mig_uuid, []).append(status.engine.id)
        return out

    async def undrained_engines(self, mig_uuids: Sequence[str]) -> list[tuple[str, str]]:
        """(engine id, MIG UUID) of the engines on these instances the router does not report DRAINED."""
        wanted = set(mig_uuids)
        reply = await self._stub().ListEngines(router_pb2.ListEnginesRequest(), timeout=5.0)
        return sorted((s.engine.id, s.engine.mig_uuid) for s in reply.engines
                      if s.engine.mig_uuid in wanted and s.engine.state != common_pb2.ENGINE_STATE_DRAINED)

    async def drain(self, engine_ids: Sequence[str], timeout_s: float) -> list[str]:
        reply = await self._stub().Drain(router_pb2.DrainRequest(engine_ids=list(engine_ids), wait=True,
                                                                 timeout_s=timeout_s), timeout=timeout_s + 5.0)
        return list(reply.busy_engine_ids)

    async def undrain(self, engine_ids: Sequence[str]) -> None:
        await self._stub().Undrain(router_pb2.UndrainRequest(engine_ids=list(engine_ids)), timeout=10.0)

    async def register(self, engine: common_pb2.Engine) -> None:
        await self._stub().RegisterEngine(router_pb2.RegisterEngineRequest(engine=engine), timeout=10.0)

    async def deregister(self, engine_id: str) -> None:
        """Removes the engine; an engine the router does not know is already gone."""
        try:
            await self._stub().DeregisterEngine(router_pb2.DeregisterEngineRequest(engine_id=engine_id), timeout=10.0)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()


class OptimizerFleet:
    """Pools of the fleet inventory (``GetFleet``), the last good answer kept while the optimizer is down."""

    def __init__(self, channel: grpc.aio.Channel | None) -> None:
        self.stub = None if channel is None else optimizer_pb2_grpc.OptimizerServiceStub(channel)
        self.last: dict[str, common_pb2.Pool] | None = None

    async def pools(self) -> dict[str, common_pb2.Pool] | None:
        if self.stub is not None:
            try:
                reply = await self.stub.GetFleet(optimizer_pb2.GetFleetRequest(), timeout=5.0)
                self.last = {p.name: p for p in reply.fleet.pools}
            except grpc.aio.AioRpcError as exc:
                log.info("GetFleet failed (%s); using the last fleet seen", exc.code().name)
        return self.last


FleetPools = Callable[[], Awaitable[dict[str, common_pb2.Pool] | None]]


@dataclass(frozen=True)
class Want:
    """What the plan runs on one instance."""

    pool: str
    variant: str
    mode: str = "standalone"  # the pool's serving mode in the interval (engine_launch.mode_name)


@dataclass
class GpuTarget:
    """One validated layout of this node."""

    index: int  # in interval.mig_layouts
    gpu: GpuState
    geo: GpuGeometry
    plan: planner.LayoutPlan
    wants: dict[Placement, Want] = field(default_factory=dict)


class Refusal(Exception):
    """A part of the interval this node cannot apply; nothing was changed."""


class MigEnforcer:
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
        self.whole_gpus: list[GpuState] = []  # this node's GPUs without MIG (or MIG off): DPD decoders run there

    # ---------------------------------------------------------------------------------------------
    # Reconcile
    # ---------------------------------------------------------------------------------------------

    async def reconcile(self, plan: common_pb2.Plan, interval: common_pb2.PlanInterval | None) -> Outcome:
        notes: list[str] = self._crashed_notes()
        if interval is None:
            return Outcome(APPLIED, "; ".join(["the plan has no interval: nothing to do", *notes]))
        self.modes = {t.pool: t for t in interval.serving_modes}
        self.mode_index = {t.pool: k for k, t in enumerate(interval.serving_modes)}
        gpus = {g.uuid: g for g in await asyncio.to_thread(self.backend.list_gpus)}
        self.whole_gpus = sorted((g for g in gpus.values() if g.whole), key=lambda g: g.index)
        mine = [(i, layout) for i, layout in enumerate(interval.mig_layouts) if layout.gpu_uuid in gpus]
        others = len(interval.mig_layouts) - len(mine)
        if others:
            notes.append(f"{others} layout(s) for other nodes' GPUs ignored")
        try:
            targets = await self._validate(mine)
        except Refusal as exc:
            return Outcome(REFUSED, "; ".join([f"nothing changed: {exc}", *notes]))
        state = APPLIED
        details: list[str] = []
        for target in targets:
            gpu_state, detail = await self._reconcile_gpu(plan.version, target)
            details.append(f"GPU {target.gpu.uuid}: {detail}")
            if _SEVERITY[gpu_state] > _SEVERITY[state]:
                state = gpu_state
        if not targets:
            details.append("no MIG layout for this node's GPUs")
        if self.on_change is not None:
            self.on_change()
        return Outcome(state, "; ".join(details + notes))

    def _crashed_notes(self) -> list[str]:
        if self.supervisor is None:
            return []
        return [f"engine {e.spec.engine_id} on {e.spec.device} had exited (code {e.returncode}); it is restarted "
                "where the plan still wants it" for e in self.supervisor.exited()]

    async def _validate(self, mine: list[tuple[int, common_pb2.MigLayout]]) -> list[GpuTarget]:
        """Every layout of this node checked against its GPU and the fleet; Refusal names the first problem."""
        pools: dict[str, common_pb2.Pool] | None = None
        if any(p.pool for _, layout in mine for p in layout.placements):
            pools = await self.fleet()
            if pools is None:
                raise Refusal("placements name pools but the fleet inventory is unknown (optimizer unreachable)")
        targets = []
        seen: set[str] = set()
        for index, layout in mine:
            where = f"mig_layouts[{index}]"
            if layout.gpu_uuid in seen:
                raise Refusal(f"{where}: GPU {layout.gpu_uuid} has two layouts in the interval")
            seen.add(layout.gpu_uuid)
            placed: list[Placement] = []
            placed_index: list[int] = []
            unplaced: list[tuple[int, str]] = []
            for j, p in enumerate(layout.placements):
                if not p.profile:
                    raise Refusal(f"{where}.placements[{j}].profile: required")
                if p.pool:
                    assert pools is not None
                    pool = pools.get(p.pool)
                    if pool is None:
                        raise Refusal(f"{where}.placements[{j}].pool: unknown pool {p.pool!r}")
                    if p.model_variant and p.model_variant not in {v.name for v in pool.variants}:
                        raise Refusal(f"{where}.placements[{j}].model_variant: pool {p.pool!r} has no variant "
                                      f"{p.model_variant!r}")
                elif p.model_variant:
                    raise Refusal(f"{where}.placements[{j}].model_variant: set without a pool")
                if p.size == 0:
                    unplaced.append((j, p.profile))
                else:
                    placed.append(Placement(start=p.start, size=p.size, profile=p.profile))
                    placed_index.append(j)
            try:
                gpu, geo, lplan = await self.coordinator.prepare(layout.gpu_uuid, placed, [n for _, n in unplaced])
            except LayoutError as exc:
                at = (f"{where}.placements[{placed_index[exc.index]}]" if 0 <= exc.index < len(placed_index)
                      else f"{where}.placements")
                raise Refusal(f"{at}: {exc}") from None
            except (ApplyPreconditionError, MigBackendError) as exc:
                raise Refusal(f"{where}: {exc}") from None
            target = GpuTarget(index, gpu, geo, lplan)
            self._assign_wants(target, layout, placed, unplaced)
            targets.append(target)
        self._check_pairs(targets)
        return targets

    def _check_pairs(self, targets: list[GpuTarget]) -> None:
        """Every DPD instance of the interval pairs with a whole older GPU of this node (its decoder's): Refusal
        naming ``serving_modes[k].old_hardware`` otherwise, before anything changes."""
        if self.supervisor is None:
            return  # no engines are started here
        need: dict[str, list[str]] = {}  # old hardware -> pools, one entry per DPD instance
        for target in targets:
            for want in target.wants.values():
                if want.mode == "dpd":
                    need.setdefault(self.modes[want.pool].old_hardware, []).append(want.pool)
        for hardware, pools in sorted(need.items()):
            field_name = f"serving_modes[{self.mode_index[pools[0]]}].old_hardware"
            if not hardware:
                raise Refusal(f"{field_name}: pool {pools[0]!r} runs DISAGGREGATED without naming the older GPU "
                              "its decoder runs on")
            have = [g for g in self.whole_gpus if g.hardware == hardware]
            if len(have) < len(pools):
                raise Refusal(f"{field_name}: {len(pools)} DPD instance(s) on node {self.node} (pool "
                              f"{', '.join(sorted(set(pools)))}) each need a whole {hardware} GPU for the decoder (no "
                              f"MIG, or MIG disabled); the node has {len(have)}")

    def _assign_wants(self, target: GpuTarget, layout: common_pb2.MigLayout, placed: list[Placement],
                      unplaced: list[tuple[int, str]]) -> None:
        """Which pool/variant each target GI runs; unplaced placements go to the GIs the planner chose."""
        explicit = [p for p in layout.placements if p.size != 0]
        for placement, p in zip(placed, explicit, strict=True):
            if p.pool:
                target.wants[placement] = Want(p.pool, p.model_variant, self._mode(p.pool))
        extra = sorted((t for t in target.plan.target if t not in set(placed)), key=lambda t: (t.profile, t.start))
        running = self._running_roles(target.gpu)
        for profile in sorted({name for _, name in unplaced}):
            specs = [Want(layout.placements[j].pool, layout.placements[j].model_variant,
                          self._mode(layout.placements[j].pool)) if layout.placements[j].pool
                     else None for j, name in unplaced if name == profile]
            slots = [t for t in extra if t.profile == profile]
            # a GI kept with an engine already in the wanted role keeps it; the rest in order
            for slot in list(slots):
                role = running.get(slot)
                if role is not None and role in specs:
                    specs.remove(role)
                    slots.remove(slot)
                    target.wants[slot] = role
            for slot, spec in zip(slots, specs, strict=False):
                if spec is not None:
                    target.wants[slot] = spec

    def _mode(self, pool: str) -> str:
        target = self.modes.get(pool)
        return mode_name(target.serving_mode) if target is not None else "standalone"

    def _running_roles(self, gpu: GpuState) -> dict[Placement, Want]:
        if self.supervisor is None:
            return {}
        by_mig = self.supervisor.by_mig_uuid()
        out = {}
        for inst in gpu.instances:
            engine = by_mig.get(inst.uuid)
            if engine is not None and engine.returncode is None:
                out[inst.placement] = Want(*engine.spec.role)
        return out

    async def _reconcile_gpu(self, plan_version: int, target: GpuTarget) -> tuple[int, str]:
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
            creates = sum(1 for s in lplan.steps if s.kind == planner.CREATE)
            destroys = sum(1 for s in lplan.steps if s.kind == planner.DESTROY)
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

    async def _retire(self, engine: EngineProcess) -> None:
        """Stops one of our engines and removes it from the router."""
        assert self.supervisor is not None
        await self.supervisor.stop(engine.spec.engine_id)
        await self.supervisor.stop(decoder_id(engine.spec.engine_id))  # a DPD pair's decoder (none: no-op)
        if self.router is not None:
            try:
                await self.router.deregister(engine.spec.engine_id)
            except Exception as exc:  # noqa: BLE001 - the router drops it later as unhealthy
                log.warning("deregistering engine %s failed: %s", engine.spec.engine_id, exc)

    async def _restart_retired(self, gpu_uuid: str, retire: list[tuple[Placement, EngineProcess]]) -> list[str]:
        """After a failed apply: the engines stopped for it, started again on the (restored) instances."""
        if not retire:
            return []
        gpu = await asyncio.to_thread(self.backend.gpu, gpu_uuid)
        geo = await asyncio.to_thread(self.backend.geometry, gpu_uuid)
        by_placement = {i.placement: i for i in gpu.instances}
        notes = []
        for placement, engine in retire:
            inst = by_placement.get(placement)
            if inst is None:
                notes.append(f"engine {engine.spec.engine_id} not restarted: {placement} is not on the GPU")
                continue
            pools = await self.fleet() or {}
            pool = pools.get(engine.spec.pool)
            if pool is None:
                notes.append(f"engine {engine.spec.engine_id} not restarted: pool {engine.spec.pool!r} unknown")
                continue
            try:
                started, decoder = await self._start_engine(gpu, geo, inst, pool, engine.spec.variant)
                await self._ready(started, decoder)
                notes.append(f"engine {started.spec.engine_id} restarted on {inst.uuid}")
            except Exception as exc:  # noqa: BLE001 - reported
                notes.append(f"restarting engine {engine.spec.engine_id} failed: {exc}")
        return notes

    async def _ensure_engines(self, gpu: GpuState, target: GpuTarget) -> tuple[list[str], list[str]]:
        """Starts and registers an engine on every instance the plan gives a pool and that has none running."""
        started: list[str] = []
        errors: list[str] = []
        wanted = [(inst, target.wants[inst.placement]) for inst in gpu.instances if inst.placement in target.wants]
        if not wanted:
            return started, errors
        if self.supervisor is None:
            return [f"{len(wanted)} instance(s) want an engine but --engine-launcher is none"], errors
        pools = await self.fleet() or {}
        geo = await asyncio.to_thread(self.backend.geometry, gpu.uuid)
        owned = self.supervisor.by_mig_uuid()
        launched: list[tuple[InstanceState, EngineProcess]] = []
        launched_decoders: dict[str, EngineProcess] = {}
        for inst, want in wanted:
            engine = owned.get(inst.uuid)
            if engine is not None and engine.returncode is None and Want(*engine.spec.role) == want \
                    and self._pair_alive(engine):
                continue
            if engine is not None:  # exited, or stale: make room for the new one
                await self._retire(engine)
            pool = pools.get(want.pool)
            if pool is None:
                errors.append(f"engine for {inst.uuid}: pool {want.pool!r} unknown")
                continue
            try:
                engine, decoder = await self._start_engine(gpu, geo, inst, pool, want.variant)
                launched.append((inst, engine))
                if decoder is not None:
                    launched_decoders[engine.spec.engine_id] = decoder
            except Exception as exc:  # noqa: BLE001 - reported; the next reconcile tries again
                errors.append(f"engine on {inst.uuid} ({want.pool}/{want.variant or 'default'}) failed: {exc}")
        # all of them load at once (a vLLM engine takes minutes), then each is registered when healthy
        results = await asyncio.gather(*(self._ready(engine, launched_decoders.get(engine.spec.engine_id))
                                         for _, engine in launched), return_exceptions=True)
        for (inst, engine), result in zip(launched, results, strict=True):
            spec = engine.spec
            if isinstance(result, BaseException):
                errors.append(f"engine on {inst.uuid} ({spec.pool}/{spec.variant or 'default'}) failed: {result}")
                continue
            decoder = launched_decoders.get(spec.engine_id)
            notes = [n for n in (engine.command.note, decoder.command.note if decoder is not None else "") if n]
            pair = (f"; DPD decoder on {decoder.spec.hardware} {decoder.spec.gpu_uuid}, {decoder.spec.url}"
                    if decoder is not None else "")
            started.append(f"started engine {spec.engine_id} ({spec.pool}/{spec.variant or 'default'} on "
                           f"{inst.profile} {inst.uuid}, {spec.url}{pair})"
                           + (f" [{'; '.join(notes)}]" if notes else ""))
        return started, errors

    def _pair_alive(self, engine: EngineProcess) -> bool:
        """A DPD pair runs while both its engines do; any other engine while its own process does."""
        if engine.spec.pd_role != "prefill":
            return True
        assert self.supervisor is not None
        decoder = self.supervisor.decoder_of(engine.spec.engine_id)
        return decoder is not None and decoder.returncode is None

    async def _start_engine(self, gpu: GpuState, geo: GpuGeometry, inst: InstanceState, pool: common_pb2.Pool,
                            variant: str) -> tuple[EngineProcess, EngineProcess | None]:
        """Starts the instance's engine, or for DPD the pair: the prefiller on the instance and the decoder on a
        whole older GPU of this node that no other decoder of ours uses (not waited for: see `_ready`)."""
        assert self.supervisor is not None
        spec = self._spec(gpu, geo, inst, pool, variant)
        if spec.mode != "dpd":
            return await self.supervisor.start(spec), None
        busy = {e.spec.gpu_uuid for e in self.supervisor.engines.values()
                if e.spec.pd_role == "decode" and e.returncode is None}
        old = next((g for g in self.whole_gpus if g.hardware == spec.old_hardware and g.uuid not in busy), None)
        if old is None:
            raise EngineStartError(f"no whole {spec.old_hardware or '?'} GPU free on node {self.node} for the DPD "
                                   f"decoder of {spec.engine_id}")
        ports = [spec.port]
        for _ in range(3):  # the decoder's HTTP port, then its NIXL init and alloc ports
            ports.append(self.supervisor.next_port(also_taken=ports))
        spec = dataclasses.replace(spec, pd_role="prefill", pd_peer_host=self.supervisor.host,
                                   pd_init_port=ports[2], pd_alloc_port=ports[3])
        figures = simulator_gpus().get(old.hardware, {})
        decode_spec = dataclasses.replace(
            spec, engine_id=decoder_id(spec.engine_id), pd_role="decode", gpu_uuid=old.uuid, mig_uuid="",
            hardware=old.hardware, port=ports[1], idle_power_w=float(figures.get("idle_w", 0.0)),
            busy_power_w=float(figures.get("tdp_w", 0.0)))
        decoder = await self.supervisor.start(decode_spec)
        try:
            return await self.supervisor.start(spec), decoder
        except BaseException:
            await self.supervisor.stop(decode_spec.engine_id)
            raise

    def _spec(self, gpu: GpuState, geo: GpuGeometry, inst: InstanceState, pool: common_pb2.Pool,
              variant: str) -> EngineSpec:
        assert self.supervisor is not None
        chosen = next((v for v in pool.variants if v.name == variant), None)
        if chosen is None and not variant and pool.variants:
            chosen = pool.variants[0]  # the first variant is the pool's default
        model = chosen.model if chosen is not None and chosen.model else pool.model
        profile = geo.profile(inst.profile) if geo.has_profile(inst.profile) else None
        share = profile.compute_slices / geo.compute_slices if profile is not None and geo.compute_slices else 1.0
        mode = self.modes.get(pool.name)
        draft = pool.draft if pool.HasField("draft") else None
        return EngineSpec(
            serving_mode=mode.serving_mode if mode is not None else 0,
            draft_model=draft.model if draft is not None else "",
            draft_simulator_model=draft.simulator_model if draft is not None else "",
            num_speculative_tokens=(draft.num_speculative_tokens if draft is not None else 0) or 3,
            acceptance_fraction=draft.acceptance_fraction if draft is not None else 0.0,
            old_hardware=mode.old_hardware if mode is not None else "",
            link_bandwidth_bytes_per_s=mode.link_bandwidth_bytes_per_s if mode is not None else 0.0,
            engine_id=engine_id_for(self.node, inst.uuid), pool=pool.name, served_model=pool.model,
            variant=chosen.name if chosen is not None else "", model=model,
            simulator_model=chosen.simulator_model if chosen is not None else "",
            vllm_args=tuple(chosen.vllm_args) if chosen is not None else (), gpu_uuid=gpu.uuid, mig_uuid=inst.uuid,
            hardware=mig_hardware(gpu.model or geo.model, inst.profile), host=self.supervisor.host,
            port=self.supervisor.next_port(), lmcache_url=self.lmcache_servers.get(pool.name, ""),
            idle_power_w=round(geo.sim_idle_power_w * share, 3), busy_power_w=round(geo.max_power_w * share, 3),
        )

    async def _ready(self, engine: EngineProcess, decoder: EngineProcess | None = None) -> None:
        """Waits for a started engine's health (and its DPD decoder's) and registers it: a pair as one engine whose
        ``url`` is the decoder's and ``prefill_url`` the prefiller's, power the two GPUs' (stopped again when any of
        it fails)."""
        assert self.supervisor is not None
        spec = engine.spec
        try:
            await asyncio.gather(*(self.supervisor.wait_healthy(e, self.health_timeout_s)
                                   for e in (engine, decoder) if e is not None))
        except EngineStartError:
            await self.supervisor.stop(spec.engine_id)
            await self.supervisor.stop(decoder_id(spec.engine_id))
            raise
        if self.router is not None:
            message = common_pb2.Engine(
                id=spec.engine_id, url=spec.url, pool=spec.pool, model=spec.served_model, kind=engine.kind,
                gpu_uuid=spec.gpu_uuid, mig_uuid=spec.mig_uuid, idle_power_w=spec.idle_power_w,
                busy_power_w=spec.busy_power_w, hardware=spec.hardware, model_variant=spec.variant)
            if decoder is not None:
                message.url, message.prefill_url = decoder.spec.url, spec.url
                message.prefill_kv_transfer_params = pd_kv_transfer_params(spec)
                message.idle_power_w += decoder.spec.idle_power_w
                message.busy_power_w += decoder.spec.busy_power_w
            try:
                await self.router.register(message)
            except Exception as exc:
                await self.supervisor.stop(spec.engine_id)
                await self.supervisor.stop(decoder_id(spec.engine_id))
                raise RuntimeError(f"registering engine {spec.engine_id} with the router failed: {exc}") from exc
