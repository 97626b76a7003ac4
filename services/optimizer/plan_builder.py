"""The planner: inputs gathered once per computation (planning.py), one solver module per knob, one plan out.

A solver is any object with ``knob`` (the PlanInterval field it fills: ``routing_weights``, ``cache_targets``,
``mig_layouts`` or ``serving_modes``), ``name`` and ``solve(inputs) -> KnobPlan``. The planner runs each solver
with a time limit; a solver that raises or runs out of time leaves its knob as the plan in force has it (the
"keep current" answer) and the plan says so in its ``solver_outcomes`` and explanation. Solvers see the same
``PlanningInputs`` and must not change them.

Expected figures per pool and interval (capacity, attainment, carbon) come from the routing solver's load
assignment and the engines' capabilities (``capacity.py``): operational = (idle power of the pool's engines x
interval + dynamic energy per request x requests) x PUE x CI; embodied = the platform of the pool's GPUs amortised
over the interval (GreenLLM Eq. 1 with the whole interval held) plus the cache storage the plan allocates
(GreenCache Eq. 4).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from greenserve.common import carbon
from greenserve.common.carbon_messages import breakdown_to_proto
from greenserve.optimizer import cache_tier_health
from greenserve.optimizer.explain import explain
from greenserve.optimizer.planning import (
    DEFAULT_SOLVER_TIMEOUT_S,
    KNOB_LABELS,
    KNOBS,
    KnobPlan,
    PlanningInputs,
    keep_current_messages,
    solver_knobs,
)
from greenserve.optimizer.solvers.routing_weights import onto_mig_instances
from greenserve.v1 import common_pb2

log = logging.getLogger("greenserve.optimizer.planning")


@dataclass
class PlannerResult:
    plan: common_pb2.Plan
    solve_s: float


class Planner:
    """Runs the solvers over the inputs and assembles the plan (not stored: the service stores it)."""

    def __init__(self, solvers: Sequence[Any], solver_timeout_s: float = DEFAULT_SOLVER_TIMEOUT_S) -> None:
        knobs = [k for s in solvers for k in solver_knobs(s)]
        if sorted(knobs) != sorted(set(knobs)) or not set(knobs) <= set(KNOBS):
            raise ValueError(f"solvers: one per knob of {KNOBS}, got {knobs}")
        self.solvers = list(solvers)
        self.solver_timeout_s = solver_timeout_s
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="solver")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self, solver: Any, inputs: PlanningInputs) -> tuple[KnobPlan, common_pb2.SolverOutcome]:
        started = time.perf_counter()
        outcome = common_pb2.SolverOutcome(knob=solver.knob, solver=solver.name)
        future = self._pool.submit(solver.solve, inputs)
        try:
            result = future.result(timeout=self.solver_timeout_s)
            outcome.status = result.status
            outcome.detail = result.detail
        except concurrent.futures.TimeoutError:
            future.cancel()  # still waiting for a thread: drop it (a started solve cannot be stopped; it ends unused)
            outcome.status = "timeout"
            outcome.detail = f"no answer within {self.solver_timeout_s:g} s; {KNOB_LABELS[solver.knob]} left as in force"
            result = KnobPlan(keep_current_messages(inputs, solver.knob))
        except Exception as exc:  # a failing solver leaves its knob as it is
            log.exception("solver %s failed", solver.name)
            outcome.status = "failed"
            outcome.detail = f"{type(exc).__name__}: {exc}; {KNOB_LABELS[solver.knob]} left as in force"[:2000]
            result = KnobPlan(keep_current_messages(inputs, solver.knob))
        outcome.solve_s = time.perf_counter() - started
        return result, outcome

    def _run_joint(self, solver: Any, inputs: PlanningInputs) -> tuple[dict[str, KnobPlan],
                                                                        dict[str, common_pb2.SolverOutcome]]:
        """A joint solver's answers, one per knob; when it fails or times out, every one of its knobs is kept as
        in force, and each knob's outcome says so."""
        started = time.perf_counter()
        future = self._pool.submit(solver.solve_knobs, inputs)
        status, detail = "ok", ""
        try:
            answers = future.result(timeout=self.solver_timeout_s)
            missing = [k for k in solver.knobs if k not in answers]
            if missing:
                raise ValueError(f"no answer for {', '.join(missing)}")
        except concurrent.futures.TimeoutError:
            future.cancel()
            status, detail = "timeout", f"no answer within {self.solver_timeout_s:g} s"
            answers = {}
        except Exception as exc:  # a failing solver leaves its knobs as they are
            log.exception("solver %s failed", solver.name)
            status, detail = "failed", f"{type(exc).__name__}: {exc}"[:1800]
            answers = {}
        solve_s = time.perf_counter() - started
        results: dict[str, KnobPlan] = {}
        outcomes: dict[str, common_pb2.SolverOutcome] = {}
        for knob in solver.knobs:
            if knob in answers:
                results[knob] = answers[knob]
                outcomes[knob] = common_pb2.SolverOutcome(knob=knob, solver=solver.name, status=answers[knob].status,
                                                          detail=answers[knob].detail, solve_s=solve_s)
            else:
                results[knob] = KnobPlan(keep_current_messages(inputs, knob))
                outcomes[knob] = common_pb2.SolverOutcome(
                    knob=knob, solver=solver.name, status=status, solve_s=solve_s,
                    detail=f"{detail}; {KNOB_LABELS[knob]} left as in force")
        return results, outcomes

    def plan(self, inputs: PlanningInputs, *, trigger: str, created_s: float) -> PlannerResult:
        started = time.perf_counter()
        results: dict[str, KnobPlan] = {}
        outcomes: dict[str, common_pb2.SolverOutcome] = {}
        # A joint solver runs first, then the cache solver: their sizes set the engines' capacity (prefix hits in a
        # DRAM tier), which the routing solver and the plan's figures must then see (``KnobPlan.capabilities``).
        for solver in [s for s in self.solvers if hasattr(s, "knobs")]:
            answers, knob_outcomes = self._run_joint(solver, inputs)
            if "cache_targets" in answers:
                answers["cache_targets"] = cache_tier_health.without_faulty_tiers(inputs, answers["cache_targets"])
            for knob, result in answers.items():
                if len(result.per_interval) != inputs.horizon_hours:
                    knob_outcomes[knob].status, knob_outcomes[knob].detail = "failed", (
                        f"answered {len(result.per_interval)} intervals for a {inputs.horizon_hours} h horizon; kept")
                    result = answers[knob] = KnobPlan(keep_current_messages(inputs, knob))
                if result.capabilities is not None and len(result.capabilities) == inputs.horizon_hours:
                    inputs = dataclasses.replace(inputs, interval_capabilities=result.capabilities)
            results.update(answers)
            outcomes.update(knob_outcomes)
        for solver in sorted((s for s in self.solvers if not hasattr(s, "knobs")),
                             key=lambda s: s.knob != "cache_targets"):
            result, outcome = self._run(solver, inputs)
            if solver.knob == "cache_targets":
                result = cache_tier_health.without_faulty_tiers(inputs, result)
            if len(result.per_interval) != inputs.horizon_hours:
                outcome.status, outcome.detail = "failed", (
                    f"answered {len(result.per_interval)} intervals for a {inputs.horizon_hours} h horizon; kept")
                result = KnobPlan(keep_current_messages(inputs, solver.knob))
            results[solver.knob] = result
            outcomes[solver.knob] = outcome
            if result.capabilities is not None and len(result.capabilities) == inputs.horizon_hours:
                inputs = dataclasses.replace(inputs, interval_capabilities=result.capabilities)
        in_order = [outcomes[k] for s in self.solvers for k in solver_knobs(s)]  # the solvers' order
        if "routing_weights" in results and "mig_layouts" in results:
            # The routing knob follows the layouts: a partitioned GPU's weight goes to its instances' engines.
            try:
                results["routing_weights"] = onto_mig_instances(
                    inputs, results["routing_weights"], results["mig_layouts"],
                    solver=next(s for s in self.solvers if "routing_weights" in solver_knobs(s)))
            except Exception:  # the whole-GPU weights stay; the plan still goes out
                log.exception("routing weights not split over MIG instances")
        plan = assemble(inputs, results, in_order, trigger=trigger, created_s=created_s)
        return PlannerResult(plan, time.perf_counter() - started)


def _ts(msg: Any, seconds: float) -> None:
    msg.FromNanoseconds(int(round(seconds * 1e9)))


def assemble(inputs: PlanningInputs, results: dict[str, KnobPlan], outcomes: list[common_pb2.SolverOutcome], *,
             trigger: str, created_s: float) -> common_pb2.Plan:
    plan = common_pb2.Plan(trigger=trigger)
    _ts(plan.created_at, created_s)
    _ts(plan.valid_from, inputs.start_s)
    _ts(plan.valid_until, inputs.start_s + 3600.0 * inputs.horizon_hours)
    plan.solver_outcomes.extend(outcomes)
    plan.input_notes.extend(inputs.notes)
    plan.cache_tier_faults.extend(inputs.cache_tier_faults[name] for name in sorted(inputs.cache_tier_faults))
    if inputs.current is not None:
        plan.previous_version = inputs.current.version
    routing = results.get("routing_weights")
    total = dict(operational=0.0, embodied_compute=0.0, embodied_storage=0.0, energy=0.0)
    weighted_attainment = 0.0
    total_requests = 0.0
    pue = inputs.params.pue
    embodied_per_hour: dict[str, float] = {}
    gpu_pool = {gpu.uuid: gpu.pool for gpu in inputs.fleet.gpus}
    gpu_node = {gpu.uuid: gpu.node for gpu in inputs.fleet.gpus}
    for uuid, platform in inputs.gpu_platform.items():
        pool_name = gpu_pool.get(uuid, "")
        embodied_per_hour[pool_name] = embodied_per_hour.get(pool_name, 0.0) + platform.amortised_embodied_g(
            duration_s=3600.0)
    for h, start_s in enumerate(inputs.interval_starts_s):
        interval = plan.intervals.add()
        _ts(interval.start, start_s)
        _ts(interval.end, start_s + 3600.0)
        for knob, result in results.items():
            getattr(interval, knob).extend(result.per_interval[h])
        for layout in interval.mig_layouts:  # whose partitioner the layout is for, even if its GPU vanishes
            layout.node = gpu_node.get(layout.gpu_uuid, "")
        cache_by_pool = {t.pool: t for t in interval.cache_targets}
        figures = routing.pool_figures[h] if routing is not None and routing.pool_figures else {}
        iv = dict(operational=0.0, embodied_compute=0.0, embodied_storage=0.0, energy=0.0)
        iv_requests = iv_attained = 0.0
        ci_sum = load_sum = 0.0
        for pool in inputs.fleet.pools:
            ci = inputs.ci[pool.region].mean[h] if pool.region in inputs.ci else 0.0
            fc = inputs.load.get(pool.name)
            load = fc.mean[h] if fc else 0.0
            upper = fc.upper[h] if fc else 0.0
            fig = figures.get(pool.name)
            rates = fig.engine_rates if fig else {}
            asleep = {r.engine_id for r in interval.engine_runs
                      if r.pool == pool.name and r.state == common_pb2.ENGINE_RUN_STATE_SLEEPING}
            energy_j = 0.0
            for engine in pool.engines:
                cap = inputs.capabilities_at(h).get(engine.id)
                if cap is None:
                    continue
                rate = rates.get(engine.id, 0.0)
                # An engine with no planned load still idles for the hour unless the plan puts it to sleep, when its
                # GPU draws its idle power (a sleeping engine holds no weights, the GPU stays powered).
                energy_j += (cap.idle_power_w if engine.id in asleep else cap.power_w(rate)) * 3600.0
            if fig:
                energy_j += sum(j * rates.get(eid, 0.0) * 3600.0
                                for eid, j in fig.new_engine_energy_per_request_j.items())
            energy_kwh = energy_j / 3.6e6
            operational = carbon.operational_g(energy_kwh=energy_kwh, ci_g_per_kwh=ci, pue=pue)
            embodied = embodied_per_hour.get(pool.name, 0.0)
            target = cache_by_pool.get(pool.name)
            storage = 0.0
            if target is not None:
                # A target sizes each LMCache server of the pool: one beside each engine.
                storage = max(1, len(pool.engines)) * carbon.cache_tiers_embodied_g(
                    dram_bytes=target.dram_bytes, disk_bytes=target.disk_bytes, duration_s=3600.0,
                    params=inputs.params)
            attainment = fig.attainment_fraction if fig else (pool.slo.attainment_fraction if load <= 0 else 0.0)
            pi = interval.pools.add(pool=pool.name, ci_g_per_kwh=ci, load_requests_per_s=load,
                                    load_upper_requests_per_s=upper,
                                    capacity_requests_per_s=fig.capacity_requests_per_s if fig else 0.0,
                                    expected_slo_attainment_fraction=attainment,
                                    engines_awake=fig.engines_awake if fig else 0)
            if fig is not None and fig.attainment_at_upper_fraction is not None:
                pi.expected_slo_attainment_at_upper_fraction = fig.attainment_at_upper_fraction
            if fig is not None:
                pi.expected_saved_g_by_lever.update(fig.saved_g_by_lever)
            pi.expected_carbon.CopyFrom(breakdown_to_proto(
                operational_g=operational, embodied_compute_g=embodied, embodied_storage_g=storage,
                energy_kwh=energy_kwh, ci_g_per_kwh=ci))
            for key, value in (("operational", operational), ("embodied_compute", embodied),
                               ("embodied_storage", storage), ("energy", energy_kwh)):
                iv[key] += value
            requests = load * 3600.0
            iv_requests += requests
            iv_attained += requests * attainment
            ci_sum += ci * max(energy_kwh, 1e-12)
            load_sum += load
        mean_ci = ci_sum / max(iv["energy"], 1e-12) if iv["energy"] > 0 else 0.0
        interval.ci_g_per_kwh = mean_ci
        interval.load_requests_per_s = load_sum
        interval.expected_carbon.CopyFrom(breakdown_to_proto(
            operational_g=iv["operational"], embodied_compute_g=iv["embodied_compute"],
            embodied_storage_g=iv["embodied_storage"], energy_kwh=iv["energy"], ci_g_per_kwh=mean_ci))
        interval.expected_slo_attainment_fraction = (iv_attained / iv_requests) if iv_requests > 0 else 1.0
        for key in total:
            total[key] += iv[key]
        weighted_attainment += iv_attained
        total_requests += iv_requests
    mean_ci = (sum(iv.expected_carbon.operational_g for iv in plan.intervals) / total["energy"] / max(pue, 1.0)
               if total["energy"] > 0 else 0.0)
    plan.expected_carbon.CopyFrom(breakdown_to_proto(
        operational_g=total["operational"], embodied_compute_g=total["embodied_compute"],
        embodied_storage_g=total["embodied_storage"], energy_kwh=total["energy"], ci_g_per_kwh=mean_ci))
    plan.expected_slo_attainment_fraction = weighted_attainment / total_requests if total_requests > 0 else 1.0
    plan.explanation = explain(plan, inputs, results)
    return plan

