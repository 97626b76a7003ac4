"""The explanation a person reads: per pool what the plan does in the first hour, why, and against what was in
force; then each knob's solver outcome and the inputs that were stale or predicted."""

from __future__ import annotations

from greenserve.optimizer.inputs import EXPIRED
from greenserve.optimizer.planning import KNOB_LABELS, KnobPlan, PlanningInputs
from greenserve.v1 import common_pb2

GIB = 1024**3


def _size(n_bytes: int) -> str:
    if n_bytes >= 10**12:
        return f"{n_bytes / 10**12:.1f} TB"
    return f"{n_bytes / GIB:.1f} GiB"


def _shares(interval: common_pb2.PlanInterval | None, pool: str) -> dict[str, float]:
    if interval is None:
        return {}
    weights = {w.engine_id: w.weight for w in interval.routing_weights if w.pool == pool}
    total = sum(weights.values())
    return {k: v / total for k, v in weights.items()} if total > 0 else {}


def _share_text(shares: dict[str, float]) -> str:
    active = sorted(((v, k) for k, v in shares.items() if v > 0.005), reverse=True)
    if not active:
        return "no engine weighted"
    parts = [f"{k} {v:.0%}" for v, k in active[:4]]
    if len(active) > 4:
        parts.append(f"{len(active) - 4} more")
    idle = sum(1 for v in shares.values() if v <= 0.005)
    return ", ".join(parts) + (f"; {idle} engine(s) unweighted" if idle else "")


def degraded_lines(inputs: PlanningInputs) -> list[str]:
    """The first lines when forecasts were not fresh: the safe plan (a forecast older than the age a plan may use,
    safe_plan.py) or the cached forecasts the plan was made on, each with its age."""
    series = [(f"ci:{k}", fc) for k, fc in sorted(inputs.ci.items())] + [
        (f"load:{k}", fc) for k, fc in sorted(inputs.load.items())]
    expired = [f"{label} {fc.stale_s / 3600:.1f} h old" for label, fc in series if fc.source == EXPIRED]
    cached = [f"{label} {fc.stale_s / 60:.0f} min old" for label, fc in series if fc.source == "cache"]
    lines = []
    if expired:
        lines.append("SAFE PLAN: the forecaster does not answer and the last forecasts of " + ", ".join(expired)
                     + " are past the age a plan may use (--forecast-max-age-s): every engine awake and weighted "
                     "equally, cache sizes, MIG layouts and serving modes kept as in force, until the forecaster "
                     "answers again")
    if cached:
        lines.append("stale forecasts: the forecaster does not answer; planned on the last forecasts of "
                     + ", ".join(cached))
    return lines


def explain(plan: common_pb2.Plan, inputs: PlanningInputs, results: dict[str, KnobPlan]) -> str:
    lines: list[str] = degraded_lines(inputs)
    first = plan.intervals[0] if plan.intervals else None
    before = inputs.current_interval(0)
    prev = f"plan v{inputs.current.version}" if inputs.current is not None else "no plan"
    if first is not None:
        figures = {p.pool: p for p in first.pools}
        for pool in inputs.fleet.pools:
            fig = figures.get(pool.name)
            if fig is None:
                continue
            parts = [f"pool {pool.name}:"]
            now_shares, old_shares = _shares(first, pool.name), _shares(before, pool.name)
            if now_shares:
                parts.append(f"routing {_share_text(now_shares)}")
                if old_shares and {k: round(v, 2) for k, v in old_shares.items()} != {
                        k: round(v, 2) for k, v in now_shares.items()}:
                    parts.append(f"(was {_share_text(old_shares)} in {prev})")
            caps = [inputs.capabilities[e.id] for e in pool.engines if e.id in inputs.capabilities]
            if caps:
                cheapest = min(caps, key=lambda c: c.energy_per_request_j)
                parts.append(f"lowest energy per request {cheapest.energy_per_request_j:.0f} J ({cheapest.source})")
            for target in first.cache_targets:
                if target.pool == pool.name:
                    old = next((t for t in before.cache_targets if t.pool == pool.name), None) if before else None
                    was = f", was {_size(old.dram_bytes)} / {_size(old.disk_bytes)}" if old and (
                        old.dram_bytes, old.disk_bytes) != (target.dram_bytes, target.disk_bytes) else ""
                    parts.append(f"cache DRAM {_size(target.dram_bytes)} / disk {_size(target.disk_bytes)}{was}")
            if pool.name in inputs.cache_tier_faults:
                parts.append("LMCache tier not working: no cache target")
            parts.append(f"CI forecast {fig.ci_g_per_kwh:.0f} g/kWh")
            parts.append(f"load {fig.load_requests_per_s:.2f} req/s (upper {fig.load_upper_requests_per_s:.2f}) of "
                         f"SLO capacity {fig.capacity_requests_per_s:.2f}")
            parts.append(f"expected attainment {fig.expected_slo_attainment_fraction:.2f} "
                         f"(target {pool.slo.attainment_fraction:.2f})")
            lines.append(" ".join(parts[:1]) + " " + "; ".join(parts[1:]))
    for _knob, result in results.items():
        lines.extend(result.explanation)
    for outcome in plan.solver_outcomes:
        label = KNOB_LABELS.get(outcome.knob, outcome.knob)
        lines.append(f"{label}: {outcome.solver} {outcome.status}: {outcome.detail}")
    for note in inputs.notes:
        lines.append(f"input: {note}")
    total = plan.expected_carbon
    lines.append(f"expected over {len(plan.intervals)} h: {total.total_g / 1000:.2f} kgCO2e "
                 f"(operational {total.operational_g / 1000:.2f}, embodied {(total.embodied_compute_g + total.embodied_storage_g) / 1000:.2f}), "
                 f"attainment {plan.expected_slo_attainment_fraction:.2f}")
    return "\n".join(lines)
