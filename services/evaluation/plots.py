"""The PNG plots of the evaluation's and the demo's reports, readable for any number of hours: a few hours are bars
(a one-hour run drew a single dot on an x axis from -0.04 to 0.04), a day is lines; the hours are labelled as clock
times, and the y axis starts at 0 (fractions with a target: just below the lowest value or the target, up to 1).

Every PNG carries the series it plots in its metadata (key ``greenserve-series``: JSON of ``{label: [y...]}``) and its
axes (``greenserve-axes``: kind, x and y limits), so a test or a reader can check what a plot shows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

SERIES_KEY = "greenserve-series"
AXES_KEY = "greenserve-axes"
BARS_UP_TO_HOURS = 6  # up to this many hours a series is drawn as bars, beyond as a line


def _figure() -> tuple[Any, Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    return plt, fig, ax


def _hours_axis(ax: Any, n: int, first_hour: int) -> tuple[float, float]:
    step = 1 if n <= 12 else 3
    ticks = list(range(0, n, step))
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{(first_hour + i) % 24:02d}:00" for i in ticks], fontsize=8)
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_xlabel("hour of day (UTC)")
    return -0.6, n - 0.4


def y_limits(values: list[float], hline: float | None = None) -> tuple[float, float]:
    """From 0 (or the lowest negative value) to a little above the highest; a fraction with a target (every value and
    the target in [0, 1]) from just below the lowest of them to 1. Never an empty span (all zeros: 0 to 1)."""
    seen = [v for v in values if v is not None and math.isfinite(v)] + ([hline] if hline is not None else [])
    if not seen:
        return 0.0, 1.0
    lo, hi = min(seen), max(seen)
    if hline is not None and 0.0 <= lo and hi <= 1.0:
        return max(0.0, min(lo - 0.05, 0.95)), 1.005
    lo = min(lo, 0.0)
    hi = max(hi, 0.0)
    if hi - lo <= 0:
        return lo, lo + 1.0
    return lo, hi + 0.08 * (hi - lo)


def _draw(ax: Any, series: dict[str, list[float]], n: int) -> str:
    if n <= BARS_UP_TO_HOURS:
        width = 0.8 / max(len(series), 1)
        for i, (label, values) in enumerate(series.items()):
            ax.bar([x - 0.4 + width * (i + 0.5) for x in range(len(values))], values, width=width, label=label)
        return "bars"
    for label, values in series.items():
        ax.plot(range(len(values)), values, label=label, marker="." if len(values) < 30 else None)
    return "lines"


def _save(plt: Any, fig: Any, path: Path, series: dict[str, list[float]], axes: dict[str, Any]) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={SERIES_KEY: json.dumps(series), AXES_KEY: json.dumps(axes)})
    plt.close(fig)


def plot_series(path: Path, title: str, ylabel: str, series: dict[str, list[float]], hline: float | None = None,
                first_hour: int = 0) -> None:
    """One plot of hourly series (bars up to BARS_UP_TO_HOURS hours, else lines); ``hline``: a target line."""
    plt, fig, ax = _figure()
    n = max((len(v) for v in series.values()), default=0)
    kind = _draw(ax, series, n)
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1, label="target")
    xlim = _hours_axis(ax, max(n, 1), first_hour)
    ylim = y_limits([v for values in series.values() for v in values], hline)
    ax.set_ylim(*ylim)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    _save(plt, fig, path, series, {"kind": kind, "xlim": xlim, "ylim": ylim})


def plot_day(path: Path, title: str, ylabel: str, series: dict[str, list[float]], ci: list[float],
             first_hour: int = 0) -> None:
    """The picture of the day: the series (each strategy's carbon per hour) and the grid's CI on a second axis."""
    plt, fig, ax = _figure()
    n = max(len(ci), *(len(v) for v in series.values())) if series else len(ci)
    kind = _draw(ax, series, n)
    xlim = _hours_axis(ax, max(n, 1), first_hour)
    ylim = y_limits([v for values in series.values() for v in values])
    ax.set_ylim(*ylim)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    right = ax.twinx()
    right.plot(range(len(ci)), ci, color="black", linestyle=":", marker="o" if len(ci) <= BARS_UP_TO_HOURS else None,
               label="grid CI (right axis)")
    right.set_ylim(*y_limits(ci))
    right.set_ylabel("gCO2e/kWh")
    handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25),
              ncol=min(len(handles), 4), frameon=False)  # below the plot: over it, it hid a day's lines
    _save(plt, fig, path, {**series, "grid CI": ci}, {"kind": kind, "xlim": xlim, "ylim": ylim})


def _info(png: Path, key: str) -> Any:
    from PIL import Image

    with Image.open(png) as image:
        return json.loads(image.info[key])


def plotted_series(png: Path) -> dict[str, list[float]]:
    """The series a report PNG plots (from its metadata)."""
    return _info(png, SERIES_KEY)


def plotted_axes(png: Path) -> dict[str, Any]:
    """How a report PNG draws them: ``kind`` (bars or lines), ``xlim`` and ``ylim``."""
    return _info(png, AXES_KEY)
