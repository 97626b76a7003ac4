"""Grid carbon-intensity series for the evaluation: the shipped slice (FR, FI, ES, CISO around 6 July 2022) or any
CI CSV given by the user, checked row by row (a negative or non-numeric value, a time that is not an instant, a
repeated hour with two values, a missing column: ``GridDataError`` naming it).

The CSVs a platform engineer has are rarely a clean hourly UTC column, so the reader takes:

* rows finer than an hour (5, 15, 30 min: Let's-Wait-Awhile, grid operators' feeds): each UTC hour is the mean of
  its rows, missing when fewer than half of the hour's rows have a value (a mostly empty hour would be a guess);
* times with an offset (``+01:00``, ``Z``), read as the instant they name; times without one are UTC;
* a missing hour or an empty value cell: the hour is missing (NaN), refused only where the evaluation needs it
  (:meth:`GridSeries.window`: the evaluated day; the history before it may have gaps, the forecaster's models skip
  NaN), so that a gap months away from the day does not block it;
* a column named as the user types it: "gCO2eq/kWh" for the header's "gCO₂eq/kWh", any case (``header_column``);
* a repeated row with the same value (kept once); a repeated hour with two values is refused, since it is what a
  local-time column without offset gives at a DST change (the whole series would then be shifted).

A load trace of one row per request (Azure's LLM inference traces, a gateway's access log exported as CSV) is
counted per UTC hour instead (:func:`count_csv`). Either way a series spans at most ``MAX_SERIES_HOURS``: two rows
centuries apart would otherwise make the reader allocate an hour for every hour between them.
"""

from __future__ import annotations

import contextlib
import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import TextIO

from greenserve.common.csv_input import (
    MIN_BIN_COVERAGE_FRACTION,
    header_column,
    infer_step_s,
)

HOUR_S = 3600
MAX_SERIES_HOURS = 20 * 366 * 24  # 20 years of hours: far beyond any CI or load file, small enough to hold in memory
SHIPPED = "ci_2022-06-15_2022-07-06_lifecycle.csv"
SHIPPED_REGIONS = ("FR", "FI", "ES", "CISO")


class GridDataError(ValueError):
    """A CI file the evaluation refuses; the message names the file and the row or column."""


def _iso(instant_s: int) -> str:
    return datetime.fromtimestamp(instant_s, UTC).isoformat()


@dataclass(frozen=True)
class GridSeries:
    region: str
    start_s: int  # first hour, Unix seconds
    values: tuple[float, ...]  # one per hour, gCO2e/kWh; NaN: no value for the hour
    # hour index -> why it has no value ("<file>: gap before row 12", "<file>: row 40: empty"), for the refusal
    missing: dict[int, str] = field(default_factory=dict, compare=False)

    def index_of(self, instant_s: int) -> int:
        return (instant_s - self.start_s) // HOUR_S

    def window(self, start_s: int, hours: int, *, allow_missing: bool = False) -> tuple[float, ...]:
        """The ``hours`` values from ``start_s``; a missing hour in them is refused (naming it and why it is
        missing) unless ``allow_missing``, then it is NaN."""
        i = self.index_of(start_s)
        if i < 0 or i + hours > len(self.values):
            raise GridDataError(f"{self.region}: no CI for {hours} h from {_iso(start_s)} (the series covers "
                                f"{_iso(self.start_s)} + {len(self.values)} h)")
        values = self.values[i:i + hours]
        if not allow_missing:
            gaps = [i + k for k, v in enumerate(values) if math.isnan(v)]
            if gaps:
                first = gaps[0]
                raise GridDataError(f"{self.missing.get(first, self.region)}: no CI for "
                                    f"{_iso(self.start_s + first * HOUR_S)} ({len(gaps)} h of {self.region} missing "
                                    f"in the {hours} h from {_iso(start_s)})")
        return values


def _instant(text: str, where: str) -> int:
    value = text.strip()
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise GridDataError(f"{where}: time {value[:40]!r} is not an ISO-8601 instant") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp())


def series_from_rows(rows: list[tuple[int, float, int]], region: str, source: str) -> GridSeries:
    """An hourly series from (instant, value, row number) rows already parsed (value NaN: an empty cell).

    Rows finer than an hour are averaged per UTC hour; hourly rows must be on the hour; a hour (or instant) given
    twice with two values is refused; a missing hour stays NaN with the reason in ``GridSeries.missing``."""
    if not rows:
        raise GridDataError(f"{source}: no rows for region {region}")
    rows = sorted(rows)
    unique: list[tuple[int, float, int]] = []
    for t, v, row in rows:
        if unique and unique[-1][0] == t:
            kept = unique[-1][1]
            if kept == v or (math.isnan(kept) and math.isnan(v)):
                continue  # the same row twice (a file concatenated with an overlap): one value
            raise GridDataError(f"{source}: row {row}: {_iso(t)} of {region} is repeated with another value "
                                f"(row {unique[-1][2]}): a local-time column without an offset repeats an hour at "
                                f"the DST change (give UTC times or times with their offset, +01:00), and a file "
                                f"of several regions repeats every hour (give one region per file)")
        unique.append((t, v, row))
    times = [t for t, _, _ in unique]
    step = infer_step_s(times, HOUR_S)
    if step > HOUR_S or HOUR_S % step:
        raise GridDataError(f"{source}: rows of {region} are {step} s apart; the evaluation needs hourly rows or "
                            f"finer ones that divide the hour (5, 15, 30 min)")
    if step == HOUR_S:
        for t, _, row in unique:
            if t % HOUR_S:
                raise GridDataError(f"{source}: row {row}: time {_iso(t)} of {region} is not on the hour (hourly "
                                    f"rows must start their UTC hour)")
    start = times[0] - times[0] % HOUR_S
    n = (times[-1] - start) // HOUR_S + 1
    _check_span(n, unique[0][2], unique[-1][2], region, source)
    sums, counts, first_row = [0.0] * n, [0] * n, [0] * n
    for t, v, row in unique:
        k = (t - start) // HOUR_S
        first_row[k] = first_row[k] or row
        if not math.isnan(v):
            sums[k] += v
            counts[k] += 1
    need = max(1, math.ceil(MIN_BIN_COVERAGE_FRACTION * HOUR_S / step))
    values: list[float] = []
    missing: dict[int, str] = {}
    for k in range(n):
        if counts[k] >= need:
            values.append(sums[k] / counts[k])
            continue
        values.append(math.nan)
        if first_row[k] == 0:
            after = next(first_row[j] for j in range(k + 1, n) if first_row[j])
            missing[k] = f"{source}: gap before row {after}"
        elif step == HOUR_S:
            missing[k] = f"{source}: row {first_row[k]}: empty value"
        else:
            missing[k] = (f"{source}: row {first_row[k]}: {counts[k]} of the hour's {HOUR_S // step} rows have a "
                          f"value (at least {need} needed)")
    # a partly covered first or last hour of sub-hourly rows is an edge of the file, not a gap: dropped
    lo = next((k for k, v in enumerate(values) if not math.isnan(v)), None)
    if lo is None:
        raise GridDataError(f"{source}: no value for region {region} (every row is empty)")
    hi = max(k for k, v in enumerate(values) if not math.isnan(v)) + 1
    return GridSeries(region, start + lo * HOUR_S, tuple(values[lo:hi]),
                      {k - lo: why for k, why in missing.items() if lo <= k < hi})


def _check_span(hours: int, first_row: int, last_row: int, region: str, source: str) -> None:
    if hours > MAX_SERIES_HOURS:
        raise GridDataError(f"{source}: rows of {region} span {hours} h (row {first_row} to row {last_row}); at most "
                            f"{MAX_SERIES_HOURS} h (20 years) are read: is a time cell mistyped?")


def read_csv(path: str | Path, *, time_column: str, value_column: str, region: str | None = None,
             region_column: str | None = None,
             names: tuple[str, str] = ("--time-column", "--value-column"),
             value_scale: float = 1.0) -> dict[str, GridSeries]:
    """CI per region and UTC hour from a CSV (one region per file unless ``region_column`` splits it); ``names``:
    what the user called the two columns by (the CLI's flags, a scenario's keys), for the refusals; ``value_scale``:
    what each value is multiplied by (a unit's factor to gCO2e/kWh, common/ci_units.py)."""
    path = Path(path)
    with _text(path) as handle:
        return _read_rows(path, handle, time_column, value_column, region, region_column, names, value_scale)


@contextlib.contextmanager
def _text(path: Path) -> Iterator[TextIO]:
    """The file opened as UTF-8 text (a BOM skipped); GridDataError naming it when it cannot be read or is not
    UTF-8 (raised while the rows are read)."""
    try:
        handle = path.open(newline="", encoding="utf-8-sig")
    except OSError as exc:  # the whole path: where it was looked for, not only its base name
        raise GridDataError(f"{path.absolute()}: cannot read: {exc.strerror}") from None
    try:
        with handle:
            yield handle
    except UnicodeDecodeError as exc:  # a ValueError, not an OSError
        raise GridDataError(f"{path.name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _read_rows(path: Path, handle: TextIO, time_column: str, value_column: str, region: str | None,
               region_column: str | None, names: tuple[str, str], value_scale: float) -> dict[str, GridSeries]:
    reader = csv.DictReader(handle)
    columns = reader.fieldnames or []

    def found(name: str, column: str) -> str:
        match = header_column(columns, column)
        if match is None:
            raise GridDataError(f"{path.name}: column {column!r} ({name}) not found; columns: "
                                f"{', '.join(columns)}")
        return match

    time_column = found(names[0], time_column)
    value_column = found(names[1], value_column)
    region_column = None if region_column is None else found("region column", region_column)
    by_region: dict[str, list[tuple[int, float, int]]] = {}
    for row_number, row in enumerate(reader, start=2):
        where = f"{path.name}: row {row_number}"
        t = _instant(row[time_column] or "", where)
        text = (row[value_column] or "").strip()
        try:
            value = float(text) if text else math.nan  # an empty cell: no value for that time
        except ValueError:
            raise GridDataError(f"{where}: column {value_column!r}: {text[:40]!r} is not a number") from None
        value *= value_scale
        if math.isinf(value) or value < 0:
            raise GridDataError(f"{where}: column {value_column!r}: {value!r} is not a CI (finite, >= 0)")
        key = row[region_column] if region_column else (region or path.stem)
        by_region.setdefault(key, []).append((t, value, row_number))
    if not by_region:  # a header alone evaluated nothing and exited 0 with an empty summary
        raise GridDataError(f"{path.name}: no data rows under the header")
    return {key: series_from_rows(rows, key, path.name) for key, rows in by_region.items()}


def count_csv(path: str | Path, *, time_column: str, region: str | None = None,
              time_name: str = "--time-column") -> GridSeries:
    """Requests per UTC hour from a CSV of one row per request (its ``time_column``: when the request arrived, an
    ISO-8601 instant, UTC without an offset; rows in any order). An hour between the first and the last request with
    no row counts 0 requests. The first and last hours are counted as they are: a trace cut in the middle of an hour
    undercounts that hour. Memory: one counter per hour of the trace's span, whatever its number of rows."""
    path = Path(path)
    name = region or path.stem
    counts: dict[int, int] = {}
    first = last = (0, 0)  # (hour start, row number) of the earliest and the latest request
    with _text(path) as handle:
        reader = csv.reader(handle)
        columns = next(reader, None) or []
        column = header_column(columns, time_column)
        if column is None:
            raise GridDataError(f"{path.name}: column {time_column!r} ({time_name}) not found; columns: "
                                f"{', '.join(columns)}")
        index = columns.index(column)
        for row_number, row in enumerate(reader, start=2):
            if not row:
                continue  # a blank line
            if index >= len(row):
                raise GridDataError(f"{path.name}: row {row_number}: {len(row)} cells, no {column!r}")
            t = _instant(row[index], f"{path.name}: row {row_number}")
            hour = t - t % HOUR_S
            counts[hour] = counts.get(hour, 0) + 1
            if not first[1] or hour < first[0]:
                first = (hour, row_number)
            if not last[1] or hour > last[0]:
                last = (hour, row_number)
            if len(counts) % 4096 == 0:
                _check_span((last[0] - first[0]) // HOUR_S + 1, first[1], last[1], name, path.name)
    if not counts:
        raise GridDataError(f"{path.name}: no data rows under the header")
    n = (last[0] - first[0]) // HOUR_S + 1
    _check_span(n, first[1], last[1], name, path.name)
    return GridSeries(name, first[0], tuple(float(counts.get(first[0] + k * HOUR_S, 0)) for k in range(n)))


def shipped() -> dict[str, GridSeries]:
    """The shipped slice: FR, FI, ES and CISO, 2022-06-15 to 2022-07-06 (data/SOURCE.md)."""
    resource = resources.files("greenserve.evaluation").joinpath("data", SHIPPED)
    with resources.as_file(resource) as path:
        return read_csv(path, time_column="time_utc", value_column="ci_lifecycle_g_per_kwh", region_column="region")
