"""One coupled decision per pool and hour: the engines that carry traffic, the DRAM cache size, the SM clock and which
idle engines sleep, chosen together by one MILP on HiGHS, robust to the load forecast's error.

Why coupled. The capacity of an engine depends on the other knobs: a DRAM tier raises the prefix-hit fraction, which
cuts prefill work and raises the rate an engine carries within the SLO; a lower SM clock lowers the energy of every
token and the capacity with it. Solved apart (routing on one engine while the cache solver drops the cache in the
same hour) the knobs can pair an engine with a cache too small for its load. Here each pool-hour picks one
**option** ``(engines carrying traffic n, DRAM size k, clock f)``; the option's capacity is the simulator's prediction
for that cache size and clock (``capacity.predict`` on the pool's measured prefix reuse: conversations replayed
through one engine with its own HBM and that DRAM tier, its SM clock locked at ``f``, ``greenserve.simulator.
clocks``), so no option can promise a capacity that its own cache and clock do not give.

Robust. An option is allowed only when the busiest of its ``n`` engines stays within ``headroom x capacity`` at the
hour's **planning load** ``L`` (``planning_load``: the forecast mean x the pool's load margin, a chance constraint
learned from backtests of the load forecast, or the upper bound of the forecast's interval without one), with the capacity
predicted at the **attainment floor** (``max(pool target, attainment_floor_fraction)``). The busiest engine carries
more than ``L / n``: the router keeps a conversation on one engine for its prefix, so the engines share
conversations, not requests (``affinity_imbalance``). The load margin is learned from backtests of the load
forecast (``PlanningInputs.load_margin``: the 95th percentile of actual / forecast over past days). An hour where no option carries ``L`` takes every engine, the largest cache and the full clock
(the most capacity there is) and the plan says the SLO is at risk.

Objective over the horizon, per pool ``p``:

    minimise  sum_{t,o} x[t,o] (operational_g[t,o] + storage_g[t,o])                     (carbon of the hour)
            + sum_t restart_g[t] r[t] + wake_g w[t] + switch_g (s[t] + c[t])            (change costs)
    s.t.      sum_o x[t,o] = 1                                                           (one option per hour)
              r[t] >= sum_{o: k(o)=k} x[t,o] - sum_{o: k(o)=k} x[t-1,o]   for every size k   (a DRAM restart)
              c[t] >= sum_{o: f(o)=f} x[t,o] - sum_{o: f(o)=f} x[t-1,o]   for every clock f  (a clock change)
              w[t] >= sum_o n(o) x[t,o] - sum_o n(o) x[t-1,o]                           (engines woken / loaded)
              s[t] >= sum_o n(o) x[t-1,o] - sum_o n(o) x[t,o]                           (engines unloaded)
              sum_t r[t] <= max DRAM restarts over the horizon (4 per day)

``t-1`` of hour 0 is the state in force. ``operational_g = (n (idle + e(L_mean/n, k, f) L_mean/n) + (N - n)
P_rest) x 1 h x PUE x CI``, with ``e`` the dynamic energy per request the prediction replayed at that per-engine rate
and ``P_rest`` the draw of an engine without traffic: its idle power awake, ``asleep_power_w`` asleep; it sleeps
(``engine_runs``) only when that saves more than waking it costs (``wake_energy_j`` charged per engine woken).
``storage_g`` is the DRAM's embodied carbon for the hour on each of the pool's LMCache servers (GreenCache Eq. 4).
A restart is charged what the emptied L1 would have saved while it refills (as ``GreenCacheIlp.charge_restarts``).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import highspy
import numpy as np
from greenserve.common import carbon
from greenserve.optimizer import capacity
from greenserve.optimizer.capacity import Capability
from greenserve.optimizer.inputs import engine_hardware
from greenserve.optimizer.planning import KnobPlan, PlanningInputs, PoolFigures, keep_current_messages
from greenserve.optimizer.solvers.cache_greencache import pool_profile
from greenserve.simulator.clocks import CLOCK_FRACTIONS, clocked_profile, max_sm_clock_mhz
from greenserve.simulator.engine_profile import load_profile
from greenserve.v1 import common_pb2

DEFAULT_ATTAINMENT_FLOOR = 0.95
DEFAULT_HEADROOM = 0.9
MAX_RESTARTS_PER_DAY = 4
DRAM_SIZES = 3  # DRAM sizes weighed: none, half and the pool's largest (each a capacity prediction per clock)
SWITCH_G = 0.5  # a nominal charge per change of clock or of loaded engines, so equal-cost plans do not flap
DEFAULT_WAKE_S = 30.0  # vLLM wake-up from sleep level 1 (weights back from host memory) at full power, assumption
TIME_LIMIT_S = 5.0
DEFAULT_MIN_ENGINES = 2
IMBALANCE_Z = 1.645  # the busiest engine sized for the 95th percentile of its share of conversations


@dataclass(frozen=True)
class Option:
    engines: int  # engines carrying traffic
    size_index: int
    clock_index: int


@dataclass
class PoolModel:
    """One pool's options, costs and predictions over the horizon."""

    pool: str
    n_engines: int
    sizes: list[int]
    clocks: list[float]
    capabilities: dict[tuple[int, int], Capability]  # (size index, clock index) -> one engine's capability
    options: list[list[Option]]  # per hour, the options allowed
    cost_g: list[list[float]]  # per hour and option: operational + storage carbon
    restart_g: list[float]  # per hour: charge of a DRAM restart at its start
    wake_g: float  # per engine woken (0 when engines do not sleep)
    sleeps: bool  # engines without traffic sleep (asleep draw + wake-up cost below the idle draw)
    plan_load: list[float]
    mean_load: list[float]
    upper_load: list[float]
    ci: list[float]
    at_risk: list[bool] = field(default_factory=list)  # hours where no option carries the planning load
    in_force: Option | None = None
    restarts_done: int = 0  # DRAM restarts in the 24 h before the horizon
    rest_w: float = 0.0  # draw of an engine without traffic (asleep when ``sleeps``)
    derate: float = 1.0  # share of the predicted capacity the plan counts (``PlanningInputs.capacity_derate``)
    # per hour, the options that carry the load only with a warm DRAM tier: the hour before must run the same size
    needs_warm: list[set[Option]] = field(default_factory=list)
    idle_w: float = 0.0  # draw of an awake engine without traffic


def planning_load(mean: float, upper: float, margin: float | None) -> float:
    """The load an hour's capacity must carry: ``mean x margin`` when the pool's forecast has a margin learned from
    backtests (a chance constraint: the quantile of actual / forecast over past days, so the hour's load stays under
    it with that probability), else the upper bound of the forecast's interval."""
    if margin is None or not math.isfinite(margin) or margin <= 0:
        return max(upper, mean)
    return mean * margin


def affinity_imbalance(engines: int, load_per_s: float, think_s: float = capacity.THINK_TIME_S,
                       z: float = IMBALANCE_Z) -> float:
    """How much more than ``load / engines`` the busiest engine carries when a conversation's turns stay on one
    engine (prefix affinity spreads conversations, not requests): with ``A = load x think_s`` conversations active
    at once, each engine's count is Binomial(A, 1 / n), whose standard deviation relative to its mean is
    ``sqrt((n - 1) / A)``; the plan sizes for ``z`` of them above the mean (1 for one engine or no load)."""
    active = load_per_s * think_s
    if engines <= 1 or active <= 0:
        return 1.0
    return 1.0 + z * math.sqrt((engines - 1) / active)


@functools.lru_cache(maxsize=256)
def _storage_g(size_bytes: int, params: Any) -> float:
    """Embodied carbon of one LMCache server's DRAM tier of ``size_bytes`` for an hour (GreenCache Eq. 4)."""
    return carbon.cache_tiers_embodied_g(dram_bytes=size_bytes, disk_bytes=0, duration_s=3600.0, params=params)


def _sizes(limit: int) -> list[int]:
    if limit <= 0:
        return [0]
    return sorted({int(limit * i / (DRAM_SIZES - 1)) for i in range(DRAM_SIZES)})


class CoupledSolver:
    """The coupled decision: routing weights, cache sizes, engine run states and GPU clocks from one model."""

    knob = "routing_weights"
    knobs = ("routing_weights", "cache_targets", "engine_runs", "gpu_power")
    name = "coupled.milp"

    def __init__(self, *, attainment_floor_fraction: float = DEFAULT_ATTAINMENT_FLOOR,
                 headroom_fraction: float = DEFAULT_HEADROOM, clocks: tuple[float, ...] = CLOCK_FRACTIONS,
                 max_restarts_per_day: int = MAX_RESTARTS_PER_DAY, asleep_power_w: float | None = None,
                 wake_s: float = DEFAULT_WAKE_S, time_limit_s: float = TIME_LIMIT_S,
                 min_engines: int = DEFAULT_MIN_ENGINES) -> None:
        if not 0 < attainment_floor_fraction < 1:
            raise ValueError("attainment_floor_fraction: must be in (0, 1)")
        if not 0 < headroom_fraction <= 1:
            raise ValueError("headroom_fraction: must be in (0, 1]")
        if not clocks or any(not 0 < f <= 1 for f in clocks):
            raise ValueError("clocks: fractions in (0, 1]")
        if min_engines < 1:
            raise ValueError("min_engines: must be >= 1")
        if max_restarts_per_day < 0:
            raise ValueError("max_restarts_per_day: must be >= 0")
        if asleep_power_w is not None and not (asleep_power_w >= 0 and math.isfinite(asleep_power_w)):
            raise ValueError("asleep_power_w: must be a finite number >= 0")
        self.floor = attainment_floor_fraction
        # Engines kept loaded in every pool (as many as it has, when fewer): with one engine a crash leaves nothing
        # to fail over to, and all of the load's burstiness lands on it.
        self.min_engines = min_engines
        self.headroom = headroom_fraction
        self.clocks = tuple(sorted(set(clocks), reverse=True))
        self.max_restarts_per_day = max_restarts_per_day
        # What a sleeping engine's GPU draws. None: the profile's idle power (the simulator's idle is the bare GPU
        # idle an awake engine also draws, so by default sleeping saves nothing and no engine is put to sleep).
        self.asleep_power_w = asleep_power_w
        self.wake_s = wake_s
        self.time_limit_s = time_limit_s

    # -- the model ------------------------------------------------------------------------------------------------
    @staticmethod
    def uniform(inputs: PlanningInputs, pool: common_pb2.Pool) -> bool:
        """The pool's engines are alike (same hardware and variant, capabilities predicted by the simulator): one
        engine's prediction per cache size and clock stands for each of them."""
        first = pool.engines[0]
        cap = inputs.capabilities.get(first.id)
        return (cap is not None and cap.source == "predicted" and not first.mig_uuid
                and all(e.hardware == first.hardware and e.model_variant == first.model_variant and not e.mig_uuid
                        and inputs.capabilities.get(e.id) is not None for e in pool.engines))

    def _capabilities(self, inputs: PlanningInputs, pool: common_pb2.Pool, sizes: list[int],
                      clocks: list[float]) -> dict[tuple[int, int], Capability]:
        target = max(pool.slo.attainment_fraction, self.floor)
        profile = load_profile(pool_profile(inputs, pool))
        hits = inputs.prefix_hit_fraction.get(pool.name, 0.0)
        prompt = pool.mean_prompt_tokens or capacity.DEFAULT_PROMPT_TOKENS
        output = pool.mean_output_tokens or capacity.DEFAULT_OUTPUT_TOKENS
        out = {}
        for ki, size in enumerate(sizes):
            for ci, f in enumerate(clocks):
                out[(ki, ci)] = capacity.predict(clocked_profile(profile, f), pool.slo.ttft_s, pool.slo.tpot_s,
                                                 target, prompt, output, hits, size if hits > 0 else 0)
        return out

    def pool_model(self, inputs: PlanningInputs, pool: common_pb2.Pool) -> PoolModel | None:
        """The pool's options over the horizon; None for a pool this model does not cover (no engines, or engines
        that are not alike: ``solve_knobs`` fills those cheapest engine first)."""
        if not pool.engines or not self.uniform(inputs, pool):
            return None
        hours = inputs.horizon_hours
        limit = int(pool.max_cache_dram_bytes)
        sizes = _sizes(limit)
        clocks = list(self.clocks)
        in_force_dram = inputs.cache_sizes.get(pool.name, (None, 0))[0]
        if inputs.prefix_hit_fraction.get(pool.name, 0.0) <= 0 and len(sizes) > 1:
            # No prefix reuse measured yet: what a DRAM tier is worth is unknown, so the size in force is kept (the
            # largest when none is known: today's Full Cache), not dropped for a saving nobody can predict.
            sizes = [min(in_force_dram, limit) if in_force_dram is not None else sizes[-1]]
        caps = self._capabilities(inputs, pool, sizes, clocks)
        n_engines = len(pool.engines)
        fc = inputs.load.get(pool.name)
        margin = inputs.load_margin.get(pool.name)
        mean = [fc.mean[h] if fc else 0.0 for h in range(hours)]
        upper = [max(fc.upper[h], fc.mean[h]) if fc else 0.0 for h in range(hours)]
        plan_load = [planning_load(mean[h], upper[h], margin) for h in range(hours)]
        ci = [inputs.ci[pool.region].mean[h] if pool.region in inputs.ci else 0.0 for h in range(hours)]
        pue = inputs.params.pue
        idle_w = next(iter(caps.values())).idle_power_w
        asleep_w = idle_w if self.asleep_power_w is None else min(self.asleep_power_w, idle_w)
        peak_w = max(c.power_w(c.capacity_requests_per_s) for c in caps.values())
        wake_kwh = peak_w * self.wake_s / 3.6e6
        mean_ci = float(np.mean(ci)) if ci else 0.0
        wake_g = carbon.operational_g(energy_kwh=wake_kwh, ci_g_per_kwh=mean_ci, pue=pue)
        sleeps = idle_w - asleep_w > 0 and (idle_w - asleep_w) * 3600.0 / 3.6e6 * mean_ci * pue > wake_g
        rest_w = asleep_w if sleeps else idle_w
        derate = min(1.0, max(0.0, inputs.capacity_derate.get(pool.name, 1.0)))
        options, costs, at_risk, restart_g = [], [], [], []
        fewest = min(self.min_engines, n_engines)
        cold: list[set[Option]] = []  # per hour, options whose load needs a warm DRAM tier (no restart into them)
        for h in range(hours):
            allowed, row, needs_warm = [], [], set()
            for (ki, fi), cap in caps.items():
                for n in range(fewest, n_engines + 1):
                    busiest = plan_load[h] / n * affinity_imbalance(n, plan_load[h])
                    if busiest > self.headroom * derate * cap.capacity_requests_per_s + 1e-12:
                        continue
                    row.append(self._hour_cost(inputs, pool, cap, n, n_engines, mean[h], rest_w, sizes[ki], ci[h],
                                               pue))
                    allowed.append(Option(n, ki, fi))
                    # A resize restarts LMCache with an empty L1: until it refills the engines serve as without it.
                    if ki > 0 and busiest > self.headroom * derate * caps[(0, fi)].capacity_requests_per_s + 1e-12:
                        needs_warm.add(allowed[-1])
            cold.append(needs_warm)
            risk = not allowed
            if risk:  # no option carries the planning load: the most capacity there is
                ki, fi = max(caps, key=lambda key: caps[key].capacity_requests_per_s)
                allowed = [Option(n_engines, ki, fi)]
                row = [self._hour_cost(inputs, pool, caps[(ki, fi)], n_engines, n_engines, mean[h], rest_w,
                                       sizes[ki], ci[h], pue)]
            options.append(allowed)
            costs.append(row)
            at_risk.append(risk)
            # A restart empties L1: charged what the largest cache saves in the hour over half a 10-minute refill.
            best_no_cache = min((c for o, c in zip(allowed, row) if o.size_index == 0), default=0.0)
            best_cache = min((c for o, c in zip(allowed, row) if o.size_index > 0), default=best_no_cache)
            restart_g.append(max(0.0, best_no_cache - best_cache) * 0.5 * 600.0 / 3600.0 + SWITCH_G)
        model = PoolModel(pool.name, n_engines, sizes, clocks, caps, options, costs, restart_g,
                          wake_g if sleeps else 0.0, sleeps, plan_load, mean, upper, ci, at_risk)
        # an hour whose every option needs a warm L1 keeps them all (nothing colder carries its load either)
        model.needs_warm = [c if not at_risk[h] and len(c) < len(options[h]) else set() for h, c in enumerate(cold)]
        model.rest_w, model.idle_w, model.derate = rest_w, idle_w, derate
        model.in_force = self._in_force(inputs, pool, model)
        model.restarts_done = max(0, int(inputs.dram_restarts_last_day.get(pool.name, 0)))
        return model

    @staticmethod
    def _hour_cost(inputs: PlanningInputs, pool: common_pb2.Pool, cap: Capability, n: int, n_engines: int,
                   mean_load: float, rest_w: float, size: int, ci: float, pue: float) -> float:
        rate = mean_load / n
        loaded_w = cap.idle_power_w + cap.energy_per_request_at_j(rate) * rate
        energy_kwh = (n * loaded_w + (n_engines - n) * rest_w) * 3600.0 / 3.6e6
        return energy_kwh * ci * pue + n_engines * _storage_g(size, inputs.params)

    @staticmethod
    def _in_force(inputs: PlanningInputs, pool: common_pb2.Pool, m: PoolModel) -> Option | None:
        """The option the plan in force runs now (its first interval), matched to the nearest candidate."""
        interval = inputs.current_interval(0)
        if interval is None:
            return None
        weights = [w for w in interval.routing_weights if w.pool == pool.name]
        loaded = sum(1 for w in weights if w.weight > 0) or m.n_engines
        dram = inputs.cache_sizes.get(pool.name, (None, 0))[0]
        if dram is None:
            dram = next((t.dram_bytes for t in interval.cache_targets if t.pool == pool.name), m.sizes[-1])
        ki = min(range(len(m.sizes)), key=lambda i: abs(m.sizes[i] - dram))
        if m.sizes[ki] != dram:
            ki = -1  # a size that is no candidate: any size is a restart
        power = next((g for g in interval.gpu_power if g.pool == pool.name), None)
        f = power.sm_clock_fraction if power is not None and power.sm_clock_fraction > 0 else 1.0
        fi = min(range(len(m.clocks)), key=lambda i: abs(m.clocks[i] - f))
        return Option(min(loaded, m.n_engines), ki, fi)

    # -- the MILP -------------------------------------------------------------------------------------------------
    def solve_pool(self, m: PoolModel) -> tuple[list[Option], str]:
        """The option per hour minimising carbon plus change costs (see the module docstring), by HiGHS."""
        hours = len(m.options)
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", self.time_limit_s)
        h.setOptionValue("threads", 1)
        inf = highspy.kHighsInf
        x_index: list[list[int]] = []
        col = 0
        costs, lower, upper, integrality = [], [], [], []

        def add(cost: float, hi: float, integer: bool) -> int:
            nonlocal col
            costs.append(cost)
            lower.append(0.0)
            upper.append(hi)
            integrality.append(highspy.HighsVarType.kInteger if integer else highspy.HighsVarType.kContinuous)
            col += 1
            return col - 1

        for t in range(hours):
            x_index.append([add(c, 1.0, True) for c in m.cost_g[t]])
        r = [add(m.restart_g[t], 1.0, False) for t in range(hours)]
        c = [add(SWITCH_G, 1.0, False) for t in range(hours)]
        # per hour and engine count level n: the n-th engine loaded (w) or unloaded (s) at the hour's start; one
        # indicator per level (not one for the count) keeps the LP relaxation tight
        w = [[add(m.wake_g + SWITCH_G, 1.0, False) for _ in range(m.n_engines)] for t in range(hours)]
        s = [[add(SWITCH_G, 1.0, False) for _ in range(m.n_engines)] for t in range(hours)]
        rows: list[tuple[list[int], list[float], float, float]] = []
        for t in range(hours):
            rows.append((x_index[t], [1.0] * len(x_index[t]), 1.0, 1.0))

        # pred(option): its callers' lambdas bind the loop's values as default arguments, hence the open signature
        def level(t: int, pred: Callable[..., bool]) -> tuple[list[int], list[float], float]:
            """Columns and coefficients of sum_{o: pred(o)} x[t,o] (or its constant for the state in force)."""
            if t >= 0:
                idx = [x_index[t][j] for j, o in enumerate(m.options[t]) if pred(o)]
                return idx, [1.0] * len(idx), 0.0
            return [], [], 1.0 if m.in_force is not None and pred(m.in_force) else 0.0

        for t in range(hours):
            if t == 0 and m.in_force is None:
                continue  # nothing in force: the first hour changes nothing
            for attr, levels, var in (("size_index", range(len(m.sizes)), r), ("clock_index", range(len(m.clocks)), c)):
                for v in levels:
                    now_i, now_c, _ = level(t, lambda o, a=attr, v=v: getattr(o, a) == v)
                    prev_i, prev_c, prev_k = level(t - 1, lambda o, a=attr, v=v: getattr(o, a) == v)
                    # var[t] - now + prev >= 0  (prev may be a constant)
                    rows.append(([var[t], *now_i, *prev_i], [1.0, *[-x for x in now_c], *prev_c], -prev_k, inf))
            for n in range(1, m.n_engines + 1):  # u_n(t) = sum of x[t,o] with at least n engines loaded
                now_i, now_c, _ = level(t, lambda o, n=n: o.engines >= n)
                prev_i, prev_c, prev_k = (level(t - 1, lambda o, n=n: o.engines >= n) if t > 0 or m.in_force
                                          else ([], [], 0.0))
                if t == 0 and m.in_force is None:
                    prev_k = 1.0 if n <= m.n_engines else 0.0
                rows.append(([w[t][n - 1], *now_i, *prev_i], [1.0, *[-x for x in now_c], *prev_c], -prev_k, inf))
                rows.append(([s[t][n - 1], *now_i, *prev_i], [1.0, *now_c, *[-x for x in prev_c]], prev_k, inf))
        # An option that needs a warm L1 follows an hour of the same DRAM size: x[t,o] <= sum_{o' same size} x[t-1,o'].
        for t in range(hours):
            for j, o in enumerate(m.options[t]):
                if o not in (m.needs_warm[t] if t < len(m.needs_warm) else ()):
                    continue
                prev_i, prev_c, prev_k = level(t - 1, lambda q, k=o.size_index: q.size_index == k)
                if t == 0 and m.in_force is None:
                    continue  # nothing in force: the first plan's sizes are where the fleet starts
                rows.append(([x_index[t][j], *prev_i], [1.0, *[-x for x in prev_c]], -inf, prev_k))
        # At most max_restarts_per_day in any day: in the first 24 h of the horizon those already made in the day
        # before it count; each further day of the horizon has its own budget.
        for day_start in range(0, hours, 24):
            cols = r[day_start:day_start + 24]
            budget = max(0, self.max_restarts_per_day - (m.restarts_done if day_start == 0 else 0))
            rows.append((cols, [1.0] * len(cols), -inf, float(budget)))
        h.addVars(col, np.array(lower), np.array(upper))
        h.changeColsCost(col, np.arange(col, dtype=np.int32), np.array(costs))
        starts: list[int] = []
        index: list[int] = []
        value: list[float] = []
        for idx, vals, _, _ in rows:
            starts.append(len(index))
            index.extend(idx)
            value.extend(vals)
        h.addRows(len(rows), np.array([r[2] for r in rows]), np.array([r[3] for r in rows]), len(index),
                  np.array(starts, dtype=np.int32), np.array(index, dtype=np.int32), np.array(value))
        # The LP relaxation first: the one-option-per-hour rows with the change indicators make it integral in
        # most instances, and an integral LP optimum is the MILP's optimum, found at a tenth of the MIP's cost; the
        # branch and bound runs only when some x is fractional.
        h.run()
        x_cols = [i for row in x_index for i in row]
        if h.getInfo().primal_solution_status == 2:
            values = h.getSolution().col_value
            if all(min(values[i], 1.0 - values[i]) <= 1e-7 for i in x_cols):
                return [m.options[t][int(np.argmax([values[i] for i in x_index[t]]))] for t in range(hours)], \
                    "Optimal (LP relaxation integral)"
        h.changeColsIntegrality(col, np.arange(col, dtype=np.int32), np.array(integrality))
        h.run()
        status = h.modelStatusToString(h.getModelStatus())
        if status not in ("Optimal", "Time limit reached") or h.getInfo().primal_solution_status != 2:
            return self._steady(m), status
        values = h.getSolution().col_value
        return [m.options[t][int(np.argmax([values[i] for i in x_index[t]]))] for t in range(hours)], status

    @staticmethod
    def _steady(m: PoolModel) -> list[Option]:
        """Without a MILP answer: no DRAM restart at all (the size in force, else the largest), each hour the
        cheapest option of that size that carries its load (the most capacity there is when none does)."""
        keep = m.in_force.size_index if m.in_force is not None and m.in_force.size_index >= 0 else len(m.sizes) - 1
        picks = []
        for t, options in enumerate(m.options):
            same = [j for j, o in enumerate(options) if o.size_index == keep]
            j = min(same, key=lambda i: m.cost_g[t][i]) if same else int(np.argmax(
                [m.capabilities[(o.size_index, o.clock_index)].capacity_requests_per_s * o.engines for o in options]))
            picks.append(options[j])
        return picks

    # -- the answer -----------------------------------------------------------------------------------------------
    def solve_knobs(self, inputs: PlanningInputs) -> dict[str, KnobPlan]:
        started = time.perf_counter()
        hours = inputs.horizon_hours
        routing: list[list[common_pb2.RoutingWeight]] = [[] for _ in range(hours)]
        caches: list[list[common_pb2.CacheTarget]] = [[] for _ in range(hours)]
        runs: list[list[common_pb2.EngineRunTarget]] = [[] for _ in range(hours)]
        power: list[list[common_pb2.GpuPowerTarget]] = [[] for _ in range(hours)]
        figures: list[dict[str, PoolFigures]] = [{} for _ in range(hours)]
        capabilities = [dict(inputs.capabilities_at(t)) for t in range(hours)]
        kept: list[dict[str, list[common_pb2.CacheTarget]]] = []  # per hour, the targets in force by pool
        for targets in keep_current_messages(inputs, "cache_targets"):
            by_pool: dict[str, list[common_pb2.CacheTarget]] = {}
            for target in targets:
                by_pool.setdefault(target.pool, []).append(target)
            kept.append(by_pool)
        lines: list[str] = []
        statuses: list[str] = []
        model_s = milp_s = 0.0
        for pool in inputs.fleet.pools:
            t0 = time.perf_counter()
            m = self.pool_model(inputs, pool)
            model_s += time.perf_counter() - t0
            if m is None:
                if pool.engines:
                    lines.append(self._fill_pool(inputs, pool, routing, figures))
                for t in range(hours):
                    caches[t].extend(kept[t].get(pool.name, []))
                continue
            t0 = time.perf_counter()
            picks, status = self.solve_pool(m)
            milp_s += time.perf_counter() - t0
            statuses.append(status)
            top_mhz = max_sm_clock_mhz(engine_hardware(pool.engines[0], inputs.fleet) or "A100")
            engine_ids = sorted(e.id for e in pool.engines)
            for t, o in enumerate(picks):
                cap = m.capabilities[(o.size_index, o.clock_index)]
                loaded = engine_ids[:o.engines]
                share = 1.0 / o.engines
                routing[t].extend(common_pb2.RoutingWeight(pool=pool.name, engine_id=eid,
                                                           weight=round(share if eid in loaded else 0.0, 6))
                                  for eid in engine_ids)
                if pool.max_cache_dram_bytes > 0:  # a pool without a DRAM limit keeps the targets in force
                    _, disk_now = inputs.cache_sizes.get(pool.name, (0, 0))
                    caches[t].append(common_pb2.CacheTarget(pool=pool.name, dram_bytes=m.sizes[o.size_index],
                                                            disk_bytes=disk_now))
                else:
                    caches[t].extend(kept[t].get(pool.name, []))
                if m.sleeps:
                    runs[t].extend(common_pb2.EngineRunTarget(
                        pool=pool.name, engine_id=eid,
                        state=common_pb2.ENGINE_RUN_STATE_AWAKE if eid in loaded
                        else common_pb2.ENGINE_RUN_STATE_SLEEPING) for eid in engine_ids)
                f = m.clocks[o.clock_index]
                power[t].append(common_pb2.GpuPowerTarget(
                    pool=pool.name, sm_clock_fraction=f,
                    max_sm_clock_mhz=0 if f >= 1.0 else int(round(top_mhz * f))))
                rate = m.mean_load[t] / o.engines
                attained = cap.attainment(rate, max(pool.slo.attainment_fraction, self.floor))
                figures[t][pool.name] = PoolFigures(
                    m.mean_load[t], o.engines * cap.capacity_requests_per_s * m.derate, attained,
                    {eid: (rate if eid in loaded else 0.0) for eid in engine_ids})
                figures[t][pool.name].attainment_at_upper_fraction = cap.attainment(
                    m.upper_load[t] / o.engines, max(pool.slo.attainment_fraction, self.floor))
                figures[t][pool.name].engines_awake = o.engines if m.sleeps else m.n_engines
                figures[t][pool.name].saved_g_by_lever = self.attribution(inputs, pool, m, t, o)
                for eid in engine_ids:
                    capabilities[t][eid] = cap
            lines.extend(self._explain(pool, m, picks))
        detail = (f"{len(statuses)} pool(s) x {hours} h, one MILP per pool (HiGHS: "
                  f"{', '.join(sorted(set(statuses))) or 'nothing to solve'}); model {model_s:.2f} s, "
                  f"MILP {milp_s:.3f} s, total {time.perf_counter() - started:.2f} s")
        return {
            "routing_weights": KnobPlan(routing, explanation=lines, pool_figures=figures, capabilities=capabilities,
                                        detail=detail),
            "cache_targets": KnobPlan(caches, detail=detail),
            "engine_runs": KnobPlan(runs, detail=detail),
            "gpu_power": KnobPlan(power, detail=detail),
        }

    def attribution(self, inputs: PlanningInputs, pool: common_pb2.Pool, m: PoolModel, t: int,
                    o: Option) -> dict[str, float]:
        """Carbon the option saves in hour ``t`` against the static fleet (every engine loaded, the largest cache,
        the full clock, nobody asleep), by lever, applied in turn: the engines loaded, then the cache size, then the
        clock, then sleep; the parts add up to the whole saving, as the planner's model predicts it."""
        full_k, full_f = len(m.sizes) - 1, 0
        pue = inputs.params.pue

        def cost(n: int, k: int, f: int, rest_w: float) -> float:
            return self._hour_cost(inputs, pool, m.capabilities[(k, f)], n, m.n_engines, m.mean_load[t], rest_w,
                                   m.sizes[k], m.ci[t], pue)

        static = cost(m.n_engines, full_k, full_f, m.idle_w)
        routed = cost(o.engines, full_k, full_f, m.idle_w)
        cached = cost(o.engines, o.size_index, full_f, m.idle_w)
        clocked = cost(o.engines, o.size_index, o.clock_index, m.idle_w)
        slept = cost(o.engines, o.size_index, o.clock_index, m.rest_w)
        return {"routing": static - routed, "cache": routed - cached, "clock": cached - clocked,
                "sleep": clocked - slept}

    def _fill_pool(self, inputs: PlanningInputs, pool: common_pb2.Pool,
                   routing: list[list[common_pb2.RoutingWeight]], figures: list[dict[str, PoolFigures]]) -> str:
        """A pool whose engines differ (MIG slices beside whole GPUs, measured profiles): the planning load on the
        engines cheapest in carbon per request first, each up to the headroom of its own capacity (the min-carbon
        routing rule, robust to the same planning load); the cache sizes in force are kept."""
        from greenserve.optimizer.solvers.routing_weights import expected_attainment, fill

        margin = inputs.load_margin.get(pool.name)
        fc = inputs.load.get(pool.name)
        short = 0
        for t in range(inputs.horizon_hours):
            caps = inputs.capabilities_at(t)
            engines = [(e.id, caps[e.id].energy_per_request_j, caps[e.id].capacity_requests_per_s)
                       for e in pool.engines if e.id in caps]
            mean = fc.mean[t] if fc else 0.0
            load = planning_load(mean, fc.upper[t], margin) if fc else 0.0
            total_cap = sum(e[2] for e in engines)
            short += load > self.headroom * total_cap
            rates = fill(load, engines, self.headroom) if engines else {}
            planned = sum(rates.values())
            share = {eid: (r / planned if planned > 0 else 1.0 / len(rates)) for eid, r in rates.items()}
            routing[t].extend(common_pb2.RoutingWeight(pool=pool.name, engine_id=eid, weight=round(share[eid], 6))
                              for eid in sorted(share))
            target = max(pool.slo.attainment_fraction, self.floor)
            mean_rates = {eid: mean * share[eid] for eid in share}
            attained = expected_attainment(mean_rates, caps, {eid: cap for eid, _, cap in engines}, target)
            figures[t][pool.name] = PoolFigures(mean, total_cap, attained, mean_rates)
        return (f"pool {pool.name}: engines that differ (hardware, variant or measured profiles): filled cheapest "
                f"carbon per request first up to {self.headroom:.0%} of each one's capacity for the planning load "
                f"({'the upper bound' if margin is None else f'mean x {margin:.2f}'}); cache sizes kept; short of "
                f"capacity in {short} hour(s)")

    def _explain(self, pool: common_pb2.Pool, m: PoolModel, picks: list[Option]) -> list[str]:
        o = picks[0]
        cap = m.capabilities[(o.size_index, o.clock_index)]
        restarts = sum(1 for a, b in zip(picks, picks[1:]) if a.size_index != b.size_index)
        risk = [t for t, r in enumerate(m.at_risk) if r]
        text = (f"pool {pool.name}: hour 0 runs {o.engines} of {m.n_engines} engines with "
                f"{m.sizes[o.size_index] / (1 << 30):.0f} GiB DRAM each at SM clock {m.clocks[o.clock_index]:.0%}: "
                f"{cap.capacity_requests_per_s:.2f} req/s per engine at attainment "
                f"{max(pool.slo.attainment_fraction, self.floor):.2f} ({cap.source}"
                + (f"; counted at {m.derate:.0%} after a measured SLO breach" if m.derate < 1.0 else "") +
                f"), planned for "
                f"{m.plan_load[0]:.2f} req/s (forecast {m.mean_load[0]:.2f}, upper {m.upper_load[0]:.2f}) within "
                f"{self.headroom:.0%} headroom; CI {m.ci[0]:.0f} g/kWh, {m.cost_g[0][m.options[0].index(o)]:.0f} g "
                f"expected for the hour; {restarts} DRAM restart(s) over {len(picks)} h")
        lines = [text]
        if risk:
            lines.append(f"pool {pool.name}: no option carries the planning load in {len(risk)} hour(s) "
                         f"(first: hour {risk[0]}); every engine, the largest cache and the full clock run there and "
                         f"the SLO is at risk")
        return lines
