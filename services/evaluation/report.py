"""The evaluation's report folder: ``result.json``, PNG plots and ``index.html``.

Every PNG carries the series it plots in its metadata (key ``greenserve-series``: JSON of ``{label: [y...]}``), so a
test or a reader can check that a plot shows what the JSON holds.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from greenserve.common.strict_json import dumps

SERIES_KEY = "greenserve-series"
GIB = 1 << 30


def plot_series(path: Path, title: str, ylabel: str, series: dict[str, list[float]], hline: float | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    for label, values in series.items():
        ax.plot(range(len(values)), values, label=label, marker="." if len(values) < 30 else None)
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1, label="target")
    ax.set_title(title)
    ax.set_xlabel("hour of day (UTC)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={SERIES_KEY: json.dumps(series)})
    plt.close(fig)


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
    sections = []
    for region, by_strategy in result["grids"].items():
        if not by_strategy:
            continue
        images = []
        for name, (title, ylabel, series, hline) in plots_for(region, by_strategy, target).items():
            plot_series(out_dir / f"{name}.png", title, ylabel, series, hline)
            images.append(f'<img src="{html.escape(name)}.png" alt="{html.escape(title)}">')
        rows = []
        for strategy, summary in result["summary"][region].items():
            saved = summary["saved_vs_base_fraction"]
            rows.append(f"<tr><td>{html.escape(strategy)}</td><td>{summary['total_g'] / 1000:.2f}</td>"
                        f"<td>{'' if saved is None else f'{saved:.1%}'}</td>"
                        f"<td>{summary['min_attainment_fraction']:.3f}</td>"
                        f"<td>{summary.get('accuracy_loss_fraction', 0.0):.2%}</td></tr>")
        sections.append(f"<h2>{html.escape(region)}</h2><table><tr><th>strategy</th><th>kgCO2e</th>"
                        f"<th>saved vs Full Cache + BASE</th><th>min hourly attainment</th><th>accuracy loss</th></tr>{''.join(rows)}</table>"
                        + "".join(images))
    sections.append(_headlines_html(result.get("headlines", [])) + _fidelity_html(result.get("fidelity", [])))
    strategies = "".join(f"<li><b>{html.escape(s)}</b>: {html.escape(d)}</li>"
                         for s, d in result["strategy_descriptions"].items())
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>greenserve evaluation {html.escape(result['day'])}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:auto}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px}}img{{max-width:100%}}</style></head>
<body><h1>greenserve evaluation: {html.escape(result['day'])}, {result['hours']} h</h1>
<p>Forecasts: {html.escape(result['forecast_model'])}; replay window per hour: {result['window_s']:g} s.</p>
<ul>{strategies}</ul>
<p><b>How far to trust it.</b> {html.escape(result.get('simplifications', ''))}</p>
{''.join(sections)}</body></html>"""
    index = out_dir / "index.html"
    index.write_text(page)
    return index


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
    return ("<h2>The seeds' headlines, reproduced in their own settings</h2>"
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
    return ("<h2>Simulator fidelity (published figures it was not fitted on)</h2>"
            + _table(["source", "quantity", "setup", "published", "model", "unit", "relative error"], body))


def plotted_series(png: Path) -> dict[str, list[float]]:
    """The series a report PNG plots (from its metadata)."""
    from PIL import Image

    with Image.open(png) as image:
        return json.loads(image.info[SERIES_KEY])
