"""The demo's report folder: ``result.json``, PNG plots and ``index.html``. The page opens with what an operator
decides on, from what the demo observed of the live loop (the carbon its plans expected, the requests served and
their worst hour's latency, how often the plan, the cache and the fleet's match with the plan changed) and one
picture of the day; then the hour-by-hour table and plots."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from greenserve.common.strict_json import dumps
from greenserve.evaluation.operator_table import changes
from greenserve.evaluation.plots import plot_day, plot_series

STYLE = ("body{font-family:sans-serif;max-width:70em;margin:auto}td,th{border:1px solid #ccc;padding:2px 6px}"
         "table{border-collapse:collapse}img{max-width:100%}")


def summary(hours: list[dict[str, Any]]) -> dict[str, Any]:
    """The day in the numbers an operator decides on."""
    ok = sum(h["requests_ok"] for h in hours)
    failed = sum(h["requests_failed"] for h in hours)
    p99 = [(h["latency_p99_s"], h["hour"]) for h in hours if h.get("latency_p99_s") is not None]
    worst = max(p99, default=(None, None))
    return {"expected_carbon_kg": sum(h.get("expected_total_g", 0.0) for h in hours) / 1000,
            "requests_ok": ok, "requests_failed": failed,
            "worst_p99_latency_s": worst[0], "worst_p99_hour": worst[1],
            "plan_changes": changes(hours, ("plan_version",)), "cache_changes": changes(hours, ("cache_dram_bytes",)),
            "hours_fleet_matched": sum(1 for h in hours if h.get("fleet_matches_plan") is True)}


def _decide_html(result: dict[str, Any]) -> str:
    hours = result["hours"]
    s = summary(hours)
    span = "per day" if len(hours) == 24 else f"in {len(hours)} h"
    worst = "" if s["worst_p99_latency_s"] is None else f"{s['worst_p99_latency_s']:.2f} s at {s['worst_p99_hour']:02d}:00"
    cells = [f"{s['expected_carbon_kg']:.3f}", f"{s['requests_ok']} ok, {s['requests_failed']} failed", worst,
             str(s["plan_changes"]), str(s["cache_changes"]), f"{s['hours_fleet_matched']} of {len(hours)}"]
    head = ["kgCO2e the plans expected", "requests", "p99 latency, worst hour", f"plan changes {span}",
            f"cache changes {span}", "hours the fleet matched its plan"]
    table = ("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr><tr>"
             + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr></table>")
    return (f"<section id='operator'><h2>What to decide on</h2><p>The live loop on the emulated fleet; latency is the "
            f"client's (whole streamed response); the demo records no energy or SLO attainment: `greenserve "
            f"evaluate` reports them per strategy.</p>{table}<img src='day.png' alt='the day'></section>")


def write_report(result: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(dumps(result) + "\n")
    hours = result["hours"]
    plot_day(out / "day.png", f"{result['grid']} on {result['day']}: carbon the plans expected per hour, and the "
             "grid's CI", "gCO2e", {"expected (plan)": [h.get("expected_total_g", 0.0) for h in hours]},
             [h["ci_actual_g_per_kwh"] for h in hours])
    plots = {
        "ci": ("grid CI (actual, fed hour by hour)", "gCO2e/kWh", {"actual": [h["ci_actual_g_per_kwh"] for h in hours]}),
        "plans": ("plan version in force", "version", {"plan": [h.get("plan_version", 0) for h in hours]}),
        "expected_carbon": ("expected carbon of the hour (plan)", "gCO2e",
                            {"planned": [h.get("expected_total_g", 0.0) for h in hours]}),
        "requests": ("requests through the router per virtual hour", "requests",
                     {"ok": [h["requests_ok"] for h in hours], "failed": [h["requests_failed"] for h in hours]}),
        "latency": ("client-side latency (p50)", "s", {"p50": [h["latency_p50_s"] or 0.0 for h in hours]}),
    }
    images = []
    for name, (title, ylabel, series) in plots.items():
        plot_series(out / f"{name}.png", title, ylabel, series)
        images.append(f'<img src="{name}.png" alt="{title}">')
    rows = "".join(
        f"<tr><td>{h['hour']:02d}:00</td><td>{h['ci_actual_g_per_kwh']:.0f}</td><td>{h.get('plan_version', '')}"
        f" {h.get('trigger', '')}</td><td>{h.get('fleet_matches_plan', '')}</td>"
        f"<td>{', '.join(f'{k}: {v}' for k, v in h.get('enforcement', {}).items())}</td>"
        f"<td>{h['requests_ok']}/{h['requests_ok'] + h['requests_failed']}</td></tr>" for h in hours)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>greenserve demo</title><style>{STYLE}</style>"
            f"</head><body><h1>greenserve demo: {html.escape(result['grid'])} on {result['day']}</h1>"
            + _decide_html(result)
            + f"<section id='hours'><h2>Hour by hour</h2><p>{len(hours)} virtual hours in {result['minutes']:g} "
            f"minutes ({result['speed']:g}x).</p><table><tr><th>hour</th><th>CI</th><th>plan in force</th>"
            f"<th>fleet matches</th><th>enforcement</th><th>requests ok</th></tr>{rows}</table>"
            + "".join(images) + "</section></body></html>")
    index = out / "index.html"
    index.write_text(page)
    return index
