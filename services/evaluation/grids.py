"""Grid carbon-intensity series for the evaluation: the shipped slice (FR, FI, ES, CISO around 6 July 2022) or any
hourly CSV given by the user, checked row by row (a gap, a negative or non-numeric value, a repeated hour, a missing
column: ``GridDataError`` naming it)."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import TextIO

HOUR_S = 3600
SHIPPED = "ci_2022-06-15_2022-07-06_lifecycle.csv"
SHIPPED_REGIONS = ("FR", "FI", "ES", "CISO")


class GridDataError(ValueError):
    """A CI file the evaluation refuses; the message names the file and the row or column."""


@dataclass(frozen=True)
class GridSeries:
    region: str
    start_s: int  # first hour, Unix seconds
    values: tuple[float, ...]  # one per hour, gCO2e/kWh

    def index_of(self, instant_s: int) -> int:
        return (instant_s - self.start_s) // HOUR_S

    def window(self, start_s: int, hours: int) -> tuple[float, ...]:
        i = self.index_of(start_s)
        if i < 0 or i + hours > len(self.values):
            raise GridDataError(f"{self.region}: no CI for {hours} h from "
                                f"{datetime.fromtimestamp(start_s, UTC).isoformat()} (the series covers "
                                f"{datetime.fromtimestamp(self.start_s, UTC).isoformat()} + {len(self.values)} h)")
        return self.values[i:i + hours]


def _instant(text: str, where: str) -> int:
    value = text.strip()
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise GridDataError(f"{where}: time {value[:40]!r} is not an ISO-8601 instant") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp())


def series_from_rows(rows: list[tuple[int, float]], region: str, source: str) -> GridSeries:
    """An hourly series from (instant, value, row number) rows already parsed; checks order, gaps and repeats."""
    if not rows:
        raise GridDataError(f"{source}: no rows for region {region}")
    rows = sorted(rows)
    start = rows[0][0]
    if start % HOUR_S:
        raise GridDataError(f"{source}: first time of {region} is not on the hour")
    values = []
    for n, (t, v, row) in enumerate(rows):
        expected = start + n * HOUR_S
        if t < expected:
            raise GridDataError(f"{source}: row {row}: hour {datetime.fromtimestamp(t, UTC).isoformat()} of {region} "
                                f"is repeated")
        if t > expected:
            raise GridDataError(f"{source}: row {row}: gap before {datetime.fromtimestamp(t, UTC).isoformat()} "
                                f"({(t - expected) // HOUR_S} h of {region} missing)")
        values.append(v)
    return GridSeries(region, start, tuple(values))


def read_csv(path: str | Path, *, time_column: str, value_column: str, region: str | None = None,
             region_column: str | None = None) -> dict[str, GridSeries]:
    """Hourly CI per region from a CSV (one region per file unless ``region_column`` splits it)."""
    path = Path(path)
    try:
        handle = path.open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise GridDataError(f"{path.name}: cannot read: {exc.strerror}") from None
    try:
        return _read_rows(path, handle, time_column, value_column, region, region_column)
    except UnicodeDecodeError as exc:  # raised while the rows are read, a ValueError
        raise GridDataError(f"{path.name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _read_rows(path: Path, handle: TextIO, time_column: str, value_column: str, region: str | None,
               region_column: str | None) -> dict[str, GridSeries]:
    with handle:
        reader = csv.DictReader(handle)
        columns = reader.fieldnames or []
        for name, column in (("--time-column", time_column), ("--value-column", value_column),
                             ("region column", region_column)):
            if column is not None and column not in columns:
                raise GridDataError(f"{path.name}: column {column!r} ({name}) not found; columns: "
                                    f"{', '.join(columns)}")
        by_region: dict[str, list[tuple[int, float, int]]] = {}
        for row_number, row in enumerate(reader, start=2):
            where = f"{path.name}: row {row_number}"
            t = _instant(row[time_column] or "", where)
            text = (row[value_column] or "").strip()
            try:
                value = float(text)
            except ValueError:
                raise GridDataError(f"{where}: column {value_column!r}: {text[:40]!r} is not a number") from None
            if not math.isfinite(value) or value < 0:
                raise GridDataError(f"{where}: column {value_column!r}: {value!r} is not a CI (finite, >= 0)")
            key = row[region_column] if region_column else (region or path.stem)
            by_region.setdefault(key, []).append((t, value, row_number))
    return {key: series_from_rows(rows, key, path.name) for key, rows in by_region.items()}


def shipped() -> dict[str, GridSeries]:
    """The shipped slice: FR, FI, ES and CISO, 2022-06-15 to 2022-07-06 (data/SOURCE.md)."""
    resource = resources.files("greenserve.evaluation").joinpath("data", SHIPPED)
    with resources.as_file(resource) as path:
        return read_csv(path, time_column="time_utc", value_column="ci_lifecycle_g_per_kwh", region_column="region")
