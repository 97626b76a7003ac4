"""`greenserve plan ...`: the optimizer's plans.

    greenserve plan compute [--horizon-hours N] [--hold] [--dry-run] [--json]
        compute a plan now (stored and put in force unless --hold or the optimizer holds plans; --dry-run stores
        nothing) and print its summary and explanation
    greenserve plan list [--limit N] [--json]                 stored plans, newest first
    greenserve plan show [VERSION] [--json]                   intervals (hour, CI, load, capacity, attainment,
                                                              carbon) and per pool / GPU what the plan sets
    greenserve plan explain [VERSION] [--json]                explanation, solver outcomes, input notes
    greenserve plan status [VERSION] [--wait-s S] [--json]    what each component reported about the plan;
                                                              exit 0 when the fleet matches it, 3 when not
    greenserve plan activate VERSION [--json]                 put a stored plan in force (an older one: rollback)
    greenserve plan diff A B [--json]                         what changed from plan A to plan B, per hour and knob,
                                                              and the expected carbon delta

VERSION defaults to the plan in force. Exit status: 0, 1 for an error of the service (NOT_FOUND,
UNAVAILABLE, ...), 2 for bad arguments (or INVALID_ARGUMENT), 3 for `status` when the fleet does not match.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from greenserve.common import strict_json
from greenserve.common.cli_parser import Parser
from greenserve_client.cli import print_table
from greenserve_client.commands import optimizer_client

PROG = "greenserve plan"
EXIT_NOT_MATCHING = 3
GIB = 1024**3
WEIGHT_TOLERANCE = 5e-4  # weights (normalised per pool) closer than this are the same


def _version(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a plan version: {text!r}") from None
    if not 1 <= value <= 2**53:
        raise argparse.ArgumentTypeError(f"a plan version is >= 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="the optimizer's plans: compute, inspect, activate")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    compute = sub.add_parser("compute", help="compute a plan now")
    compute.add_argument("--horizon-hours", type=int, default=0, help="hours the plan covers (1..168; default: "
                                                                       "the optimizer's --plan-horizon-hours)")
    compute.add_argument("--hold", action="store_true", help="store it as proposed; `plan activate` puts it in force")
    compute.add_argument("--dry-run", action="store_true", help="compute and print, store nothing")
    compute.add_argument("--json", action="store_true", help="print one JSON object")
    optimizer_client.add_optimizer_flags(compute, timeout_s=300.0)

    ls = sub.add_parser("list", help="stored plans, newest first")
    ls.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    ls.add_argument("--json", action="store_true", help="print one JSON object")
    optimizer_client.add_optimizer_flags(ls)

    for name, help_text in (("show", "a plan's intervals and knobs"),
                            ("explain", "a plan's explanation, solver outcomes and input notes")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("version", nargs="?", type=_version, default=0, metavar="VERSION",
                       help="plan version (default: the plan in force)")
        p.add_argument("--json", action="store_true", help="print one JSON object")
        optimizer_client.add_optimizer_flags(p)

    status = sub.add_parser("status", help="enforcement reports; exit 0 when the fleet matches the plan, 3 when not")
    status.add_argument("version", nargs="?", type=_version, default=0, metavar="VERSION",
                        help="plan version (default: the plan in force)")
    status.add_argument("--wait-s", type=float, default=0.0,
                        help="poll every second for up to this long until the fleet matches (default 0: look once)")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    optimizer_client.add_optimizer_flags(status)

    activate = sub.add_parser("activate", help="put a stored plan in force (an older version: the rollback)")
    activate.add_argument("version", type=_version, metavar="VERSION", help="plan version")
    activate.add_argument("--json", action="store_true", help="print one JSON object")
    optimizer_client.add_optimizer_flags(activate)

    diff = sub.add_parser("diff", help="what changed between two plans, per hour and knob")
    diff.add_argument("a", type=_version, metavar="A", help="older (or baseline) plan version")
    diff.add_argument("b", type=_version, metavar="B", help="plan version compared with A")
    diff.add_argument("--json", action="store_true", help="print one JSON object")
    optimizer_client.add_optimizer_flags(diff)
    return parser


# -- formatting ---------------------------------------------------------------------------------------------


def _when(ts: Any) -> str:
    return datetime.fromtimestamp(ts.ToSeconds(), UTC).strftime("%Y-%m-%d %H:%M")


def _hhmm(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%H:%M")


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _size(n: int) -> str:
    if n == 0:
        return "0"
    if n >= 10**12:
        return f"{n / 10**12:g} TB"
    return f"{n / GIB:.3g} GiB"


def _state(plan: Any) -> str:
    from greenserve.v1 import common_pb2

    return common_pb2.PlanState.Name(plan.state).removeprefix("PLAN_STATE_").lower()


def _enforcement(state: int) -> str:
    from greenserve.v1 import optimizer_pb2

    return optimizer_pb2.EnforcementState.Name(state).removeprefix("ENFORCEMENT_STATE_").lower()


def _kg(grams: float) -> str:
    return f"{grams / 1000:.3f} kgCO2e"


def _header(plan: Any) -> str:
    c = plan.expected_carbon
    hours = round((plan.valid_until.ToSeconds() - plan.valid_from.ToSeconds()) / 3600)
    prev = f"; previous v{plan.previous_version}" if plan.previous_version else ""
    return (f"plan v{plan.version} {_state(plan)} (trigger {plan.trigger or '-'}, computed {_when(plan.created_at)} UTC)"
            f": {hours} h from {_when(plan.valid_from)} UTC; expected {_kg(c.total_g)} (operational "
            f"{_kg(c.operational_g)}, embodied {_kg(c.embodied_compute_g + c.embodied_storage_g)}), "
            f"attainment {plan.expected_slo_attainment_fraction:.3f}{prev}")


def _model_text(model: str, short: bool) -> str:
    """A forecast model's name; ``short``: an ensemble's long name as its kind and size."""
    if not short or len(model) <= 48:
        return model or "-"
    if model.startswith("weighted[") and "]" in model:
        return f"weighted ensemble of {model[len('weighted['):model.rindex(']')].count('+') + 1} models"
    return model[:45] + "..."


def forecast_lines(plan: Any, short: bool = False) -> list[str]:
    """One line per forecast the plan was computed on: series, model, when it was made, the history it had seen."""
    from greenserve.v1 import common_pb2

    out = []
    for f in plan.forecasts:
        kind = "CI" if f.series.kind == common_pb2.SERIES_KIND_CARBON_INTENSITY else "load"
        made = (datetime.fromtimestamp(f.generated_at.ToSeconds(), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
                if f.HasField("generated_at") else "at an unknown time")
        seen = f" from history to {_when(f.history_end)} UTC" if f.HasField("history_end") else ""
        cached = f" (cached: the forecaster did not answer; {f.stale_s / 60:.0f} min old)" if f.source == "cache" else ""
        out.append(f"forecast of {kind} {f.series.key}: {_model_text(f.model, short)}, made {made}{seen}{cached}")
    return out


def _weights(interval: Any) -> dict[str, dict[str, float]]:
    """Per pool, engine -> weight normalised over the pool."""
    raw: dict[str, dict[str, float]] = {}
    for w in interval.routing_weights:
        raw.setdefault(w.pool, {})[w.engine_id] = w.weight
    out = {}
    for pool, weights in raw.items():
        total = sum(weights.values())
        out[pool] = {e: (v / total if total > 0 else 0.0) for e, v in weights.items()}
    return out


def _cache_text(target: Any) -> str:
    ttl = f", TTL {target.ttl_s:g} s" if target.ttl_s else ""
    return f"DRAM {_size(target.dram_bytes)} / disk {_size(target.disk_bytes)}{ttl}"


def _layout_text(layout: Any) -> str:
    if not layout.placements:
        return "empty"
    items = []
    for p in layout.placements:
        who = "/".join(x for x in (p.pool, p.model_variant) if x)
        items.append(f"{p.profile}@{p.start}" + (f" ({who})" if who else ""))
    return ", ".join(items)


def _mode_text(mode: int) -> str:
    from greenserve.v1 import common_pb2

    return common_pb2.ServingMode.Name(mode).removeprefix("SERVING_MODE_").lower()


def knob_values(interval: Any) -> dict[tuple[str, str], str]:
    """Every knob setting of one interval as (knob, key) -> text; weights with 3 decimals."""
    out: dict[tuple[str, str], str] = {}
    for pool, weights in _weights(interval).items():
        for engine, w in weights.items():
            out[("routing_weights", f"{pool}/{engine}")] = f"{w:.3f}"
    for t in interval.cache_targets:
        out[("cache_targets", t.pool)] = _cache_text(t)
    for layout in interval.mig_layouts:
        out[("mig_layouts", layout.gpu_uuid)] = _layout_text(layout)
    for m in interval.serving_modes:
        out[("serving_modes", m.pool)] = _mode_text(m.serving_mode)
    return out


def _runs(items: list[tuple[float, Any]]) -> list[tuple[float, float, Any]]:
    """Consecutive hourly items with the same value merged: (start_s, end_s, value)."""
    runs: list[tuple[float, float, Any]] = []
    for start, value in items:
        if runs and runs[-1][2] == value and abs(runs[-1][1] - start) < 1:
            runs[-1] = (runs[-1][0], start + 3600.0, value)
        else:
            runs.append((start, start + 3600.0, value))
    return runs


# -- calls ----------------------------------------------------------------------------------------------------


def _run(ns: argparse.Namespace, method: str, request: object) -> Any:
    return asyncio.run(optimizer_client.call(ns, method, request))


def _get(ns: argparse.Namespace, version: int) -> Any:
    from greenserve.v1 import optimizer_pb2

    return _run(ns, "GetPlan", optimizer_pb2.GetPlanRequest(version=version)).plan


def _as_dict(message: Any) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


# -- commands -------------------------------------------------------------------------------------------------


def cmd_compute(ns: argparse.Namespace) -> int:
    from greenserve.v1 import optimizer_pb2

    if not 0 <= ns.horizon_hours <= 168:
        return optimizer_client.fail(f"{PROG} compute", f"--horizon-hours must be in 1..168, got {ns.horizon_hours}")
    request = optimizer_pb2.ComputePlanRequest(horizon_hours=ns.horizon_hours, hold_for_approval=ns.hold,
                                               dry_run=ns.dry_run, trigger="manual")
    reply = _run(ns, "ComputePlan", request)
    if ns.json:
        print(strict_json.dumps({"plan": _as_dict(reply.plan), "solve_s": reply.solve_s, "dry_run": ns.dry_run}))
        return 0
    plan = reply.plan
    if ns.dry_run:
        print(f"dry run (not stored), computed in {reply.solve_s:.2f} s")
        plan_text = _header(plan).replace(f"plan v{plan.version} {_state(plan)}", "plan (dry run)", 1)
        print(plan_text)
    else:
        print(_header(plan))
        print(f"computed in {reply.solve_s:.2f} s" + ("; held for approval: greenserve plan activate "
                                                       f"{plan.version}" if _state(plan) == "proposed" else ""))
    for line in forecast_lines(plan, short=True):
        print(line)
    print()
    print(plan.explanation)
    return 0


def cmd_list(ns: argparse.Namespace) -> int:
    from greenserve.v1 import optimizer_pb2

    if ns.limit < 1:
        return optimizer_client.fail(f"{PROG} list", f"--limit must be >= 1, got {ns.limit}")
    plans: list[Any] = []
    token = ""
    while len(plans) < ns.limit:
        reply = _run(ns, "ListPlans", optimizer_pb2.ListPlansRequest(page_size=min(ns.limit - len(plans), 1000),
                                                                      page_token=token))
        plans.extend(reply.plans)
        token = reply.next_page_token
        if not token:
            break
    if ns.json:
        print(strict_json.dumps({"plans": [_as_dict(p) for p in plans], "more": bool(token)}))
        return 0
    if not plans:
        print("no plans yet (greenserve plan compute)")
        return 0
    rows = [{
        "version": str(p.version), "state": _state(p), "trigger": p.trigger or "-",
        "computed (UTC)": _when(p.created_at), "from (UTC)": _when(p.valid_from),
        "hours": str(round((p.valid_until.ToSeconds() - p.valid_from.ToSeconds()) / 3600)),
        "kgCO2e": f"{p.expected_carbon.total_g / 1000:.3f}", "attainment": f"{p.expected_slo_attainment_fraction:.3f}",
        "previous": str(p.previous_version or "-")} for p in plans]
    print_table(rows, ["version", "state", "trigger", "computed (UTC)", "from (UTC)", "hours", "kgCO2e",
                       "attainment", "previous"])
    if token:
        print(f"(more: --limit {ns.limit * 2})")
    return 0


def print_plan(plan: Any) -> None:
    print(_header(plan))
    for line in forecast_lines(plan, short=True):
        print(line)
    rows = []
    for iv in plan.intervals:
        capacity = sum(p.capacity_requests_per_s for p in iv.pools)
        rows.append({"hour (UTC)": _when(iv.start), "CI g/kWh": f"{iv.ci_g_per_kwh:.1f}",
                     "load req/s": f"{iv.load_requests_per_s:.3g}", "capacity req/s": f"{capacity:.3g}",
                     "attainment": f"{iv.expected_slo_attainment_fraction:.3f}",
                     "carbon g": f"{iv.expected_carbon.total_g:.1f}",
                     "operational g": f"{iv.expected_carbon.operational_g:.1f}",
                     "embodied g": f"{iv.expected_carbon.embodied_compute_g + iv.expected_carbon.embodied_storage_g:.1f}"})
    if rows:
        print()
        print_table(rows, ["hour (UTC)", "CI g/kWh", "load req/s", "capacity req/s", "attainment", "carbon g",
                           "operational g", "embodied g"])
    # Per pool (and per GPU for MIG layouts): each setting over the hours it holds.
    per_target: dict[str, dict[str, list[tuple[float, str]]]] = {}
    for iv in plan.intervals:
        start = iv.start.ToSeconds()
        texts: dict[str, dict[str, str]] = {}
        for pool, weights in _weights(iv).items():
            texts.setdefault(f"pool {pool}", {})["weights"] = ", ".join(
                f"{e} {w:.2f}" for e, w in sorted(weights.items(), key=lambda kv: (-kv[1], kv[0])))
        for t in iv.cache_targets:
            texts.setdefault(f"pool {t.pool}", {})["cache"] = _cache_text(t)
        for m in iv.serving_modes:
            texts.setdefault(f"pool {m.pool}", {})["mode"] = _mode_text(m.serving_mode)
        for layout in iv.mig_layouts:
            texts.setdefault(f"gpu {layout.gpu_uuid}", {})["MIG"] = _layout_text(layout)
        for target, knobs in texts.items():
            for knob, text in knobs.items():
                per_target.setdefault(target, {}).setdefault(knob, []).append((start, text))
    for target in sorted(per_target):
        print()
        print(target)
        for knob, items in per_target[target].items():
            for start, end, text in _runs(items):
                print(f"  {_hhmm(start)}-{_hhmm(end)}  {knob}: {text}")


def cmd_show(ns: argparse.Namespace) -> int:
    plan = _get(ns, ns.version)
    if ns.json:
        print(strict_json.dumps({"plan": _as_dict(plan)}))
    else:
        print_plan(plan)
    return 0


def cmd_explain(ns: argparse.Namespace) -> int:
    plan = _get(ns, ns.version)
    if ns.json:
        print(strict_json.dumps({"version": plan.version, "explanation": plan.explanation,
                                 "solver_outcomes": [_as_dict(o) for o in plan.solver_outcomes],
                                 "input_notes": list(plan.input_notes),
                                 "forecasts": [_as_dict(f) for f in plan.forecasts]}))
        return 0
    print(_header(plan))
    for line in forecast_lines(plan):
        print(line)
    print()
    print(plan.explanation)
    if plan.solver_outcomes:
        print()
        print_table([{"knob": o.knob, "solver": o.solver, "status": o.status, "solve s": f"{o.solve_s:.3f}",
                      "detail": o.detail} for o in plan.solver_outcomes],
                    ["knob", "solver", "status", "solve s", "detail"])
    if plan.input_notes:
        print()
        print("inputs:")
        for note in plan.input_notes:
            print(f"  - {note}")
    return 0


def cmd_status(ns: argparse.Namespace) -> int:
    from greenserve.v1 import optimizer_pb2

    if not 0 <= ns.wait_s <= 86400:  # also refuses nan
        return optimizer_client.fail(f"{PROG} status", f"--wait-s must be in [0, 86400], got {ns.wait_s}")
    deadline = time.monotonic() + ns.wait_s
    while True:
        reply = _run(ns, "GetPlanStatus", optimizer_pb2.GetPlanStatusRequest(version=ns.version))
        if reply.fleet_matches_plan or time.monotonic() >= deadline:
            break
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    plan = reply.plan
    if ns.json:
        print(strict_json.dumps({
            "version": plan.version, "state": _state(plan), "fleet_matches_plan": reply.fleet_matches_plan,
            "pending_components": list(reply.pending_components),
            "reports": [{**_as_dict(r), "state": _enforcement(r.state)} for r in reply.reports],
            "cache_tier_faults": [_as_dict(f) for f in plan.cache_tier_faults]}))
    else:
        print(f"plan v{plan.version} {_state(plan)}")
        if reply.reports:
            print_table([{
                "component": r.component, "instance": r.instance or "-", "state": _enforcement(r.state),
                "interval (UTC)": _when(r.interval_start) if r.HasField("interval_start") else "-",
                "reported (UTC)": _when(r.reported_at) if r.HasField("reported_at") else "-",
                "detail": " ".join(r.detail.split())} for r in reply.reports],
                ["component", "instance", "state", "interval (UTC)", "reported (UTC)", "detail"])
        else:
            print("no component has reported on this plan yet")
        for fault in plan.cache_tier_faults:
            print(f"LMCache tier of pool {fault.pool}: NOT WORKING, planned without it ({fault.reason})")
        if reply.fleet_matches_plan:
            print(f"fleet matches plan v{plan.version}")
        else:
            bad = [f"{r.component}/{r.instance}" if r.instance else r.component for r in reply.reports
                   if r.state != optimizer_pb2.ENFORCEMENT_STATE_APPLIED]
            parts = ([f"pending: {', '.join(reply.pending_components)}"] if reply.pending_components else []) + (
                [f"not applied: {', '.join(bad)}"] if bad else [])
            print(f"fleet does not match plan v{plan.version}" + (f" ({'; '.join(parts)})" if parts else ""))
    return 0 if reply.fleet_matches_plan else EXIT_NOT_MATCHING


def cmd_activate(ns: argparse.Namespace) -> int:
    from greenserve.v1 import optimizer_pb2

    try:
        before = _get(ns, 0).version
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
        before = 0
    plan = _run(ns, "ActivatePlan", optimizer_pb2.ActivatePlanRequest(version=ns.version)).plan
    kind = ("already in force" if before == plan.version else f"rollback from v{before}" if before > plan.version
            else f"was v{before}" if before else "first plan in force")
    if ns.json:
        print(strict_json.dumps({"version": plan.version, "state": _state(plan), "previous_active_version": before,
                                 "rollback": before > plan.version}))
    else:
        print(f"plan v{plan.version} in force ({kind})")
    return 0


@dataclass
class Change:
    knob: str
    key: str
    start_s: float
    end_s: float
    a: str
    b: str


def diff_plans(a: Any, b: Any) -> dict[str, Any]:
    """Per knob and key, the hours where plan B sets something else than plan A, and the carbon delta."""
    a_by = {iv.start.ToSeconds(): iv for iv in a.intervals}
    b_by = {iv.start.ToSeconds(): iv for iv in b.intervals}
    common = sorted(set(a_by) & set(b_by))
    per_key: dict[tuple[str, str], list[tuple[float, tuple[str, str]]]] = {}
    for start in common:
        va, vb = knob_values(a_by[start]), knob_values(b_by[start])
        for key in sorted(set(va) | set(vb)):
            x, y = va.get(key, "-"), vb.get(key, "-")
            if key[0] == "routing_weights" and x != "-" and y != "-" and abs(float(x) - float(y)) < WEIGHT_TOLERANCE:
                continue
            if x != y:
                per_key.setdefault(key, []).append((start, (x, y)))
    changes = [Change(knob, key, s, e, x, y) for (knob, key), items in sorted(per_key.items())
               for s, e, (x, y) in _runs(items)]
    hours = [{"hour": _iso(s), "a_g": a_by[s].expected_carbon.total_g, "b_g": b_by[s].expected_carbon.total_g,
              "delta_g": b_by[s].expected_carbon.total_g - a_by[s].expected_carbon.total_g,
              "a_attainment": a_by[s].expected_slo_attainment_fraction,
              "b_attainment": b_by[s].expected_slo_attainment_fraction} for s in common]
    return {
        "a": a.version, "b": b.version, "common_hours": len(common),
        "hours_only_in_a": [_iso(s) for s in sorted(set(a_by) - set(b_by))],
        "hours_only_in_b": [_iso(s) for s in sorted(set(b_by) - set(a_by))],
        "changes": [{"knob": c.knob, "key": c.key, "from": _iso(c.start_s), "until": _iso(c.end_s), "a": c.a, "b": c.b}
                    for c in changes],
        "carbon_a_g": a.expected_carbon.total_g, "carbon_b_g": b.expected_carbon.total_g,
        "carbon_delta_g": b.expected_carbon.total_g - a.expected_carbon.total_g,
        "carbon_delta_common_hours_g": sum(h["delta_g"] for h in hours),
        "per_hour": hours,
    }


def cmd_diff(ns: argparse.Namespace) -> int:
    a, b = _get(ns, ns.a), _get(ns, ns.b)
    out = diff_plans(a, b)
    if ns.json:
        print(strict_json.dumps(out))
        return 0
    print(f"plan v{a.version} -> v{b.version}: {out['common_hours']} common hours"
          + (f"; only in v{a.version}: {len(out['hours_only_in_a'])} h" if out["hours_only_in_a"] else "")
          + (f"; only in v{b.version}: {len(out['hours_only_in_b'])} h" if out["hours_only_in_b"] else ""))
    if not out["changes"]:
        print("no knob changes in the common hours")
    labels = {"routing_weights": "weight", "cache_targets": "cache", "mig_layouts": "MIG", "serving_modes": "mode"}
    for c in out["changes"]:
        print(f"  {c['from'][11:16]}-{c['until'][11:16]}  {labels[c['knob']]} {c['key']}: {c['a']} -> {c['b']}")
    delta = out["carbon_delta_g"]
    rel = f" ({delta / out['carbon_a_g']:+.1%})" if out["carbon_a_g"] > 0 else ""
    print(f"expected carbon: v{a.version} {_kg(out['carbon_a_g'])}, v{b.version} {_kg(out['carbon_b_g'])}, "
          f"delta {delta / 1000:+.3f} kgCO2e{rel}; over the common hours {out['carbon_delta_common_hours_g'] / 1000:+.3f} kgCO2e")
    return 0


COMMANDS = {"compute": cmd_compute, "list": cmd_list, "show": cmd_show, "explain": cmd_explain,
            "status": cmd_status, "activate": cmd_activate, "diff": cmd_diff}


def main(argv: list[str]) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    optimizer_client.check_timeout(parser, ns)
    try:
        return int(COMMANDS[ns.action](ns))
    except grpc.aio.AioRpcError as exc:
        return optimizer_client.rpc_error(f"{PROG} {ns.action}", exc, ns)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
