"""Cache sizes per pool and hour: the GreenCache ILP (Eq. 6), solved to proven optimality by HiGHS (``cache_ilp``:
the model as arrays, handed to highspy, or the same model through PuLP with HiGHS or CBC).

For every pool whose fleet entry allows a cache tier (``max_cache_disk_bytes``, else ``max_cache_dram_bytes``) the
candidate sizes are 0, ``cache_step_bytes``, ... up to the limit (at most ``MAX_SIZES``; GreenCache: 1 TB steps up
to 16 TB). Binary ``x[p, t, k]`` picks size ``k`` for pool ``p`` in hour ``t``:

    minimise   sum x[p,t,k] * ( E[p,t,k] * PUE * CI[p,t]  +  S_k * (T / LT_tier) * C_e,tier )
    s.t.       sum_k x[p,t,k] = 1                                                      (one size per hour)
               sum_{t,k} N[p,t] * a_TTFT[p,t,k] * x[p,t,k] >= rho_p * sum_t N[p,t]     (Eq. 6, global rho)
               sum_{t,k} N[p,t] * a_TPOT[p,t,k] * x[p,t,k] >= rho_p * sum_t N[p,t]
               (optionally, per hour: only sizes with a_TTFT, a_TPOT >= rho_p)
               sum_p S[p,t] <= max_cache_storage_bytes of the fleet                   (when set)
    plus, for a DRAM pool, R[p,t,k] * max(0, x[p,t-1,k] - x[p,t,k])                 (restart charge, see below)

``E`` is the energy of the pool's engines in the hour at the forecast rate with that cache (the cache profile's
power: ``cache_profiles.py``), ``N`` the forecast requests of the hour, ``a`` the profile's attainment at that rate and
size. The embodied carbon of the GPUs is the same for every size and is left out of the choice (``assemble`` charges
it). No Cache (every ``k = 0``) and Full Cache (every ``k = max``) are evaluated in the same model, and the plan says
what the chosen sizes save against both. When no size assignment meets the SLO, the sizes with the highest attainment
are taken and the plan says the SLO is out of reach. A DRAM (L1) resize restarts LMCache and empties L1, so leaving a
size is charged what that content would have saved while the new L1 refills (``GreenCacheIlp.charge_restarts``),
hour 0 against the size in force; the disk tier resizes without a restart and is not charged.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np
from greenserve.common import carbon
from greenserve.optimizer import cache_profiles, capacity
from greenserve.optimizer.capacity import Capability, simulator_profile_name
from greenserve.optimizer.inputs import (
    engine_hardware,
    engine_variant,
    guess_simulator_model,
)
from greenserve.optimizer.planning import KnobPlan, PlanningInputs
from greenserve.optimizer.solvers import cache_ilp
from greenserve.optimizer.solvers.keep_current import KeepCurrent
from greenserve.v1 import common_pb2

log = logging.getLogger("greenserve.optimizer.cache")

MAX_SIZES = 64
CAPACITY_SIZES = 5  # DRAM sizes whose engine capacity is predicted (a cold prediction costs ~2 s CPU; cached after)
# How long an emptied L1 takes to refill after a restart. Assumption: the window the simulator's cache profiles
# replay to reach steady state from a cold cache (cache_profiles.WINDOW_MIN_S); multi-turn conversations come back
# every ~30 s for ~4 turns, so most of what L1 held is asked for again within it.
DEFAULT_RESTART_WARMUP_S = 600.0
DEFAULT_STEP_BYTES = 1 << 30
TB = 10**12
GIB = 1 << 30


def _size_text(n: int) -> str:
    return f"{n / TB:.1f} TB" if n >= TB else f"{n / GIB:.1f} GiB"


@dataclass
class PoolCacheModel:
    """Per hour and size: carbon (g), TTFT and TPOT attainment; requests per hour."""

    pool: str
    tier: str
    sizes: list[int]
    requests: list[float]
    carbon_g: list[list[float]]
    ttft: list[list[float]]
    tpot: list[list[float]]
    rho: float
    source: str
    ci: list[float]
    servers: int = 1  # LMCache servers the target applies to (one beside each engine)
    # Restart charge (g) of leaving size k at the start of hour t (an L1 resize restarts LMCache: ``restart_g``
    # in ``GreenCacheIlp.pool_model``); None: resizes are free (the disk tier resizes without a restart).
    restart_g: list[list[float]] | None = None
    in_force_index: int | None = None  # the size in force before hour 0 (index into sizes; -1: not a candidate)
    in_force_restart_g: float = 0.0  # charge of leaving it at the start of hour 0
    # Per size, one engine's capability with that DRAM tier (its prefix hits raise its capacity); None: the size
    # does not change the capacity (no prefix reuse measured, a disk tier, or a measured profile).
    capabilities: list[Capability] | None = None


def engines_loaded(load_per_s: float, capacity_per_s: float, headroom: float, n_engines: int) -> int:
    """Engines min-carbon routing loads for ``load_per_s``: the fewest whose headroom capacity carries it (it fills
    engines one after another), at least one, at most the pool's."""
    if capacity_per_s <= 0:
        return n_engines
    return max(1, min(n_engines, math.ceil(load_per_s / (headroom * capacity_per_s) - 1e-9)))


def pool_profile(inputs: PlanningInputs, pool: common_pb2.Pool) -> str:
    """The simulator performance profile of the pool's (first) engine."""
    engine = pool.engines[0]
    variant = engine_variant(engine, pool)
    sim_model = (variant.simulator_model if variant and variant.simulator_model else None) or \
        guess_simulator_model(variant.model if variant else pool.model) or guess_simulator_model(pool.model) or ""
    profile, _ = simulator_profile_name(sim_model, engine_hardware(engine, inputs.fleet) or "A100-80GB")
    return profile


def candidate_sizes(limit: int, step: int) -> list[int]:
    step = step or DEFAULT_STEP_BYTES
    n = limit // step
    if n + 1 > MAX_SIZES:  # coarsen the step so the choice stays at MAX_SIZES sizes
        step = math.ceil(limit / (MAX_SIZES - 1))
        n = limit // step
    sizes = [k * step for k in range(int(n) + 1)]
    if sizes[-1] != limit:
        sizes.append(limit)
    return sizes


def undominated_all(m: PoolCacheModel, per_hour_slo: bool) -> list[list[int]]:
    """Per hour, the sizes no other size beats on carbon, TTFT and TPOT attainment at once. A dominated size is never
    in an optimal solution of Eq. 6: swapping it for its dominator keeps every constraint and lowers carbon; with a
    fleet storage limit the dominator must also be no larger. With restart charges (``restart_g``) the swap can add
    at most the charge of leaving the replaced size at the start of the hour (``r_in``) and of leaving the dominator
    at the start of the next hour, so the dominator must be cheaper by that much (still transitive, so removing every
    dominated size at once is exact). All hours at once, as (hours, sizes, sizes) arrays."""
    c = np.asarray(m.carbon_g, dtype=np.float64)
    a = np.asarray(m.ttft, dtype=np.float64)
    b = np.asarray(m.tpot, dtype=np.float64)
    hours, n = c.shape
    z = np.asarray(m.sizes, dtype=np.float64)
    ok = (a >= m.rho) & (b >= m.rho) if per_hour_slo else np.ones((hours, n), dtype=bool)
    r_in = np.zeros((hours, n))
    r_next = np.zeros((hours, n))
    if m.restart_g is not None:
        restart = np.asarray(m.restart_g, dtype=np.float64)
        r_in[1:] = restart[1:]
        if m.in_force_index is not None and 0 <= m.in_force_index < n:
            r_in[0, m.in_force_index] = m.in_force_restart_g
        r_next[:-1] = restart[1:]
    # dom[t, j, k]: j is at least as good as k (with the charges) and allowed; strictly better somewhere, or equal
    # and first.
    weak = ((c[:, :, None] + r_next[:, :, None] + r_in[:, None, :] <= c[:, None, :])
            & (a[:, :, None] >= a[:, None, :]) & (b[:, :, None] >= b[:, None, :])
            & (z[None, :, None] <= z[None, None, :]) & ok[:, :, None])
    strict = ((c[:, :, None] < c[:, None, :]) | (a[:, :, None] > a[:, None, :]) | (b[:, :, None] > b[:, None, :])
              | (z[None, :, None] < z[None, None, :]))
    earlier = (np.arange(n)[:, None] < np.arange(n)[None, :])[None]
    dom = weak & (strict | earlier)
    dom[:, np.arange(n), np.arange(n)] = False
    keep_mask = ok & ~dom.any(axis=1)
    out = []
    for t in range(hours):
        keep = [int(k) for k in np.flatnonzero(keep_mask[t])]
        if not keep:  # no size meets the SLO in this hour: the best-attaining one only
            keep = [max(range(n), key=lambda k: (min(m.ttft[t][k], m.tpot[t][k]), -k))]
        out.append(keep)
    return out


def undominated(m: PoolCacheModel, t: int, per_hour_slo: bool) -> list[int]:
    """Hour ``t``'s undominated sizes (``undominated_all``)."""
    return undominated_all(m, per_hour_slo)[t]


def _solve(models: list[PoolCacheModel], options: list[list[list[int]]], *, per_hour_slo: bool,
           fleet_limit_bytes: int, time_limit_s: float, backend: str) -> tuple[dict[str, list[int]], str, float, float]:
    arrays = cache_ilp.build(models, options, global_slo=not per_hour_slo, fleet_limit_bytes=fleet_limit_bytes)
    if backend == "highs":
        return cache_ilp.solve_highs(arrays, models, time_limit_s=time_limit_s)
    return cache_ilp.solve_pulp(arrays, models, time_limit_s=time_limit_s, solver=backend.removeprefix("pulp-"))


def solve_ilp(models: list[PoolCacheModel], *, per_hour_slo: bool = False, fleet_limit_bytes: int = 0,
              time_limit_s: float = 30.0, backend: str = "highs") -> tuple[dict[str, list[int]], str, float, float]:
    """Chosen size index per pool and hour, solver status, objective (carbon plus restart charges), MIP gap (0 when
    proven optimal). ``backend``: ``highs`` (the arrays handed to highspy), ``pulp-highs`` or ``pulp-cbc`` (the same
    model built with PuLP).

    Dominated sizes are removed first. Pools are then solved one by one; only when their optima together exceed
    the fleet's storage limit in some hour is the joint model solved (the separate optima are the joint optimum
    whenever they fit: the limit is the only constraint that couples pools)."""
    if backend not in cache_ilp.BACKENDS:
        raise ValueError(f"backend: must be one of {', '.join(cache_ilp.BACKENDS)}")
    options = [undominated_all(m, per_hour_slo) for m in models]
    chosen: dict[str, list[int]] = {}
    objective = 0.0
    gap = 0.0
    # Pools one after another: HiGHS's task scheduler is global to the process, and solving in several Python
    # threads at once left it unusable for later solves in other threads (the MIG solver then found nothing).
    for p, m in enumerate(models):
        picks, status, value, g = _solve([m], [options[p]], per_hour_slo=per_hour_slo, fleet_limit_bytes=0,
                                         time_limit_s=time_limit_s, backend=backend)
        if status != "Optimal":
            return {}, status, math.nan, math.nan
        chosen.update(picks)
        objective += value
        gap = max(gap, g)
    if fleet_limit_bytes > 0 and models:
        hours = len(models[0].requests)
        used = [sum(m.sizes[chosen[m.pool][t]] for m in models) for t in range(hours)]
        if max(used) > fleet_limit_bytes:
            return _solve(models, options, per_hour_slo=per_hour_slo, fleet_limit_bytes=fleet_limit_bytes,
                          time_limit_s=time_limit_s, backend=backend)
    return chosen, "Optimal", objective, gap


def fallback_best_attainment(m: PoolCacheModel) -> list[int]:
    return [max(range(len(m.sizes)), key=lambda k: (min(m.ttft[t][k], m.tpot[t][k]), -k))
            for t in range(len(m.requests))]


def total_carbon(m: PoolCacheModel, picks: list[int]) -> float:
    return sum(m.carbon_g[t][k] for t, k in enumerate(picks))


def restart_charge(m: PoolCacheModel, picks: list[int]) -> tuple[int, float]:
    """Resizes the picks make (hour 0 against the size in force) and their restart charge (g)."""
    if m.restart_g is None:
        return 0, 0.0
    count, charge = 0, 0.0
    if m.in_force_index is not None and picks and picks[0] != m.in_force_index:
        count, charge = 1, m.in_force_restart_g
    for t in range(1, len(picks)):
        if picks[t] != picks[t - 1]:
            count += 1
            charge += m.restart_g[t][picks[t - 1]]
    return count, charge


def attainment(m: PoolCacheModel, picks: list[int]) -> float:
    total = sum(m.requests)
    if total <= 0:
        return 1.0
    return min(sum(m.requests[t] * m.ttft[t][k] for t, k in enumerate(picks)),
               sum(m.requests[t] * m.tpot[t][k] for t, k in enumerate(picks))) / total


class GreenCacheIlp:
    """The GreenCache ILP solver module for the ``cache_targets`` knob."""

    knob = "cache_targets"
    name = "cache.greencache_ilp"

    def __init__(self, per_hour_slo: bool = False, time_limit_s: float = 8.0,
                 restart_warmup_s: float = DEFAULT_RESTART_WARMUP_S, routing_headroom_fraction: float = 0.9,
                 routing_load: str = "upper", routing_fills_fewest: bool = True) -> None:
        if not (restart_warmup_s >= 0 and math.isfinite(restart_warmup_s)):
            raise ValueError("restart_warmup_s: must be a finite number >= 0")
        if not 0 < routing_headroom_fraction <= 1:
            raise ValueError("routing_headroom_fraction: must be in (0, 1]")
        if routing_load not in ("upper", "mean"):
            raise ValueError("routing_load: must be 'upper' or 'mean'")
        # How the routing solver loads engines (MinCarbonRouting's headroom and load bound): the engines a size
        # lets routing unload are counted with them.
        # (``routing_fills_fewest`` False: the routing spreads the load over every engine, e.g. even routing.)
        self.routing_headroom = routing_headroom_fraction
        self.routing_load = routing_load
        self.routing_fills_fewest = routing_fills_fewest
        self.per_hour_slo = per_hour_slo
        self.time_limit_s = time_limit_s
        self.restart_warmup_s = restart_warmup_s

    def pool_model(self, inputs: PlanningInputs, pool: common_pb2.Pool) -> PoolCacheModel | None:
        tier = "disk" if pool.max_cache_disk_bytes > 0 else "dram" if pool.max_cache_dram_bytes > 0 else ""
        if not tier or not pool.engines:
            return None
        limit = pool.max_cache_disk_bytes if tier == "disk" else pool.max_cache_dram_bytes
        sizes = candidate_sizes(limit, pool.cache_step_bytes)
        engine = pool.engines[0]
        profile = pool_profile(inputs, pool)
        n_engines = len(pool.engines)
        load = inputs.load.get(pool.name)
        hours = inputs.horizon_hours
        rates = [(load.mean[h] if load else 0.0) for h in range(hours)]
        cap = inputs.capabilities.get(engine.id)
        # The ladder depends on the engine only (not on this hour's forecast), so the grid is computed once per
        # engine type and reused by every later plan; rates beyond it extrapolate (attainment falls as 1 / rate).
        ladder = cache_profiles.rate_ladder(cap.capacity_requests_per_s if cap else 1.0, 0.0, n=5)
        grid = cache_profiles.predict_grid(profile, tier, tuple(sizes), ladder, pool.slo.ttft_s, pool.slo.tpot_s)
        ci = [inputs.ci[pool.region].mean[h] if pool.region in inputs.ci else 0.0 for h in range(hours)]
        pue = inputs.params.pue
        size_caps = (self.size_capabilities(inputs, pool, profile, sizes)
                     if tier == "dram" and self.routing_fills_fewest else None)
        bound = [((load.upper[h] if self.routing_load == "upper" else load.mean[h]) if load else 0.0)
                 for h in range(hours)]
        carbon_rows, ttft_rows, tpot_rows, requests, operational_rows = [], [], [], [], []
        for h in range(hours):
            row_c, row_a, row_b, row_o = [], [], [], []
            for k, size in enumerate(sizes):
                # The engines the routing solver loads at this size: the fewest that carry the hour's load within
                # their capacity at this DRAM size (its prefix hits); the others idle. Without a capacity that
                # depends on the size, the load is spread over all of them.
                loaded = n_engines if size_caps is None else engines_loaded(
                    bound[h], size_caps[k].capacity_requests_per_s, self.routing_headroom, n_engines)
                a_ttft, a_tpot, power_w = grid.at(k, rates[h] / loaded)
                idle_w = size_caps[k].idle_power_w if size_caps is not None else 0.0
                energy_kwh = (power_w * loaded + idle_w * (n_engines - loaded)) * 3600.0 / 3.6e6
                storage = carbon.cache_tiers_embodied_g(
                    dram_bytes=size if tier == "dram" else 0, disk_bytes=size if tier == "disk" else 0,
                    duration_s=3600.0, params=inputs.params)  # GreenCache Eq. 4 per tier
                # The target is the size of each of the pool's LMCache servers (one beside each engine).
                operational = carbon.operational_g(energy_kwh=energy_kwh, ci_g_per_kwh=ci[h], pue=pue)
                row_c.append(operational + storage * n_engines)
                row_o.append(operational)
                row_a.append(a_ttft)
                row_b.append(a_tpot)
            carbon_rows.append(row_c)
            operational_rows.append(row_o)
            ttft_rows.append(row_a)
            tpot_rows.append(row_b)
            requests.append(rates[h] * 3600.0)
        model = PoolCacheModel(pool.name, tier, sizes, requests, carbon_rows, ttft_rows, tpot_rows,
                               pool.slo.attainment_fraction, grid.source, ci, servers=n_engines,
                               capabilities=size_caps)
        if tier == "dram":
            dram_now = inputs.cache_sizes.get(pool.name, (0, 0))[0]
            self.charge_restarts(model, operational_rows, dram_now)
        return model

    @staticmethod
    def size_capabilities(inputs: PlanningInputs, pool: common_pb2.Pool, profile: str,
                          sizes: list[int]) -> list[Capability] | None:
        """Per DRAM size, one engine's capability with that tier: ``capacity.predict`` with the pool's measured
        prefix reuse (``inputs.prefix_hit_fraction``) and the size, so that a size whose hits raise the capacity
        shows the engines it lets routing unload. Only for engines whose capability is a simulator prediction
        (a measured profile has no size to vary) and a pool with reuse measured; otherwise None. Up to
        ``CAPACITY_SIZES`` sizes are predicted (cached by ``capacity.predict``); a size between two of them gets
        the capability of the largest predicted size below it (more DRAM never lowers the hit rate: conservative)."""
        hits = inputs.prefix_hit_fraction.get(pool.name, 0.0)
        cap = inputs.capabilities.get(pool.engines[0].id)
        if hits <= 0 or cap is None or cap.source != "predicted" or len(sizes) < 2:
            return None
        prompt = pool.mean_prompt_tokens or capacity.DEFAULT_PROMPT_TOKENS
        output = pool.mean_output_tokens or capacity.DEFAULT_OUTPUT_TOKENS
        picked = sorted({int(round(i)) for i in np.linspace(0, len(sizes) - 1, min(CAPACITY_SIZES, len(sizes)))})
        predicted = {i: capacity.predict(profile, pool.slo.ttft_s, pool.slo.tpot_s, pool.slo.attainment_fraction,
                                         prompt, output, hits, sizes[i]) for i in picked}
        return [predicted[max(i for i in picked if i <= k)] for k in range(len(sizes))]

    def charge_restarts(self, m: PoolCacheModel, operational_g: list[list[float]], size_in_force: int) -> None:
        """An L1 (DRAM) resize restarts LMCache, which loses every L1 object (docs/cache_manager.md: L1 objects
        16 -> 0). Leaving size ``k`` at the start of hour ``t`` is charged the hits that content would have served
        while the new L1 refills: the energy the cache of size ``k`` saves in hour ``t`` (operational carbon at size
        0 minus at size ``k``, at the hour's forecast rate and CI) over ``restart_warmup_s``, halved for a linear
        refill. An upper bound where a disk tier survives the restart (its prefixes come back by an L2 reload, not a
        recompute); the attainment lost during the refill is not charged."""
        factor = 0.5 * self.restart_warmup_s / 3600.0
        m.restart_g = [[factor * max(0.0, row[0] - v) for v in row] for row in operational_g]
        if size_in_force in m.sizes:
            m.in_force_index = m.sizes.index(size_in_force)
        else:
            m.in_force_index = -1
        m.in_force_restart_g = float(np.interp(size_in_force, m.sizes, m.restart_g[0])) if m.restart_g else 0.0

    @staticmethod
    def _storage_g(m: PoolCacheModel, size: int, inputs: PlanningInputs) -> float:
        return m.servers * carbon.cache_tiers_embodied_g(dram_bytes=size if m.tier == "dram" else 0,
                                                         disk_bytes=size if m.tier == "disk" else 0,
                                                         duration_s=3600.0, params=inputs.params)

    def solve(self, inputs: PlanningInputs) -> KnobPlan:
        started = time.perf_counter()
        models = [m for m in (self.pool_model(inputs, p) for p in inputs.fleet.pools) if m is not None]
        build_s = time.perf_counter() - started
        hours = inputs.horizon_hours
        modelled = {m.pool for m in models}
        # Pools without a declared cache limit keep the sizes in force (the keep-current rule).
        kept = KeepCurrent("cache_targets").solve(inputs).per_interval
        per_interval: list[list[common_pb2.CacheTarget]] = [
            [t for t in kept[h] if t.pool not in modelled] for h in range(hours)]
        if not models:
            return KnobPlan(per_interval, detail="no pool declares a cache limit (max_cache_dram/disk_bytes): "
                                                 "sizes in force kept", status="kept")
        chosen, status, _, gap = solve_ilp(models, per_hour_slo=self.per_hour_slo,
                                           fleet_limit_bytes=inputs.fleet.max_cache_storage_bytes,
                                           time_limit_s=self.time_limit_s)
        lines = []
        unreachable = []
        if not chosen:
            unreachable = [m.pool for m in models]
            chosen = {m.pool: fallback_best_attainment(m) for m in models}
        current = inputs.current_interval(0)
        for m in models:
            # The tier not sized keeps what is in force (a 0 would ask LMCache to drop it).
            dram_now, disk_now = inputs.cache_sizes.get(m.pool, (0, 0))
            size_now = (disk_now if m.tier == "disk" else dram_now) if m.pool in inputs.cache_sizes else None
            picks, kept_why = keep_unless_it_matters(m, chosen[m.pool], size_now, self.per_hour_slo)
            chosen[m.pool] = picks
            for h, k in enumerate(picks):
                size = m.sizes[k]
                per_interval[h].append(common_pb2.CacheTarget(
                    pool=m.pool, dram_bytes=size if m.tier == "dram" else dram_now,
                    disk_bytes=size if m.tier == "disk" else disk_now))
            plan_g = total_carbon(m, picks)
            none_g = total_carbon(m, [0] * hours)
            full_g = total_carbon(m, [len(m.sizes) - 1] * hours)
            size0 = m.sizes[picks[0]]
            was = ""
            if current is not None:
                old = next((t for t in current.cache_targets if t.pool == m.pool), None)
                if old is not None:
                    old_size = old.disk_bytes if m.tier == "disk" else old.dram_bytes
                    if old_size != size0:
                        was = f", was {_size_text(old_size)}"
            why = kept_why or self._why(m, picks, size_now, inputs)
            lines.append(
                f"pool {m.pool}: {m.tier} cache {_size_text(size0)}{was}: {why}; expected attainment "
                f"{attainment(m, picks):.2f} (target {m.rho:.2f}); over {hours} h saves "
                f"{_pct(full_g, plan_g)} vs Full Cache ({_size_text(m.sizes[-1])}) and {_pct(none_g, plan_g)} vs "
                f"No Cache; profile {m.source}" + self._restart_text(m, picks, unreachable))
        if unreachable:
            lines.append("cache: no size assignment meets the SLO for " + ", ".join(unreachable)
                         + " (HiGHS: infeasible); the best-attaining sizes were taken")
        sized = [(m, pool_caps) for m in models if (pool_caps := m.capabilities) is not None]
        caps_per_interval = None
        if sized:  # the engines' capacity at the chosen sizes, for routing and the plan's figures
            caps_per_interval = []
            for h in range(hours):
                caps = dict(inputs.capabilities_at(h))
                for m, pool_caps in sized:
                    for engine in inputs.pool(m.pool).engines:
                        caps[engine.id] = pool_caps[chosen[m.pool][h]]
                caps_per_interval.append(caps)
            lines.extend(f"pool {m.pool}: engine capacity "
                         f"{pool_caps[chosen[m.pool][0]].capacity_requests_per_s:.2f} req/s with the chosen DRAM "
                         f"tier ({pool_caps[0].capacity_requests_per_s:.2f} without); sizes weighed with the "
                         f"engines routing loads at each" for m, pool_caps in sized)
        detail = (f"{len(models)} pool(s) x {hours} h, {status.lower()} (gap {gap:.2g}), "
                  f"profiles {build_s:.2f} s, total {time.perf_counter() - started:.2f} s"
                  + ("; per-hour SLO" if self.per_hour_slo else "; SLO over the horizon (global rho)"))
        return KnobPlan(per_interval, explanation=lines, detail=detail, capabilities=caps_per_interval)


    def _why(self, m: PoolCacheModel, picks: list[int], size_now: int | None, inputs: PlanningInputs) -> str:
        """The figures of hour 0 that decided: the chosen size's embodied carbon and energy against the size in
        force (else against the next size up, or no cache), and over the horizon what the choice saves."""
        k0 = picks[0]
        k_now = m.sizes.index(size_now) if size_now in m.sizes else None
        ref = k_now if k_now is not None and k_now != k0 else (min(1, len(m.sizes) - 1) if k0 == 0 else 0)

        def figures(k: int) -> str:
            storage = self._storage_g(m, m.sizes[k], inputs)
            return (f"{_size_text(m.sizes[k])}: {_grams(storage)}/h embodied + {_grams(m.carbon_g[0][k] - storage)}"
                    f"/h of energy")

        why = f"CI forecast {m.ci[0]:.0f} g/kWh; {figures(k0)}" + ("" if ref == k0 else f", against {figures(ref)}")
        a0, a_ref = min(m.ttft[0][k0], m.tpot[0][k0]), min(m.ttft[0][ref], m.tpot[0][ref])
        if ref != k0 and abs(a0 - a_ref) > 0.005:
            why += f"; hour 0 attainment {a0:.3f} against {a_ref:.3f}"
        if k_now is not None and picks != [k_now] * len(picks):
            gain = plan_cost(m, [k_now] * len(picks)) - plan_cost(m, picks)
            why += (f"; over {len(picks)} h the sizes chosen emit {_grams(abs(gain))} "
                    f"{'less' if gain >= 0 else 'more (the SLO needs them)'} than keeping {_size_text(m.sizes[k_now])}")
        return why

    def _restart_text(self, m: PoolCacheModel, picks: list[int], unreachable: list[str]) -> str:
        """What the plan's L1 restarts cost, and what the plan would do if they were free."""
        if m.restart_g is None:
            return ""
        count, charge = restart_charge(m, picks)
        text = (f"; {count} L1 resize(s), each a restart that empties L1: charged "
                + (f"{_grams(charge)} (lost hits recomputed over a {self.restart_warmup_s:.0f} s refill)" if count
                   else "nothing"))
        if m.pool in unreachable:
            return text
        free = PoolCacheModel(m.pool, m.tier, m.sizes, m.requests, m.carbon_g, m.ttft, m.tpot, m.rho, m.source, m.ci)
        free_picks, status, _, _ = solve_ilp([free], per_hour_slo=self.per_hour_slo, time_limit_s=self.time_limit_s)
        saved = total_carbon(m, picks) - total_carbon(m, free_picks[m.pool]) if status == "Optimal" else 0.0
        if saved > MIN_RESIZE_GAIN_FRACTION * total_carbon(m, picks):  # a difference that tells, not noise
            n_free, charge_free = restart_charge(m, free_picks[m.pool])
            text += (f"; with free restarts the plan would resize {n_free} time(s), {_grams(saved)} less carbon "
                     f"but {_grams(charge_free)} of restarts")
        return text


# A resize must change the pool's modelled carbon over the horizon by more than this fraction (of keeping the size
# in force), else the size in force is kept: below it the deciding figures are noise of the model (the demo's 1 GiB
# L1 at 0.0015 g/h embodied against no energy saved), and each DRAM resize restarts LMCache and empties L1.
MIN_RESIZE_GAIN_FRACTION = 1e-3


def _grams(g: float) -> str:
    """Grams to three significant digits (0.00147 g, not 0.0 g)."""
    return f"{g:.0f} g" if abs(g) >= 100 else f"{g:.3g} g"


def plan_cost(m: PoolCacheModel, picks: list[int]) -> float:
    """What the ILP minimises for one pool: carbon plus the restart charges of the resizes."""
    return total_carbon(m, picks) + restart_charge(m, picks)[1]


def meets_slo(m: PoolCacheModel, picks: list[int], per_hour_slo: bool) -> bool:
    if per_hour_slo:
        return all(min(m.ttft[t][k], m.tpot[t][k]) >= m.rho - 1e-9 for t, k in enumerate(picks))
    return attainment(m, picks) >= m.rho - 1e-9


def keep_unless_it_matters(m: PoolCacheModel, picks: list[int], size_now: int | None,
                           per_hour_slo: bool) -> tuple[list[int], str]:
    """``picks``, or the size in force throughout when it meets the SLO and the picks would save no more than
    ``MIN_RESIZE_GAIN_FRACTION`` of its carbon (then with the reason, figures included). Nothing changes when the
    size in force is unknown or not a candidate size."""
    if size_now is None or size_now not in m.sizes:
        return picks, ""
    keep = [m.sizes.index(size_now)] * len(picks)
    if picks == keep or not meets_slo(m, keep, per_hour_slo):
        return picks, ""
    keep_g = plan_cost(m, keep)
    gain = keep_g - plan_cost(m, picks)
    if gain > MIN_RESIZE_GAIN_FRACTION * keep_g:
        return picks, ""
    return keep, (f"kept: the best resize ({_size_text(m.sizes[picks[0]])} in hour 0) would save {_grams(gain)} over "
                  f"{len(picks)} h, {gain / keep_g if keep_g > 0 else 0:.2%} of the pool's {_grams(keep_g)} (a resize "
                  f"needs over {MIN_RESIZE_GAIN_FRACTION:.1%}); CI forecast {m.ci[0]:.0f} g/kWh")


def _pct(base: float, plan: float) -> str:
    if base <= 0:
        return "0 %"
    saved = (base - plan) / base
    return f"{saved:.1%}" if abs(saved) >= 0.0005 or saved == 0 else f"{saved * 100:.2g} %"  # not "-0.0%"
