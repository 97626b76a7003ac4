"""Carbon-intensity units a user's file may be in, converted to the product's unit, gCO2e/kWh.

Grid data does not all come in gCO2e/kWh: US sources (WattTime's MOER, EIA's emission rates) publish pounds per MWh,
some national inventories kilograms per kWh or tonnes per MWh. A value read in the wrong unit is not refused by any
range check (1,000 lb/MWh looks like a coal-heavy grid in g/kWh) but makes every gram the planner and the receipts
count wrong by that factor, so the unit is a flag (``--ci-unit``) and a header that names another unit than the one
given or defaulted is refused, asking for the flag (``ci_unit_factor``).
"""

from __future__ import annotations

import argparse
import re

LB_G = 453.59237  # grams per avoirdupois pound (exact, by definition)

G_PER_KWH_PER_UNIT: dict[str, float] = {
    "g/kWh": 1.0,
    "kg/MWh": 1.0,
    "lb/MWh": LB_G / 1000.0,
    "kg/kWh": 1000.0,
    "t/MWh": 1000.0,
}
"""gCO2e/kWh per one of the unit: the factor a value in that unit is multiplied by."""

DEFAULT_CI_UNIT = "g/kWh"

_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # what a header says of its unit, once lower-cased, spaces made "_" and the gas (CO2, CO2e, CO₂eq) taken out
    ("lb/MWh", re.compile(r"(?<![a-z])lbs?(?![a-z])|pounds?")),
    ("kg/kWh", re.compile(r"kg(/|_*per_*)kwh")),
    ("t/MWh", re.compile(r"(?<![a-z])(t|tonnes?|tons?|mt)(/|_*per_*)mwh")),
    ("kg/MWh", re.compile(r"kg(/|_*per_*)mwh")),
    ("g/kWh", re.compile(r"(?<![a-z])g(/|_*per_*)kwh")),
)


def unit_in_header(column: str) -> str | None:
    """The unit a column's name states (``"MOER (lbs/MWh)"``: lb/MWh), or None when it states none."""
    text = re.sub(r"\s+", "_", column.lower())
    text = re.sub(r"co(2|₂)(e(q)?)?", "", text)
    for unit, pattern in _PATTERNS:
        if pattern.search(text):
            return unit
    return None


def ci_unit_factor(unit: str | None, column: str | None = None, flag: str = "--ci-unit") -> float:
    """The factor from ``unit`` (None: gCO2e/kWh, the default) to gCO2e/kWh. ValueError for an unknown unit, and
    when no unit was given but the column's name states another one (the user is asked to say which is right)."""
    if unit is not None and unit not in G_PER_KWH_PER_UNIT:
        raise ValueError(f"{flag}: unknown unit {unit!r}; known: {', '.join(G_PER_KWH_PER_UNIT)}")
    stated = unit_in_header(column) if column else None
    if unit is None and stated is not None and G_PER_KWH_PER_UNIT[stated] != 1.0:
        raise ValueError(f"column {column!r} looks like {stated}, not gCO2e/kWh: pass {flag} {stated} (or "
                         f"{flag} {DEFAULT_CI_UNIT} if the values are gCO2e/kWh)")
    return G_PER_KWH_PER_UNIT[unit or DEFAULT_CI_UNIT]


def add_ci_unit_flag(parser: argparse.ArgumentParser, column: str = "--value-column") -> None:
    """The ``--ci-unit`` flag of a command that reads a user's CI column (evaluate, demo, forecast ingest)."""
    parser.add_argument("--ci-unit", choices=list(G_PER_KWH_PER_UNIT), default=None,
                        help=f"unit of {column} (default g/kWh, what the product stores; a header naming another "
                             "unit is refused without this flag)")
