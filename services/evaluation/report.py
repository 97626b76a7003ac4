"""The evaluation's report folder: ``result.json``, PNG plots (plots.py) and ``index.html``.

The page opens with what an operator decides on (per grid and strategy: carbon, energy, the SLO attainment of the
worst hour, cache and engine changes, and one picture of the day), then the hourly plots, the strategies and how far
to trust the replay, and last, as an appendix, how we checked the method (the seeds' headlines reproduced, the
simulator's fidelity).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from greenserve.common.strict_json import dumps
from greenserve.evaluation import operator_table
from greenserve.evaluation.plots import plot_day, plot_series

GIB = 1 << 30
STYLE = ("body{font-family:sans-serif;max-width:60em;margin:auto}table{border-collapse:collapse}"
         "td,th{border:1px solid #ccc;padding:2px 8px}td.n{text-align:right}img{max-width:100%}.low{color:#b00}")


def plots_for(region: str, by_strategy: dict[str, Any], target: float) -> dict[str, tuple[str, str, dict[str, list[float]], float | None]]:
    """name -> (title, y label, series, horizontal line) of one grid's plots."""
    first = next(iter(by_strategy.values()))["hours"]
    plots = {
        f"{region}_ci": (f"{region}: carbon intensity, actual vs forecast", "gCO2e/kWh",
                         {"actual": [h["ci_actual_g_per_kwh"] for h in first],
                          "forecast": [h["ci_forecast_g_per_kwh"] for h in first]}, None),
        f"{region}_load": (f"{region}: load, actual vs forecast", "requests/s",
                           {"actual": [h["load_actual_requests_per_s"] for h in first],
                            "forecast": [h["load_forecast_requests_per_s"] for h in first]}, None),
        f"{region}_carbon": (f"{region}: total carbon per hour by strategy", "gCO2e",
                             {s: [h["total_g"] for h in r["hours"]] for s, r in by_strategy.items()}, None),
        f"{region}_attainment": (f"{region}: SLO attainment per hour (TTFT and TPOT)", "fraction",
                                 {s: [h["attainment_fraction"] for h in r["hours"]] for s, r in by_strategy.items()},
                                 target),
        f"{region}_cache": (f"{region}: cache size per hour (summed over pools)", "GiB",
                            {s: [sum(h["cache_bytes"].values()) / GIB for h in r["hours"]]
                             for s, r in by_strategy.items()}, None),
    }
    if any(h.get("mig_layout") for r in by_strategy.values() for h in r["hours"]):  # a scenario declaring MIG GPUs
        plots[f"{region}_mig"] = (f"{region}: MIG layout, engines per hour (instances; whole GPUs unpartitioned)",
                                  "engines", {s: [float(sum(n for layout in h.get("mig_layout", {}).values()
                                                            for n in layout.values())) for h in r["hours"]]
                                              for s, r in by_strategy.items()}, None)
        plots[f"{region}_accuracy"] = (f"{region}: accuracy loss per hour (traffic-weighted 1 - quality)", "fraction",
                                       {s: [h.get("accuracy_loss_fraction", 0.0) for h in r["hours"]]
                                        for s, r in by_strategy.items()}, None)
    return plots


def write(result: dict[str, Any], out_dir: Path) -> Path:
    """Writes result.json, the plots and index.html into ``out_dir``; returns the HTML path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "result.json").write_text(dumps(result) + "\n")
    target = min((p["attainment_fraction"] for p in result["scenario"]), default=0.9)
    decide, hourly = [], []
    for region, by_strategy in result["grids"].items():
        if not by_strategy:
            continue
        decide.append(_operator_html(region, by_strategy, target, result["hours"], out_dir))
        images = []
        for name, (title, ylabel, series, hline) in plots_for(region, by_strategy, target).items():
            plot_series(out_dir / f"{name}.png", title, ylabel, series, hline)
            images.append(f'<img src="{html.escape(name)}.png" alt="{html.escape(title)}">')
        hourly.append(f"<h3>{html.escape(region)}</h3>" + "".join(images))
    strategies = "".join(f"<li><b>{html.escape(s)}</b>: {html.escape(d)}</li>"
                         for s, d in result["strategy_descriptions"].items())
    checks = _headlines_html(result.get("headlines", [])) + _fidelity_html(result.get("fidelity", []))
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>greenserve evaluation {html.escape(result['day'])}</title>
<style>{STYLE}</style></head>
<body><h1>greenserve evaluation: {html.escape(result['day'])}, {result['hours']} h</h1>
<section id="operator"><h2>What to decide on</h2>
<p>Per strategy, on the simulated fleet: its carbon (operational + embodied) and energy over the {result['hours']} h
replayed, the SLO attainment (TTFT and TPOT) of its worst hour against the target of {target:.2f}, and how many
hours changed the cache sizes or the engines (how many are weighted or asleep, serving modes, MIG layouts) from the
hour before. Forecasts: {html.escape(result['forecast_model'])}; traffic replayed per hour: {result['window_s']:g} s.</p>
{''.join(decide)}</section>
<section id="hours"><h2>Hour by hour</h2>{''.join(hourly)}</section>
<section id="strategies"><h2>The strategies</h2><ul>{strategies}</ul>
<p><b>How far to trust it.</b> {html.escape(result.get('simplifications', ''))}</p></section>
<section id="appendix"><h2>Appendix: how we checked the method</h2>
{checks or "<p>Not run this time (greenserve evaluate --headlines quick or full runs the seeds' headlines).</p>"}
</section></body></html>"""
    index = out_dir / "index.html"
    index.write_text(page)
    return index


def _operator_html(region: str, by_strategy: dict[str, Any], target: float, hours: int, out_dir: Path) -> str:
    """A grid's table of what to decide on, and its picture of the day (each strategy's carbon per hour, the CI)."""
    rows = operator_table.rows(by_strategy)
    mig = any(r["accuracy_loss_fraction"] for r in rows)
    span = "per day" if hours == 24 else f"in {hours} h"
    head = ["strategy", "kgCO2e", "vs Full Cache + BASE", "kWh", "SLO attainment, worst hour", f"cache changes {span}",
            f"engine changes {span}"] + (["accuracy loss"] if mig else [])
    body = []
    for r in rows:
        saved = ("reference" if r["strategy"] == operator_table.BASE else "" if r["saved_fraction"] is None
                 else f"{-r['saved_fraction']:+.1%}")
        worst = "" if r["worst_attainment_fraction"] is None else (
            f"{r['worst_attainment_fraction']:.3f} at {r['worst_hour']:02d}:00")
        low = r["worst_attainment_fraction"] is not None and r["worst_attainment_fraction"] < target
        cells = [html.escape(r["strategy"]), f"{r['carbon_kg']:.3f}", saved, f"{r['energy_kwh']:.2f}",
                 f"<span class='low'>{worst} (below target)</span>" if low else worst,
                 str(r["cache_changes"]), str(r["engine_changes"])] + (
                    [f"{r['accuracy_loss_fraction']:.2%}"] if mig else [])
        body.append("<tr>" + "".join(f"<td>{c}</td>" if i == 0 else f"<td class='n'>{c}</td>"
                                     for i, c in enumerate(cells)) + "</tr>")
    first = next(iter(by_strategy.values()))["hours"]
    name = f"{region}_day"
    title = f"{region}: carbon per hour by strategy, and the grid's CI"
    plot_day(out_dir / f"{name}.png", title, "gCO2e",
             {s: [h["total_g"] for h in r["hours"]] for s, r in by_strategy.items()},
             [h["ci_actual_g_per_kwh"] for h in first])
    table = ("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>" + "".join(body)
             + "</table>")
    return f"<h3>{html.escape(region)}</h3>{table}<img src='{html.escape(name)}.png' alt='{html.escape(title)}'>"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _headlines_html(rows: list[dict[str, Any]]) -> str:
    """The seeds' headlines reproduced in their own settings (headlines/__init__.py), one row per figure."""
    if not rows:
        return ""
    from greenserve.evaluation.headlines import table_rows

    flat = table_rows(rows)
    notes = "".join(f"<li><b>{html.escape(r['name'])}</b>: {html.escape(n)}</li>" for r in rows if r["status"] == "ok"
                    for n in r["result"]["notes"])
    return ("<h3>The seeds' headlines, reproduced in their own settings</h3>"
            + _table(["seed", "setting", "figure", "paper", "ours", "within tolerance"],
                     [list(r.values()) for r in flat])
            + (f"<ul>{notes}</ul>" if notes else ""))


def _fidelity_html(rows: list[dict[str, Any]]) -> str:
    """The simulator's fidelity table (simulator/fidelity.py): how far to trust the replay."""
    if not rows:
        return ""
    body = []
    for r in rows:
        if r["kind"] == "bound":
            verdict = f"{'holds' if r['holds'] else 'VIOLATED'} (model {r['bound']} published)"
        else:
            verdict = "n/a" if r["relative_error"] is None else f"{r['relative_error']:+.1%}"
        body.append([r["source"], r["quantity"], r["setup"], f"{r['published']:.4g}", f"{r['model']:.4g}", r["unit"],
                     verdict])
    return ("<h3>Simulator fidelity (published figures it was not fitted on)</h3>"
            + _table(["source", "quantity", "setup", "published", "model", "unit", "relative error"], body))
