"""Which of a plan interval's MIG layouts this node applies, each validated against its GPU and the fleet
before anything changes (``Refusal`` names the first problem), and what each target instance runs (``Want``).

``LayoutTargets`` is a part of ``MigEnforcer`` (enforcer.py), which sets the attributes it declares.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from greenserve.gpu_partitioner import layout_diff
from greenserve.gpu_partitioner.apply import ApplyCoordinator, ApplyPreconditionError
from greenserve.gpu_partitioner.backend import GpuState, MigBackendError, NotFoundError
from greenserve.common.engine_launch import MODE_NAMES, EngineSupervisor, mode_name
from greenserve.common.mig_geometry import GpuGeometry, LayoutError, Placement
from greenserve.gpu_partitioner.peer_clients import FleetPools
from greenserve.v1 import common_pb2


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
    plan: layout_diff.LayoutPlan
    wants: dict[Placement, Want] = field(default_factory=dict)


class Refusal(Exception):
    """A part of the interval this node cannot apply; nothing was changed."""


class LayoutTargets:
    """The enforcer's validation of an interval's layouts for this node, and the role of each target instance."""

    coordinator: ApplyCoordinator
    node: str
    fleet: FleetPools
    supervisor: EngineSupervisor | None
    lmcache_servers: dict[str, str]
    modes: dict[str, common_pb2.ServingModeTarget]
    mode_index: dict[str, int]
    mode_targets: list[common_pb2.ServingModeTarget]
    whole_gpus: list[GpuState]

    async def _validate(self, mine: list[tuple[int, common_pb2.MigLayout]]) -> tuple[list[GpuTarget], list[str]]:
        """Every layout of this node checked against its GPU and the fleet; Refusal names the first problem. Also
        answers the GPUs that vanished since they were listed (NotFound): their layouts are not targets."""
        pools: dict[str, common_pb2.Pool] | None = None
        if any(p.pool for _, layout in mine for p in layout.placements):
            pools = await self.fleet()
            if pools is None:
                raise Refusal("placements name pools but the fleet inventory is unknown (optimizer unreachable)")
        targets = []
        vanished: list[str] = []
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
            except NotFoundError:
                vanished.append(layout.gpu_uuid)
                continue
            except (ApplyPreconditionError, MigBackendError) as exc:
                raise Refusal(f"{where}: {exc}") from None
            target = GpuTarget(index, gpu, geo, lplan)
            self._assign_wants(target, layout, placed, unplaced)
            targets.append(target)
        self._check_modes(targets, pools or {})
        self._check_pairs(targets)
        return targets, vanished

    def _check_modes(self, targets: list[GpuTarget], pools: dict[str, common_pb2.Pool]) -> None:
        """The serving mode of every pool this node starts engines for is one this release knows, given once, and
        one its launcher's engines can run: Refusal naming ``serving_modes[k]`` (and the field) otherwise, before
        any engine is stopped for a mode change, so the engines of the mode in force keep running."""
        if self.supervisor is None:
            return  # no engines are started here
        used = {want.pool for target in targets for want in target.wants.values()}
        first: dict[str, int] = {}
        for k, mode in enumerate(self.mode_targets):
            if mode.pool not in used:
                continue
            where = f"serving_modes[{k}]"
            if mode.pool in first:
                raise Refusal(f"{where}.pool: pool {mode.pool!r} has two serving modes in the interval "
                              f"(serving_modes[{first[mode.pool]}] too)")
            first[mode.pool] = k
            if mode.serving_mode not in MODE_NAMES:
                known = ", ".join(common_pb2.ServingMode.Name(v) for v in sorted(MODE_NAMES) if v)
                raise Refusal(f"{where}.serving_mode: unknown serving mode {mode.serving_mode} for pool "
                              f"{mode.pool!r} (known: {known})")
            problem = self.supervisor.launcher.mode_problem(mode, pools[mode.pool],
                                                            self.lmcache_servers.get(mode.pool, ""))
            if problem:
                raise Refusal(f"{where}: pool {mode.pool!r} cannot run in mode {mode_name(mode.serving_mode)} "
                              f"({common_pb2.ServingMode.Name(mode.serving_mode)}) on node {self.node}'s "
                              f"{self.supervisor.launcher.name} engines: {problem}; the engines of the mode in "
                              "force keep running")

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
