"""Readers for the time-series files the forecaster ingests, and resampling onto a regular grid.

Every reader returns a :class:`RawSeries`: UTC timestamps (epoch seconds) and float values, in file order,
plus a name and what the values measure. :func:`to_grid` turns that into a :class:`RegularSeries` on a regular
step with NaN where no observation exists (gaps are reported, never invented).

Layouts (columns chosen by flag, or detected from the header by :func:`detect_layout`):

* ``electricitymaps``: Electricity Maps data-portal CSV (``Datetime (UTC)``, ``Carbon Intensity gCO₂eq/kWh
  (direct)`` / ``(LCA)``; the "₂" may be a plain "2" after a spreadsheet round trip). Also the derived FI/SE3
  files (``Carbon Intensity gCO2eq/kWh (LCA, derived)``).
* ``ensembleci``: EnsembleCI / CarbonCast CSV (``UTC time``, ``carbon_intensity``, generation mix in MW).
* ``letswaitawhile``: Wiesner et al. (``Time``, ``Carbon Intensity``), 15/30-min steps.
* ``generic``: any CSV with ``--time-column`` and ``--value-column``.

Load traces: Azure LLM 2024 per-minute / hourly counts, Azure LLM 2023 per-request trace (turned into counts per
interval), WorldCup98 per-minute counts, ServeGen 10-min rates (windows where every client is 0 are collection
gaps: missing, not zero load). Counts become rates (requests per second) so every load series is in
``UNIT_REQUESTS_PER_S``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from greenserve.common.csv_input import (
    MIN_BIN_COVERAGE_FRACTION,
    header_column,
    infer_step_s,
)

HOUR_S = 3600

#: Column-name fragments that identify a layout (case-insensitive, "₂" folded to "2").
LAYOUT_SIGNATURES: dict[str, tuple[str, ...]] = {
    "electricitymaps": ("datetime (utc)", "carbon intensity gco2eq/kwh"),
    "ensembleci": ("utc time", "carbon_intensity"),
    "letswaitawhile": ("time", "carbon intensity"),
}


#: The package's root folder (``greenserve``): the series it ships (the evaluation's grids, the demo's load trace)
#: are found under it, so that the benchmark runs on a clone or an installed package alone.
PACKAGE_DIR = Path(__file__).resolve().parents[1]


@dataclass
class RawSeries:
    """Observations as read: UTC epoch seconds and values, one per row (not necessarily regular)."""

    name: str
    times_s: np.ndarray  # int64 epoch seconds (UTC)
    values: np.ndarray  # float64
    kind: str = "ci"  # "ci" or "load"
    signal: str = "direct"  # ci: direct/lifecycle; load: requests_per_s, ...
    region: str = ""
    source: str = ""
    resolution_s: int = 0  # native step when known (0: infer)


@dataclass
class RegularSeries:
    """A regular series: ``values[i]`` covers ``[start_s + i*step_s, start_s + (i+1)*step_s)``; NaN = missing."""

    name: str
    start_s: int
    step_s: int
    values: np.ndarray
    kind: str = "ci"
    signal: str = "direct"
    region: str = ""
    source: str = ""
    meta: dict[str, str] = field(default_factory=dict)

    @property
    def times_s(self) -> np.ndarray:
        return self.start_s + self.step_s * np.arange(len(self.values), dtype=np.int64)

    def missing_runs(self) -> list[tuple[int, int]]:
        """(start_s, count) of each run of missing steps."""
        return missing_runs(self.start_s, self.step_s, self.values)


def missing_runs(start_s: int, step_s: int, values: np.ndarray) -> list[tuple[int, int]]:
    """Runs of NaN in a regular series as (first missing time, number of steps)."""
    nan = np.isnan(values)
    if not nan.any():
        return []
    edges = np.diff(np.concatenate(([0], nan.view(np.int8), [0])))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    return [(int(start_s + s * step_s), int(e - s)) for s, e in zip(starts, ends, strict=True)]


# ---------------------------------------------------------------------------------------------------------
# Parsing helpers
# ---------------------------------------------------------------------------------------------------------


def _fold(name: str) -> str:
    return name.strip().lower().replace("₂", "2")


def _find_column(columns: list[str], *fragments: str) -> str | None:
    for col in columns:
        folded = _fold(col)
        if all(f in folded for f in fragments):
            return col
    return None


def _epoch_s(parsed: pd.Series | pd.DatetimeIndex) -> np.ndarray:
    return np.asarray(pd.DatetimeIndex(parsed).as_unit("s").asi8, dtype=np.int64)


def _row(raw: pd.Series, position: int) -> str:
    """The file row of ``raw``'s ``position``-th cell: its frame index + 2 (the header is row 1)."""
    label = raw.index[position]
    return f"row {label + 2}" if isinstance(label, (int, np.integer)) else f"row {label!r}"


def _check_day_month_order(raw: pd.Series, dayfirst: bool) -> None:
    """Refuse numeric dates whose day/month order the rows contradict (a spreadsheet's ``13/01/2022 00:00``).

    pandas' ``format="mixed"`` parses each cell on its own: month first (``dayfirst`` False), except a cell that can
    only be day first, which it silently reads day first. A DD/MM file read without ``--dayfirst`` thus swapped day
    and month of every date up to the 12th (1 February became 2 January) and kept the others: a scrambled series
    with no gap and no error. Such a column is refused naming a row that shows the order, so that the user passes
    ``--dayfirst`` (or ``--time-format``)."""
    if not (raw.dtype == object or pd.api.types.is_string_dtype(raw.dtype)):  # numbers: no dates to check
        return
    parts = raw.astype(str).str.extract(r"^\s*(\d{1,2})[/.-](\d{1,2})[/.-]\d{2,4}\b")
    if parts[0].isna().all():
        return
    later = pd.to_numeric(parts[1 if dayfirst else 0], errors="coerce") > 12  # can only be the day
    if later.any():
        bad = int(np.flatnonzero(later.to_numpy())[0])
        order, flag = ("MM/DD", "without --dayfirst") if dayfirst else ("DD/MM", "--dayfirst")
        raise ValueError(f"column {raw.name!r}: {_row(raw, bad)}: {raw.iloc[bad]!r} is a {order} date: give "
                         f"{flag} (or --time-format), else the dates up to the 12th read with day and month swapped")


def _times(raw: pd.Series, time_format: str | None = None, dayfirst: bool = False) -> np.ndarray:
    """Epoch seconds of a time column; a cell that is not a time is refused naming the column and its row.

    ``raw`` keeps the frame's index (``pd.read_csv``: 0 for the first data row), so a row is ``index + 2`` in the
    file (its header is row 1), filtered or not. pandas raised "Unknown datetime string format, unable to parse:
    garbage" without the column or the row on the first such cell, so the column is parsed leniently first and a
    cell that does not parse is then named."""
    if time_format is None and pd.api.types.is_numeric_dtype(raw.dtype) and not pd.api.types.is_bool_dtype(raw.dtype):
        # Unix time (a Prometheus or database export): pandas read the integers as nanoseconds, so a year of hours
        # fell into the first second of 1970 (one hourly point). The unit is the one that puts the largest value
        # before the year 5138: seconds, else milliseconds, microseconds, nanoseconds.
        largest = float(np.nanmax(np.abs(raw.to_numpy(dtype=np.float64)))) if raw.notna().any() else 0.0
        unit = next(u for limit, u in ((1e11, "s"), (1e14, "ms"), (1e17, "us"), (math.inf, "ns")) if largest < limit)
        parsed = pd.to_datetime(raw, unit=unit, utc=True, errors="coerce")
        if parsed.isna().any():
            bad = int(np.flatnonzero(parsed.isna().to_numpy())[0])
            raise ValueError(f"column {raw.name!r}: {_row(raw, bad)}: no time ({raw.iloc[bad]!r})")
        return _epoch_s(parsed)
    if time_format is None:
        _check_day_month_order(raw, dayfirst)
    try:
        parsed = pd.to_datetime(raw, utc=True, format=time_format or "mixed", dayfirst=dayfirst, errors="coerce")
    except (ValueError, TypeError) as exc:  # a --time-format that is no strftime format
        raise ValueError(f"column {raw.name!r}: {exc}") from None
    if parsed.isna().any():
        bad = int(np.flatnonzero(parsed.isna().to_numpy())[0])
        raise ValueError(f"column {raw.name!r}: {_row(raw, bad)}: unparseable time {raw.iloc[bad]!r}"
                         + (f" (--time-format {time_format!r})" if time_format else ""))
    return _epoch_s(parsed)


def _check_repeated_times(raw: pd.Series, times_s: np.ndarray, values: np.ndarray) -> None:
    """Refuse one instant given two different values, naming both rows. The usual cause is local time without
    its offset: the hour the clocks go back appears twice, and the resampler kept the last value without a word
    (the evaluation's reader refuses the same file). A row given twice with the same value (or a missing one)
    passes."""
    order = np.argsort(times_s, kind="stable")
    t, v = times_s[order], values[order]
    same = np.flatnonzero((t[1:] == t[:-1]) & np.isfinite(v[1:]) & np.isfinite(v[:-1]) & (v[1:] != v[:-1]))
    if len(same):
        first, second = int(order[same[0]]), int(order[same[0] + 1])
        raise ValueError(f"column {raw.name!r}: {_row(raw, first)} and {_row(raw, second)} give the same time "
                         f"{raw.iloc[second]!r} two different values ({values[first]:g}, {values[second]:g}): local "
                         "time without its UTC offset (the hour the clocks go back, twice)? Give the times with "
                         "their offset or in UTC")


def _values(raw: pd.Series) -> np.ndarray:
    return pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)


def read_header(path: Path) -> list[str]:
    try:
        return list(pd.read_csv(path, nrows=0, comment="#").columns)
    except pd.errors.EmptyDataError:  # pandas: "No columns to parse from file", naming no file
        raise ValueError(f"{Path(path).name}: empty file (no header)") from None


def detect_layout(columns: list[str]) -> str:
    """Name of the CI layout a header matches, else ``generic``."""
    folded = [_fold(c) for c in columns]
    for layout, fragments in LAYOUT_SIGNATURES.items():
        if all(any(f == c or f in c for c in folded) for f in fragments):
            if layout == "letswaitawhile" and "time" not in folded:
                continue
            return layout
    return "generic"


def _signal_of(value_column: str) -> str:
    folded = _fold(value_column)
    return "lifecycle" if ("lca" in folded or "lifecycle" in folded) else "direct"


# ---------------------------------------------------------------------------------------------------------
# CI readers
# ---------------------------------------------------------------------------------------------------------


def read_csv_series(
    path: str | Path,
    *,
    time_column: str | None = None,
    value_column: str | None = None,
    layout: str | None = None,
    signal: str | None = None,
    region: str | None = None,
    kind: str = "ci",
    time_format: str | None = None,
    dayfirst: bool = False,
    filter_column: str | None = None,
    filter_value: str | None = None,
) -> RawSeries:
    """Read one value column of a CSV as a series.

    ``layout`` picks default time/value columns (``electricitymaps``: direct CI; ``ensembleci``:
    ``carbon_intensity``; ``letswaitawhile``: ``Carbon Intensity``); explicit ``time_column``/``value_column``
    win. ``filter_column``/``filter_value`` keep only matching rows (long files such as the Azure hourly one).
    Raises ``ValueError`` naming the missing column or the bad row.
    """
    path = Path(path)
    columns = read_header(path)
    layout = layout or detect_layout(columns)
    if time_column is None:
        time_column = {
            "electricitymaps": _find_column(columns, "datetime"),
            "ensembleci": _find_column(columns, "utc time"),
            "letswaitawhile": _find_column(columns, "time"),
        }.get(layout)
    if value_column is None:
        if layout == "electricitymaps":
            want = "lca" if signal == "lifecycle" else "direct"
            value_column = _find_column(columns, "carbon intensity", want) or _find_column(columns, "carbon intensity")
        elif layout == "ensembleci":
            value_column = _find_column(columns, "carbon_intensity")
        elif layout == "letswaitawhile":
            value_column = _find_column(columns, "carbon intensity")

    def found(what: str, wanted: str | None) -> str:
        match = header_column(columns, wanted) if wanted else None
        if match is None:
            raise ValueError(f"{what} column {wanted!r} not in {path.name} (columns: {', '.join(columns)})")
        return match

    time_column = found("time", time_column)
    value_column = found("value", value_column)
    filter_column = None if filter_column is None else found("filter", filter_column)
    usecols = [time_column, value_column] + ([filter_column] if filter_column else [])
    frame = pd.read_csv(path, usecols=usecols, comment="#")
    if filter_column:
        frame = frame[frame[filter_column].astype(str) == str(filter_value)]
    if frame.empty:  # a header alone ended in numpy's "zero-size array to reduction operation minimum"
        kept = f" with {filter_column} = {filter_value!r}" if filter_column else ""
        raise ValueError(f"{path.name}: no data rows{kept}")
    times = _times(frame[time_column], time_format, dayfirst)
    values = _values(frame[value_column])
    _check_repeated_times(frame[time_column], times, values)
    if region is None:
        zone = _find_column(columns, "zone id")
        if zone:
            first = pd.read_csv(path, usecols=[zone], nrows=1)[zone]
            region = str(first.iloc[0]) if len(first) else ""
        else:
            region = path.stem.split("_")[0]
    return RawSeries(
        name=f"{path.stem}:{value_column}",
        times_s=times,
        values=values,
        kind=kind,
        signal=signal or (_signal_of(value_column) if kind == "ci" else "requests_per_s"),
        region=region or "",
        source=f"{layout}-csv",
    )


# ---------------------------------------------------------------------------------------------------------
# Load readers
# ---------------------------------------------------------------------------------------------------------

#: First day (00:00 UTC) of each service of the Azure 2024 per-minute file (minute 0, as the aggregation's header
#: comment says: code from Friday 2024-05-10, conversation from Sunday 2024-05-12).
AZURE_2024_START = {"code": "2024-05-10T00:00:00Z", "conv": "2024-05-12T00:00:00Z"}

#: ServeGen has relative times only: t=0 is 00:00 *local* time on day 0 (ServeGen's README reads t = 72,000-75,600 s
#: as 20:00-21:00), presumably China Standard Time (UTC+8) for an Alibaba Cloud service; no date is published. It is
#: placed at a nominal local midnight, 2025-01-06 00:00 UTC+8 = 2025-01-05 16:00 UTC, so that the trace sits on UTC
#: like every other series (the backtest's days are UTC days, as the optimizer's are; WorldCup98 and Azure are
#: stored in UTC too).
SERVEGEN_LOCAL_DAY0 = "2025-01-06"
SERVEGEN_UTC_OFFSET_S = 8 * 3600
#: A ServeGen window below this fraction of the median total rate is a partly collected window (a gap).
SERVEGEN_PARTIAL_FRACTION = 0.05


def _epoch(text: str) -> int:
    return int(pd.Timestamp(text).timestamp())


def read_azure_2024_minutes(path: str | Path, service: str) -> RawSeries:
    """Azure LLM 2024 per-minute request counts of one service (``code`` or ``conv``) as req/s per minute."""
    if service not in AZURE_2024_START:
        raise ValueError(f"service must be one of {sorted(AZURE_2024_START)}, got {service!r}")
    frame = pd.read_csv(path, comment="#")
    column = f"{service}_requests"
    times = _epoch(AZURE_2024_START[service]) + 60 * frame["minute"].to_numpy(dtype=np.int64)
    return RawSeries(
        name=f"azure2024-{service}", times_s=times, values=_values(frame[column]) / 60.0, kind="load",
        signal="requests_per_s", region=f"azure2024-{service}", source="azure-2024-minutes", resolution_s=60,
    )


def read_count_per_minute(path: str | Path, *, time_column: str = "period", count_column: str = "count",
                          name: str = "worldcup98") -> RawSeries:
    """Per-minute request counts (WorldCup98 layout) as req/s per minute; absent minutes stay absent."""
    frame = pd.read_csv(path, comment="#")
    return RawSeries(
        name=name, times_s=_times(frame[time_column]), values=_values(frame[count_column]) / 60.0, kind="load",
        signal="requests_per_s", region=name, source="count-per-minute-csv", resolution_s=60,
    )


def read_servegen_rates(path: str | Path, model: str) -> RawSeries:
    """ServeGen per-model total rate (req/s per 10-min window) with collection gaps as NaN.

    Gaps: windows where every released client is 0 (m-mid has 84 in 8 runs, m-large none), and the windows at
    the edges of those runs whose total is below :data:`SERVEGEN_PARTIAL_FRACTION` of the series median (m-mid
    has 1-25 req/s there against a median near 2,000: a partly collected window, not a real load drop).
    """
    frame = pd.read_csv(path)
    rate = _values(frame[f"{model}_rate_rps"])
    zero = frame[f"{model}_all_clients_zero"].to_numpy() == 1
    rate = np.where(zero, np.nan, rate)
    rate = np.where(rate < SERVEGEN_PARTIAL_FRACTION * np.nanmedian(rate), np.nan, rate)
    t0_s = _epoch(f"{SERVEGEN_LOCAL_DAY0}T00:00:00Z") - SERVEGEN_UTC_OFFSET_S  # local midnight, in UTC
    times = t0_s + frame["t_s"].to_numpy(dtype=np.int64)
    return RawSeries(
        name=f"servegen-{model}", times_s=times, values=rate, kind="load", signal="requests_per_s",
        region=f"servegen-{model.replace('_', '-')}", source="servegen-csv", resolution_s=600,
    )


def requests_to_counts(
    request_times_s: np.ndarray, step_s: int, start_s: int | None = None, end_s: int | None = None
) -> tuple[int, np.ndarray]:
    """Per-request arrival times to requests/s per interval of ``step_s`` (an empty interval inside the span
    is a real zero: the trace lists every request). Returns (grid start, rates)."""
    t = np.sort(np.asarray(request_times_s, dtype=np.float64))
    first = int(start_s if start_s is not None else np.floor(t[0] / step_s) * step_s)
    last = int(end_s if end_s is not None else (np.floor(t[-1] / step_s) + 1) * step_s)
    n = max(1, (last - first) // step_s)
    idx = ((t - first) // step_s).astype(np.int64)
    idx = idx[(idx >= 0) & (idx < n)]
    counts = np.bincount(idx, minlength=n).astype(np.float64)
    return first, counts / step_s


def read_azure_request_trace(path: str | Path, step_s: int = 60, name: str = "azure2023-conv") -> RegularSeries:
    """Azure LLM 2023 per-request trace (``TIMESTAMP,ContextTokens,GeneratedTokens``) to req/s per interval.

    Only whole intervals inside the trace's span are kept (a partial first/last interval would read low).
    """
    frame = pd.read_csv(path)
    precise = pd.to_datetime(frame["TIMESTAMP"], utc=True, format="mixed")
    t = (precise - pd.Timestamp("1970-01-01", tz="UTC")).dt.total_seconds().to_numpy()
    start = int(np.ceil(t.min() / step_s) * step_s)
    end = int(np.floor(t.max() / step_s) * step_s)
    first, rates = requests_to_counts(t, step_s, start, end)
    return RegularSeries(name=name, start_s=first, step_s=step_s, values=rates, kind="load",
                      signal="requests_per_s", region=name, source="azure-request-trace")


# ---------------------------------------------------------------------------------------------------------
# Resampling
# ---------------------------------------------------------------------------------------------------------


def to_grid(raw: RawSeries, step_s: int = HOUR_S,
            min_coverage_fraction: float = MIN_BIN_COVERAGE_FRACTION) -> RegularSeries:
    """Resample onto a regular ``step_s`` grid aligned to multiples of ``step_s`` (UTC).

    Finer data: each bin is the mean of the observations in it, missing when fewer than
    ``min_coverage_fraction`` of the bin's native steps are present (a mostly-empty hour would be a guess).
    Same step: duplicates keep the last value (a user's CSV with one instant given two values is refused before,
    ``read_csv_series``). Coarser data is not upsampled (refused). NaN observations count
    as missing.
    """
    native = raw.resolution_s or infer_step_s(raw.times_s)
    if native > step_s:
        raise ValueError(f"{raw.name}: native step {native}s is coarser than the requested {step_s}s")
    ok = np.isfinite(raw.values)
    t, v = raw.times_s[ok], raw.values[ok]
    all_t = raw.times_s
    start = int(np.floor(all_t.min() / step_s) * step_s)
    end = int(np.floor(all_t.max() / step_s) * step_s) + step_s
    n = (end - start) // step_s
    idx = (t - start) // step_s
    sums = np.bincount(idx, weights=v, minlength=n)
    counts = np.bincount(idx, minlength=n).astype(np.float64)
    per_bin = max(1, step_s // native)
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.where(counts >= max(1.0, min_coverage_fraction * per_bin), sums / counts, np.nan)
    if per_bin == 1:  # same step: last value wins for duplicates
        last = np.full(n, np.nan)
        last[idx] = v
        values = np.where(counts > 0, last, np.nan)
    # trim leading/trailing partial bins that fell below coverage
    finite = np.flatnonzero(np.isfinite(values))
    if len(finite) == 0:
        raise ValueError(f"{raw.name}: no finite values")
    lo, hi = int(finite[0]), int(finite[-1]) + 1
    return RegularSeries(
        name=raw.name, start_s=start + lo * step_s, step_s=step_s, values=values[lo:hi], kind=raw.kind,
        signal=raw.signal, region=raw.region, source=raw.source,
    )


# ---------------------------------------------------------------------------------------------------------
# The benchmark catalogue: the series the package ships, or every series of a folder of the public datasets
# ---------------------------------------------------------------------------------------------------------

#: Shipped series (paths under :data:`PACKAGE_DIR`; provenance and licences in the SOURCE.md beside each file):
#: the evaluation's four grids, 2022-06-15 to 2022-07-06 life-cycle (22 days: 8 backtest days behind 336 h of
#: history), and the demo's Azure 2024 conversation week (168 h: 4 days behind 72 h). The demo's Spanish grid
#: (14 days) and the evaluation's 24-h files are too short for the benchmark's windows and are left out.
SHIPPED_CI_CSV = "evaluation/data/ci_2022-06-15_2022-07-06_lifecycle.csv"
SHIPPED_CI_REGIONS = {"FR": "em/FR_2022-06", "ES": "em/ES_2022-06", "CISO": "em/US-CAL-CISO_2022-06",
                      "FI": "em-derived/FI_2022-06"}
SHIPPED_LOAD_CSV = "common/data/demo/azure2024_conv_requests_hourly.csv"


@dataclass(frozen=True)
class CatalogEntry:
    """One series of a data folder (the shipped one or a public-dataset folder) and how to load it hourly."""

    name: str
    kind: str  # "ci" or "load"
    path: str  # relative to the data dir (shipped entries: to PACKAGE_DIR)
    loader: str  # "ci-csv", "azure2024", "worldcup", "servegen"; shipped: "region-ci-csv", "hourly-counts"
    signal: str = "direct"
    arg: str = ""  # the service, model or region the loader picks from a file holding several


def shipped_catalog() -> list[CatalogEntry]:
    """The series shipped with the package, read by :func:`load_entry` with no data dir."""
    entries = [CatalogEntry(f"{prefix}/lifecycle", "ci", SHIPPED_CI_CSV, "region-ci-csv", "lifecycle", region)
               for region, prefix in SHIPPED_CI_REGIONS.items()]
    entries.append(CatalogEntry("load/azure2024-conv", "load", SHIPPED_LOAD_CSV, "hourly-counts", "requests_per_s",
                                "azure2024-conv"))
    return entries


def catalog(data_dir: Path | None = None) -> list[CatalogEntry]:
    """The series of ``data_dir``, a folder laid out like the public datasets (one sub-folder per dataset, the
    upstream file names: see ``greenserve bench forecaster --help``); no folder: the shipped series."""
    if data_dir is None:
        return shipped_catalog()
    data = data_dir
    entries: list[CatalogEntry] = []
    for folder in ("ci_electricitymaps_greendcc", "ci_electricitymaps_es"):
        for path in sorted((data / folder).glob("*_hourly.csv")):
            for signal in ("direct", "lifecycle"):
                entries.append(CatalogEntry(f"em/{path.stem.replace('_hourly', '')}/{signal}", "ci",
                                            str(path.relative_to(data)), "ci-csv", signal))
    fr = data / "ci_electricitymaps_fr2022" / "FR_2022_hourly_normalized.csv"
    if fr.exists():
        for signal in ("direct", "lifecycle"):
            entries.append(CatalogEntry(f"em/FR_2022/{signal}", "ci", str(fr.relative_to(data)), "ci-csv", signal))
    for path in sorted((data / "ci_em2022_derived_fi_se3").glob("*.csv")):
        entries.append(CatalogEntry(f"em-derived/{path.stem.split('_')[0]}_2022/lifecycle", "ci",
                                    str(path.relative_to(data)), "ci-csv", "lifecycle"))
    for path in sorted((data / "ci_ensembleci").glob("*_emissions.csv")):
        region, signal = path.stem.split("_")[0], path.stem.split("_")[1]
        if region == "DE" and signal == "lifecycle":
            continue  # upstream bug: its values repeat DE direct row for row; scoring it twice would double-count
        entries.append(CatalogEntry(f"ensembleci/{region}/{signal}", "ci", str(path.relative_to(data)), "ci-csv",
                                    signal))
    for path in sorted((data / "ci_letswaitawhile_2020").glob("*_ci.csv")):
        entries.append(CatalogEntry(f"letswaitawhile/{path.stem.split('_')[0].upper()}_2020/lifecycle", "ci",
                                    str(path.relative_to(data)), "ci-csv", "lifecycle"))
    azure = data / "azure_llm_2024_week" / "azure2024_llm_requests_per_minute.csv"
    if azure.exists():
        for service in ("code", "conv"):
            entries.append(CatalogEntry(f"load/azure2024-{service}", "load", str(azure.relative_to(data)),
                                        "azure2024", "requests_per_s", service))
    servegen = data / "servegen_bailian_language" / "servegen_language_total_rate_10min.csv"
    if servegen.exists():
        for model in ("m_large", "m_mid"):
            entries.append(CatalogEntry(f"load/servegen-{model.replace('_', '-')}", "load",
                                        str(servegen.relative_to(data)), "servegen", "requests_per_s", model))
    worldcup = data / "worldcup98_http" / "invocation_count.csv"
    if worldcup.exists():
        entries.append(CatalogEntry("load/worldcup98", "load", str(worldcup.relative_to(data)), "worldcup",
                                    "requests_per_s"))
    return entries


def load_entry(entry: CatalogEntry, data_dir: Path | None = None, step_s: int = HOUR_S) -> RegularSeries:
    """Load one catalogue entry onto an hourly grid (``data_dir`` None: a shipped entry)."""
    path = (data_dir or PACKAGE_DIR) / entry.path
    if entry.loader == "ci-csv":
        raw = read_csv_series(path, signal=entry.signal)
    elif entry.loader == "region-ci-csv":  # time_utc, region, ci_<signal>_g_per_kwh: one region's rows
        raw = read_csv_series(path, time_column="time_utc", value_column=f"ci_{entry.signal}_g_per_kwh",
                              signal=entry.signal, region=entry.arg, filter_column="region", filter_value=entry.arg)
    elif entry.loader == "hourly-counts":  # hour_start_utc, requests (in that hour): requests/s
        raw = read_csv_series(path, time_column="hour_start_utc", value_column="requests", kind="load",
                              region=entry.arg)
        raw.values = raw.values / HOUR_S
        raw.resolution_s = HOUR_S
    elif entry.loader == "azure2024":
        raw = read_azure_2024_minutes(path, entry.arg)
    elif entry.loader == "servegen":
        raw = read_servegen_rates(path, entry.arg)
    elif entry.loader == "worldcup":
        raw = read_count_per_minute(path)
    else:
        raise ValueError(f"unknown loader {entry.loader!r}")
    grid = to_grid(raw, step_s)
    grid.name = entry.name
    return grid
