"""From the fleet to the problems of the variants-on-MIG solver and back: a pool's MIG GPUs with their states in
force, the options of its variants on their slices (a running engine's capability, else the simulator's), BASE's
carbon, one hour's ``Problem``, and the concrete layouts of a solution."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from greenserve.common.mig_geometry import instance_engine_ids
from greenserve.common.mig_geometry import Placement, geometry
from greenserve.optimizer.fleet import GPU_HARDWARE
from greenserve.optimizer.inputs import engine_hardware, guess_simulator_model
from greenserve.optimizer.planning import PlanningInputs
from greenserve.optimizer.solvers import mig_patterns as mp
from greenserve.optimizer.solvers.mig_problem import (DEFAULT_CHANGE_S, Group, Kind, Problem, Solution, State,
                                                     gpu_idle_w, instances_of, none_idle_w)
from greenserve.v1 import common_pb2



def gpu_model_of(gpu: common_pb2.Gpu) -> str | None:
    """The gpu-partitioner's geometry name of a GPU (None when it has no MIG)."""
    name = GPU_HARDWARE.get(gpu.model)
    if name is None:
        return None
    try:
        geometry(name)
    except KeyError:
        return None
    return name


def pool_variants(pool: common_pb2.Pool) -> list[common_pb2.ModelVariant | None]:
    return list(pool.variants) if pool.variants else [None]


def variant_name(v: common_pb2.ModelVariant | None) -> str:
    return v.name if v is not None else "default"


class OptionTable:
    """Options of one pool: the stored profile of an engine already running the variant on that slice, else the
    simulator.

    A running engine's *predicted* capability is not taken: it is either this table's own prediction of the slice
    (``inputs.mig_capability``, the same figures) or, where that prediction finds no room for the variant, the
    optimizer's whole-GPU fallback, another GPU's profile (the demo's 3g.20gb BF16 8B engines got a 2xL40's 70 W
    idle each). The fallback made a running instance cost more than the same instance planned (which has no option
    there), so the plan made while the instances ran destroyed them and the next one created them again, every
    hour. The simulator's option, the same for a running and a planned instance, keeps consecutive plans alike."""

    def __init__(self, inputs: PlanningInputs, pool: common_pb2.Pool, pool_index: int) -> None:
        self.inputs, self.pool, self.pool_index = inputs, pool, pool_index
        self.engines: dict[tuple[str, str], str] = {}
        default = pool.variants[0].name if pool.variants else "default"
        for engine in pool.engines:
            hw = engine_hardware(engine, inputs.fleet)
            cap = inputs.capabilities.get(engine.id)
            if "-MIG-" in hw and cap is not None and cap.source != "predicted":
                self.engines.setdefault((hw, engine.model_variant or default), engine.id)

    def option(self, gpu_model: str, profile: str, variant: common_pb2.ModelVariant | None) -> mp.Option | None:
        name = variant_name(variant)
        hw = f"{gpu_model}-MIG-{profile}"
        engine_id = self.engines.get((hw, name))
        quality = variant.quality_fraction if variant is not None else 1.0
        if engine_id is not None:
            cap = self.inputs.capabilities[engine_id]
            if cap.capacity_requests_per_s > 0:
                return mp.Option(cap.capacity_requests_per_s, cap.idle_power_w, cap.energy_per_request_j, quality,
                                 cap.source, f"engine {engine_id}: {cap.detail}")
        sim = (variant.simulator_model if variant is not None and variant.simulator_model else None) or \
            guess_simulator_model(variant.model if variant is not None else self.pool.model) or \
            guess_simulator_model(self.pool.model)
        vi = next((i for i, v in enumerate(self.pool.variants) if v.name == name), None)
        field_ = (f"fleet.pools[{self.pool_index}].variants[{vi}].simulator_model" if vi is not None
                  else f"fleet.pools[{self.pool_index}].model")
        return mp.predicted_option(self.pool, gpu_model, profile, variant, sim, field_,
                                   self.inputs.prefix_hit_fraction.get(self.pool.name, 0.0))


@dataclass
class PoolSetup:
    pool: common_pb2.Pool
    groups: list[Group]
    options: dict[Kind, mp.Option]
    none_idle: dict[tuple[str, str], float]
    variant_names: dict[str, str]  # planned name -> MigPlacement.model_variant
    fixed_capacity_rps: float  # the pool's engines the plan does not touch
    base_power_w: float  # BASE's idle power (best variant on each GPU whole)
    base_energy_per_request_j: float
    memo: dict = field(default_factory=dict, repr=False)  # shared by the hours' problems


def setup_pool(inputs: PlanningInputs, pool: common_pb2.Pool, pool_index: int, headroom: float,
               in_force: dict[str, common_pb2.MigLayout]) -> PoolSetup | None:
    """The pool's MIG GPUs with their states in force, and the options of its variants on their slices. A GPU is
    planned when its model has MIG and MIG is in use on it (enabled, instances declared or reported, or a layout in
    force): a GPU running whole (MIG off, e.g. one of a tensor-parallel engine's GPUs) stays as it is."""
    models = {g.uuid: m for g in inputs.fleet.gpus if g.pool == pool.name and (m := gpu_model_of(g)) is not None}
    gpus = [g for g in inputs.fleet.gpus if g.pool == pool.name and g.uuid in models
            and (g.mig_enabled or g.instances or (g.uuid in in_force and in_force[g.uuid].placements))]
    if not gpus:
        return None
    table = OptionTable(inputs, pool, pool_index)
    variants = pool_variants(pool)
    names = {variant_name(v): (v.name if v is not None else "") for v in variants}
    default = variant_name(variants[0])
    # What runs on each instance now: the variant of the pool's engine on it (by MIG UUID or the instance's engine
    # id), which the layout in force may not say (a layout declared in the fleet names no variant).
    by_mig = {e.mig_uuid: e for e in pool.engines if e.mig_uuid}
    by_id = {e.id: e for e in pool.engines}
    running: dict[tuple[str, int, str], str] = {}
    for gpu in gpus:
        for inst in gpu.instances:
            engine = by_mig.get(inst.uuid) if inst.uuid else None
            engine = engine or next((by_id[i] for i in instance_engine_ids(inst) if i in by_id), None)
            if engine is not None:
                running[(gpu.uuid, inst.placement_start, inst.profile)] = engine.model_variant
    members = []
    for gpu in gpus:
        layout = in_force.get(gpu.uuid)
        state: list[tuple[Placement, str]] = []
        # The state: the pool's engines running on the GPU's reported instances when there are any (reality),
        # else the layout in force as keep-current sees it (the plan in force or the operator's declaration).
        if gpu.reported_by != "operator":
            for inst in gpu.instances:
                key = (gpu.uuid, inst.placement_start, inst.profile)
                if key in running and inst.placement_size:
                    name = running[key]
                    v = next((k for k, n in names.items() if n == name), default) if name else default
                    state.append((Placement(start=inst.placement_start, size=inst.placement_size,
                                            profile=inst.profile), v))
        if not state and layout is not None:
            for pl in layout.placements:
                if pl.pool == pool.name:
                    name = running.get((gpu.uuid, pl.start, pl.profile), pl.model_variant)
                    v = next((k for k, n in names.items() if n == name), default) if name else default
                    state.append((Placement(start=pl.start, size=pl.size, profile=pl.profile), v))
        members.append((gpu.uuid, models[gpu.uuid], tuple(sorted(state))))
    planned = {g.uuid for g in gpus}
    # The pool's engines the plan does not move (on no planned GPU) take load first.
    fixed = sum(headroom * inputs.capabilities[e.id].capacity_requests_per_s for e in pool.engines
                if e.id in inputs.capabilities and e.gpu_uuid not in planned)
    return make_setup(pool, members, table.option, fixed)


def make_setup(pool: common_pb2.Pool, members: Sequence[tuple[str, str, State]],
               option: Callable[[str, str, common_pb2.ModelVariant | None], mp.Option | None],
               fixed_capacity_rps: float = 0.0) -> PoolSetup:
    """A pool's setup from its GPUs ``(uuid, gpu model, state)`` and an option function (tests and the bench
    give their own)."""
    variants = pool_variants(pool)
    names = {variant_name(v): (v.name if v is not None else "") for v in variants}
    options: dict[Kind, mp.Option] = {}
    none_idle: dict[tuple[str, str], float] = {}
    groups: dict[str, Group] = {}
    for uuid, model, state in members:
        if model not in groups:
            by_profile: dict[str, list[str]] = {}
            for prof in sorted({p for cls in mp.layout_classes(model) for p in cls}):
                none_idle[(model, prof)] = none_idle_w(model, prof)
                for v in variants:
                    opt = option(model, prof, v)
                    if opt is not None:
                        options[(model, prof, variant_name(v))] = opt
                        by_profile.setdefault(prof, []).append(variant_name(v))
            groups[model] = Group(model, [], [], mp.enumerate_patterns(model, by_profile))
        groups[model].uuids.append(uuid)
        groups[model].states.append(state)
    # BASE: the best variant that fits on the largest slice of every GPU (CLOVER's default configuration).
    base_idle = 0.0
    base_e: list[float] = []
    for model, group in groups.items():
        whole = max((p for cls in mp.layout_classes(model) for p in cls),
                    key=lambda p: geometry(model).profile(p).compute_slices)
        opt = next((options[(model, whole, variant_name(v))] for v in variants
                    if (model, whole, variant_name(v)) in options), None)
        base_idle += max(gpu_idle_w(model), opt.idle_power_w if opt else 0.0) * len(group.uuids)
        if opt:
            base_e.append(opt.energy_per_request_j)
    base_e_req = sum(base_e) / len(base_e) if base_e else 0.0
    return PoolSetup(pool, list(groups.values()), options, none_idle, names, fixed_capacity_rps, base_idle, base_e_req)


def to_layouts(setup: PoolSetup, problem: Problem, solution: Solution
               ) -> tuple[dict[str, common_pb2.MigLayout], list[list[State]]]:
    """Concrete layouts per GPU: a GPU keeps its state when its pattern allows it; the others take the concrete
    layout of their pattern that restarts the fewest engines (``mig_patterns.restarts``)."""
    out: dict[str, common_pb2.MigLayout] = {}
    new_states: list[list[State]] = []
    for gi, group in enumerate(problem.groups):
        want: dict[tuple[State, mp.Pattern], int] = {
            (s, p): n for (g, s, p), n in solution.transitions.items() if g == gi}
        states_out: list[State] = []
        for uuid, state in zip(group.uuids, group.states):
            pattern = next(p for (s, p), n in sorted(want.items(), key=lambda kv: len(mp.restarts(*kv[0])[0]))
                           if s == state and n > 0)
            want[(state, pattern)] -= 1
            _, layout, variants = mp.restarts(state, pattern)
            msg = common_pb2.MigLayout(gpu_uuid=uuid)
            st = []
            for pl, v in zip(layout, variants):
                if not v:  # an instance without an engine is not created (a subset of a valid layout is valid)
                    continue
                msg.placements.add(profile=pl.profile, start=pl.start, size=pl.size, pool=setup.pool.name,
                                   model_variant=setup.variant_names.get(v, ""))
                st.append((pl, v))
            out[uuid] = msg
            states_out.append(tuple(sorted(st)))
        new_states.append(states_out)
    return out, new_states


def graph_of(problem: Problem, solution: Solution) -> dict[Kind, int]:
    return instances_of(problem, solution.counts)


def base_carbon_g(setup: PoolSetup, load_rps: float, base_ci: float, pue: float) -> float:
    """C_base of one hour: BASE's energy at the baseline CI (never 0: a floor of 1 mg keeps Eq. 2 defined)."""
    energy_j = (setup.base_power_w + setup.base_energy_per_request_j * load_rps) * 3600.0
    return max(energy_j * pue * base_ci / 3.6e6, 1e-3)


def problem_for(setup: PoolSetup, states: list[list[State]] | None, load_rps: float, ci: float, base_ci: float,
                pue: float, weight: float, *, headroom: float = 0.9, max_accuracy_loss: float | None = None,
                change_s: float = DEFAULT_CHANGE_S, max_ged: int | None = None,
                previous_graph: dict[Kind, int] | None = None) -> Problem:
    """The problem of one hour of a pool (``states``: per group, the GPUs' states; None: as in the setup)."""
    states = states if states is not None else [list(g.states) for g in setup.groups]
    groups = [Group(g.gpu_model, g.uuids, st, g.patterns) for g, st in zip(setup.groups, states)]
    return Problem(setup.pool.name, load_rps, ci, base_carbon_g(setup, load_rps, base_ci, pue), pue, weight, groups,
                   setup.options, setup.none_idle, headroom, max_accuracy_loss, change_s, max_ged, previous_graph,
                   memo=setup.memo)

