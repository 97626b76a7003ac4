"""Routing weights: send each pool's load where the carbon per request is lowest, every engine within its SLO
capacity.

Per pool and hour this is the linear program

    minimise   sum_e c_e x_e      subject to   sum_e x_e = L,   0 <= x_e <= h x cap_e

with ``x_e`` the requests per second sent to engine ``e``, ``c_e`` its marginal carbon per request (dynamic energy
per request x PUE x CI of the pool's region: the idle power and the embodied carbon are paid whichever engine
serves), ``cap_e`` its SLO capacity from the profiles (``capacity.py``), ``h`` a headroom fraction and ``L`` the
forecast load (the upper bound of the prediction interval by default, so that a load within the interval still
meets the SLO). One equality and box constraints: filling the engines in increasing ``c_e`` is the exact optimum
(the LP's dual is one price; this is the fractional-knapsack argument), so no LP solver is needed here.

When ``L`` exceeds the pool's headroom capacity, the engines are filled to full capacity; beyond that the load is
spread in proportion to capacity (the plan says so). The expected attainment is a prediction at the planned rates
(``expected_attainment``: each engine's capability at its rate), not the pool's target.
Weights are the shares ``x_e / L``; an engine with weight 0 gets no requests while the plan is in force.
"""

from __future__ import annotations

from greenserve.common.mig_geometry import instance_engine_ids
from greenserve.optimizer.capacity import Capability
from greenserve.optimizer.planning import KnobPlan, PlanningInputs, PoolFigures
from greenserve.optimizer.solvers.mig_setup import (
    OptionTable,
    gpu_model_of,
    variant_name,
)
from greenserve.v1 import common_pb2


def fill(load: float, engines: list[tuple[str, float, float]], headroom: float) -> dict[str, float]:
    """Rates per engine for ``load`` over ``(id, cost, capacity)``: cheapest first up to headroom, then to
    capacity, then in proportion to capacity."""
    order = sorted(engines, key=lambda e: (e[1], e[0]))
    rates = {e[0]: 0.0 for e in order}
    left = load
    for fraction in (headroom, 1.0):
        for engine_id, _, cap in order:
            room = fraction * cap - rates[engine_id]
            take = min(max(room, 0.0), left)
            rates[engine_id] += take
            left -= take
            if left <= 1e-12:
                return rates
    total_cap = sum(cap for _, _, cap in order)
    if total_cap > 0:
        for engine_id, _, cap in order:
            rates[engine_id] += left * cap / total_cap
    elif order:
        for engine_id, _, _ in order:
            rates[engine_id] += left / len(order)
    return rates


def expected_attainment(rates: dict[str, float], caps: dict[str, Capability], capacity: dict[str, float],
                        target: float) -> float:
    """The attainment the engines are predicted to reach at their planned rates (requests per second each),
    weighted by their requests: an engine's ``Capability.attainment`` at its rate (a simulator prediction replays
    that rate: at a light load the engine meets the SLO for more requests than the target); an engine known only by
    its capacity (in ``capacity``, not ``caps``: an instance a MIG layout creates) meets the target up to its capacity,
    then falls as capacity / rate. Without load: what the engines reach at a rate of zero."""

    def at(eid: str, rate: float) -> float:
        if eid in caps:
            return caps[eid].attainment(rate, target)
        cap = capacity.get(eid, 0.0)
        return target if rate <= cap else target * cap / rate

    total = sum(rates.values())
    if total <= 0:
        return max((at(eid, 0.0) for eid in capacity), default=target)
    return sum(rate * at(eid, rate) for eid, rate in rates.items() if rate > 0) / total


class MinCarbonRouting:
    knob = "routing_weights"
    name = "routing_weights.min_carbon"

    def __init__(self, headroom_fraction: float = 0.9, load_bound: str = "upper") -> None:
        if not 0 < headroom_fraction <= 1:
            raise ValueError("headroom_fraction: must be in (0, 1]")
        if load_bound not in ("upper", "mean"):
            raise ValueError("load_bound: must be 'upper' or 'mean'")
        self.headroom = headroom_fraction
        self.load_bound = load_bound

    def solve(self, inputs: PlanningInputs) -> KnobPlan:
        per_interval: list[list[common_pb2.RoutingWeight]] = []
        figures: list[dict[str, PoolFigures]] = []
        pue = inputs.params.pue
        short: dict[str, int] = {}
        for h in range(inputs.horizon_hours):
            weights: list[common_pb2.RoutingWeight] = []
            pool_figs: dict[str, PoolFigures] = {}
            for pool in inputs.fleet.pools:
                fc = inputs.load.get(pool.name)
                mean = fc.mean[h] if fc else 0.0
                load = (fc.upper[h] if self.load_bound == "upper" else mean) if fc else 0.0
                ci = inputs.ci[pool.region].mean[h] if pool.region in inputs.ci else 0.0
                engines = []
                for engine in pool.engines:
                    cap = inputs.capabilities_at(h).get(engine.id)
                    if cap is None:
                        continue
                    cost_g = cap.energy_per_request_j / 3.6e6 * pue * ci
                    engines.append((engine.id, cost_g, cap.capacity_requests_per_s))
                if not engines:
                    continue
                plan_rates = fill(load, engines, self.headroom)
                total = sum(plan_rates.values())
                capacity = sum(e[2] for e in engines)
                # The mean load is served in the same shares as the planned (upper-bound) load.
                share = {eid: (r / total if total > 0 else 1.0 / len(engines)) for eid, r in plan_rates.items()}
                mean_rates = {eid: mean * s for eid, s in share.items()}
                attainment = expected_attainment(mean_rates, inputs.capabilities_at(h),
                                                 {e[0]: e[2] for e in engines}, pool.slo.attainment_fraction)
                if load > capacity:
                    short[pool.name] = short.get(pool.name, 0) + 1
                if total <= 0:  # no load: keep every engine eligible, equally
                    share = {eid: 1.0 for eid in share}
                for engine_id, _, _ in sorted(engines):
                    weights.append(common_pb2.RoutingWeight(pool=pool.name, engine_id=engine_id,
                                                            weight=round(share[engine_id], 6)))
                pool_figs[pool.name] = PoolFigures(mean, capacity, attainment, mean_rates)
            per_interval.append(weights)
            figures.append(pool_figs)
        lines = [f"pool {name}: forecast load above the pool's SLO capacity in {n} of {inputs.horizon_hours} hours; "
                 f"attainment below target there" for name, n in sorted(short.items())]
        detail = (f"weights for {len(inputs.fleet.pools)} pools over {inputs.horizon_hours} h, engines filled by "
                  f"carbon per request up to {self.headroom:.0%} of SLO capacity ({self.load_bound} load)")
        return KnobPlan(per_interval, explanation=lines, detail=detail, pool_figures=figures)


# ------------------------------------------------------------------------------------------------------------------
# Routing onto MIG instances
# ------------------------------------------------------------------------------------------------------------------

MIG_PLACEMENT_PREFIX = "mig:"


def placement_engine_id(gpu_uuid: str, profile: str, start: int) -> str:
    """The engine id a plan gives a MIG instance that runs no reported engine yet: ``mig:<gpu>/<profile>@<start>``.
    The router resolves it to the engine the gpu-partitioner registers on that instance (the fleet inventory's
    ``gpus[].instances[]`` carry the profile, the placement start and the engine id); the evaluation's replay
    weights its instance engines by it."""
    return f"{MIG_PLACEMENT_PREFIX}{gpu_uuid}/{profile}@{start}"


def _reported_engines(fleet: common_pb2.FleetInventory) -> dict[tuple[str, str, int], str]:
    """(GPU uuid, MIG profile, placement start) -> the engine on that instance: the one the gpu-partitioner reported
    there, else the pool engine the fleet declares on that MIG device (``Engine.mig_uuid`` = the instance's uuid),
    so that a declared fleet whose partitioner has not reported yet keeps its engines' ids (and capabilities)."""
    declared: dict[str, list[str]] = {}
    for pool in fleet.pools:
        for engine in pool.engines:
            if engine.mig_uuid:
                declared.setdefault(engine.mig_uuid, []).append(engine.id)
    out: dict[tuple[str, str, int], str] = {}
    for gpu in fleet.gpus:
        for inst in gpu.instances:
            ids = instance_engine_ids(inst) or declared.get(inst.uuid, [])
            if len(ids) == 1:  # one engine per instance is what the partitioner runs
                out[(gpu.uuid, inst.profile, inst.placement_start)] = ids[0]
    return out


def onto_mig_instances(inputs: PlanningInputs, routing: KnobPlan, layouts: KnobPlan,
                       solver: object | None = None) -> KnobPlan:
    """The routing weights with each pool's MIG-partitioned GPUs weighted per instance.

    A routing solver weighs the pool's engines as the fleet lists them (whole GPUs, or the instances running now),
    but in an hour whose ``mig_layouts`` partition a GPU for the pool, the engines there are one per placement of
    that layout, each with its capacity at the pool's SLO (the option the clover-exact solver sized the layout
    with: the running engine's measured capability, else the profiles' prediction for its variant on that slice).
    An instance that runs a reported engine is named by that engine's id; one the layout creates by
    ``placement_engine_id``. The pool's engines on those GPUs that no placement keeps get weight 0.

    * By default (even routing, any other solver, or a min-carbon answer that is not its own): the weight the
      solver gave the pool's engines on those GPUs is summed and split over the placements in proportion to each
      instance's capacity, so each instance is loaded to the same fraction of its capacity; engines on other GPUs
      keep the solver's weight. When the solver named no engine on those GPUs (none had a capability), the
      instances together get the pool's mean weight per instance; when it gave the pool no weight, they share 1.
    * With ``MinCarbonRouting`` (``solver``) and its own answer, its rule is re-run for the pool over the instances
      and the pool's other engines: filled in increasing carbon per request (the instance's dynamic energy per
      request x PUE x CI) up to the headroom of their capacity, so that, as on whole GPUs, the load is concentrated
      on the fewest instances that carry it within the SLO. With no load the instances are weighted by capacity.
    """
    # the min-carbon rule is re-run only for its own answer
    min_carbon = solver if isinstance(solver, MinCarbonRouting) and routing.status == "ok" \
        and routing.pool_figures is not None else None
    if not layouts.per_interval or len(layouts.per_interval) != len(routing.per_interval):
        return routing
    reported = _reported_engines(inputs.fleet)
    gpu_models = {g.uuid: gpu_model_of(g) for g in inputs.fleet.gpus}
    gpu_pool = {g.uuid: g.pool for g in inputs.fleet.gpus}
    tables: dict[str, OptionTable] = {}
    capacity_cache: dict[tuple[str, str, str, str], tuple[float, float]] = {}
    notes: list[str] = []
    per_interval: list[list[common_pb2.RoutingWeight]] = []
    split_pools: set[str] = set()
    figures = [dict(f) for f in routing.pool_figures] if routing.pool_figures else None
    for h, weights in enumerate(routing.per_interval):
        placements: dict[str, list[tuple[str, common_pb2.MigPlacement]]] = {}
        partitioned: dict[str, set[str]] = {}  # pool -> GPUs the hour's layouts cover (also those left empty)
        for layout in layouts.per_interval[h]:
            if gpu_pool.get(layout.gpu_uuid):
                partitioned.setdefault(gpu_pool[layout.gpu_uuid], set()).add(layout.gpu_uuid)
            for pl in layout.placements:
                if pl.pool:
                    placements.setdefault(pl.pool, []).append((layout.gpu_uuid, pl))
                    partitioned.setdefault(pl.pool, set()).add(layout.gpu_uuid)
        if not partitioned:
            per_interval.append(list(weights))
            continue
        out: list[common_pb2.RoutingWeight] = []
        for pi, pool in enumerate(inputs.fleet.pools):
            mine = [w for w in weights if w.pool == pool.name]
            if pool.name not in partitioned:
                out.extend(mine)
                continue
            gpus = partitioned[pool.name]
            on_gpu = {e.id for e in pool.engines if e.gpu_uuid in gpus}
            named = [w.weight for w in mine if w.engine_id in on_gpu]
            moved = sum(named)
            if not mine:
                moved = 1.0
            elif not named:  # the solver knew no engine there: each instance as the pool's mean engine
                moved = sum(w.weight for w in mine) / len(mine) * len(placements.get(pool.name, []))
            variants = {v.name: v for v in pool.variants}
            engine_variant = {e.id: e.model_variant for e in pool.engines if e.model_variant}
            caps: list[tuple[str, float]] = []
            costs: dict[str, float] = {}  # engine id -> dynamic J per request (min-carbon only)
            for uuid, pl in placements.get(pool.name, []):
                gpu_model = gpu_models.get(uuid)
                engine_id = reported.get((uuid, pl.profile, pl.start)) or placement_engine_id(uuid, pl.profile,
                                                                                              pl.start)
                # a placement that names no variant (a layout kept as declared) runs what its engine runs
                wanted = pl.model_variant or engine_variant.get(engine_id, "")
                variant = variants.get(wanted) if wanted else (pool.variants[0] if pool.variants else None)
                key = (pool.name, gpu_model or "", pl.profile, variant_name(variant))
                if key not in capacity_cache:
                    cap, energy_j = 0.0, 0.0
                    if gpu_model is not None:
                        table = tables.setdefault(pool.name, OptionTable(inputs, pool, pi))
                        try:
                            option = table.option(gpu_model, pl.profile, variant)
                        except Exception as exc:  # noqa: BLE001 - an unpredictable slice is named, not fatal
                            notes.append(f"pool {pool.name}: no capacity for {pl.profile} {variant_name(variant)} "
                                         f"({exc}); its instances weighted as the pool's others' mean")
                            option = None
                        if option is not None:
                            cap, energy_j = option.capacity_requests_per_s, option.energy_per_request_j
                    capacity_cache[key] = (cap, energy_j)
                caps.append((engine_id, capacity_cache[key][0]))
                costs[engine_id] = capacity_cache[key][1]
            known = [c for _, c in caps if c > 0]
            fallback = sum(known) / len(known) if known else 1.0
            caps = [(eid, c if c > 0 else fallback) for eid, c in caps]
            total_cap = sum(c for _, c in caps)
            instance_ids = {eid for eid, _ in caps}
            out.extend(w for w in mine if w.engine_id not in on_gpu and w.engine_id not in instance_ids)
            for engine_id in sorted(on_gpu - instance_ids):
                out.append(common_pb2.RoutingWeight(pool=pool.name, engine_id=engine_id, weight=0.0))
            shares = {eid: (moved * cap / total_cap if total_cap else 0.0) for eid, cap in caps}
            if min_carbon is not None and caps:
                shares.update(_fill_shares(inputs, min_carbon, h, pool, caps, costs, on_gpu | instance_ids, mine, out))
            for engine_id, _ in sorted(caps):
                out.append(common_pb2.RoutingWeight(pool=pool.name, engine_id=engine_id,
                                                    weight=round(shares[engine_id], 6)))
            split_pools.add(pool.name)
            if figures is not None and h < len(figures):
                listed = {e.id for e in pool.engines}
                figures[h][pool.name] = _instance_figures(inputs, h, pool, caps, out, on_gpu - instance_ids)
                figures[h][pool.name].new_engine_energy_per_request_j.update(
                    {eid: costs[eid] for eid, _ in caps if eid not in listed})
        per_interval.append(out)
    if not split_pools:
        return routing
    detail = routing.detail + (f"; MIG-partitioned GPUs of {', '.join(sorted(split_pools))} weighted per instance by "
                               f"its capacity at the SLO")
    return KnobPlan(per_interval, explanation=list(routing.explanation) + sorted(set(notes)), detail=detail,
                    status=routing.status, pool_figures=figures)


def _instance_figures(inputs: PlanningInputs, h: int, pool: common_pb2.Pool, caps: list[tuple[str, float]],
                      out: list[common_pb2.RoutingWeight], gone: set[str]) -> PoolFigures:
    """The pool's expected figures in hour ``h`` over the engines that run once the layout is applied: its MIG
    instances (``caps``: their capacities at the SLO) and its engines on other GPUs, each sent the hour's mean load
    in proportion to its weight; attainment falls as capacity / rate on an engine loaded beyond its capacity.
    ``gone``: the engines of the partitioned GPUs that the layout removes (no longer the pool's capacity)."""
    fc = inputs.load.get(pool.name)
    mean = fc.mean[h] if fc else 0.0
    capacity = dict(caps)
    for w in out:
        if (w.pool == pool.name and w.engine_id not in capacity and w.engine_id not in gone
                and w.engine_id in inputs.capabilities_at(h)):
            capacity[w.engine_id] = inputs.capabilities_at(h)[w.engine_id].capacity_requests_per_s
    weights = {w.engine_id: w.weight for w in out if w.pool == pool.name and w.engine_id in capacity}
    total_w = sum(weights.values())
    rates = {eid: (mean * wt / total_w if total_w > 0 else 0.0) for eid, wt in weights.items()}
    caps_h = {eid: cap for eid, cap in inputs.capabilities_at(h).items() if eid in capacity and eid not in dict(caps)}
    attainment = expected_attainment(rates, caps_h, capacity, pool.slo.attainment_fraction)
    return PoolFigures(mean, sum(capacity.values()), attainment, rates)


def _fill_shares(inputs: PlanningInputs, solver: MinCarbonRouting, h: int, pool: common_pb2.Pool,
                 caps: list[tuple[str, float]], costs: dict[str, float], moved_ids: set[str],
                 mine: list[common_pb2.RoutingWeight], out: list[common_pb2.RoutingWeight]) -> dict[str, float]:
    """Min-carbon routing's fill re-run over the pool's instances and its engines on other GPUs: shares of the
    hour's load per instance; ``out``'s weights of the pool's other engines are rewritten to their new shares."""
    fc = inputs.load.get(pool.name)
    load = (fc.upper[h] if solver.load_bound == "upper" else fc.mean[h]) if fc else 0.0
    ci = inputs.ci[pool.region].mean[h] if pool.region in inputs.ci else 0.0
    g_per_j = inputs.params.pue * ci / 3.6e6
    others = {w.engine_id for w in mine if w.engine_id not in moved_ids}
    caps_h = inputs.capabilities_at(h)
    other_engines = [(e.id, caps_h[e.id]) for e in pool.engines if e.id in others and e.id in caps_h]
    known = [c for c in costs.values() if c > 0] + [c.energy_per_request_j for _, c in other_engines]
    # An instance with no prediction is filled last (as the dearest known engine), never first as if free.
    unknown_j = max(known, default=0.0)
    engines = [(eid, (costs.get(eid, 0.0) or unknown_j) * g_per_j, cap) for eid, cap in caps]
    engines += [(eid, c.energy_per_request_j * g_per_j, c.capacity_requests_per_s) for eid, c in other_engines]
    rates = fill(load, engines, solver.headroom)
    total = sum(rates.values())
    if total <= 0:  # no load: every instance eligible, by capacity
        total_cap = sum(cap for _, _, cap in engines) or 1.0
        shares = {eid: cap / total_cap for eid, _, cap in engines}
    else:
        shares = {eid: r / total for eid, r in rates.items()}
    for i, w in enumerate(out):
        if w.pool == pool.name and w.engine_id in others and w.engine_id in shares:
            out[i] = common_pb2.RoutingWeight(pool=pool.name, engine_id=w.engine_id,
                                              weight=round(shares[w.engine_id], 6))
    return {eid: shares[eid] for eid, _ in caps}
