"""The carbon model's units and argument checks (``greenserve.common.carbon`` and its parts use them).

Units are in every name: ``_g`` grams CO2e, ``_kwh`` kilowatt-hours, ``_j`` joules, ``_w`` watts,
``_s`` seconds, ``_bytes`` bytes, ``_tb`` terabytes (10**12 bytes), ``_g_per_kwh`` carbon intensity,
``_pct`` percent (80.0 means 80 %), ``_frac`` a fraction in [0, 1]. All public functions take
keyword arguments only, so a value can never land in a slot of the wrong unit.

Invalid inputs (negative, non-finite, lifetime <= 0, batch size < 1, PUE < 1, ...) raise ``ValueError``
whose message starts with the offending argument's name (the checks below); services map it to gRPC
INVALID_ARGUMENT.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

__all__ = [
    "SECONDS_PER_YEAR",
    "BYTES_PER_TB",
    "J_PER_KWH",
    "at_least",
    "energy_kwh_from_j",
    "energy_kwh_from_power",
    "finite_number",
    "in_unit_interval",
    "non_negative",
    "positive",
    "tb_from_bytes",
]

SECONDS_PER_YEAR: float = 365 * 24 * 3600.0
"""Length of a lifetime year (365 days). The papers give lifetimes in years only."""

BYTES_PER_TB: float = 1e12
"""Decimal terabyte, the unit SSD capacities (and GreenCache's 1 TB allocation steps) are quoted in."""

J_PER_KWH: float = 3.6e6


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------


def finite_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return number


def at_least(name: str, value: Any, minimum: float) -> float:
    """A finite number >= minimum (the message says 'finite and >= minimum' for every failure)."""
    try:
        number = finite_number(name, value)
    except ValueError:
        number = math.nan
    if not number >= minimum:  # also catches nan
        raise ValueError(f"{name} must be finite and >= {minimum:g}, got {value!r}")
    return number


def positive(name: str, value: Any) -> float:
    try:
        number = finite_number(name, value)
    except ValueError:
        number = math.nan
    if not number > 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return number


def non_negative(name: str, value: Any) -> float:
    return at_least(name, value, 0.0)


def in_unit_interval(name: str, value: Any) -> float:
    try:
        number = finite_number(name, value)
    except ValueError:
        number = math.nan
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"{name} must be finite and in [0, 1], got {value!r}")
    return number


# ------------------------------------------------------------------------------------------------
# unit helpers
# ------------------------------------------------------------------------------------------------


def energy_kwh_from_j(*, energy_j: float) -> float:
    """Joules to kWh (1 kWh = 3.6 MJ)."""
    return non_negative("energy_j", energy_j) / J_PER_KWH


def energy_kwh_from_power(*, power_w: float, duration_s: float) -> float:
    """Energy of a constant (or mean) power draw over a duration, in kWh."""
    return non_negative("power_w", power_w) * non_negative("duration_s", duration_s) / J_PER_KWH


def tb_from_bytes(*, size_bytes: float) -> float:
    """Bytes to decimal terabytes (10**12 bytes)."""
    return non_negative("size_bytes", size_bytes) / BYTES_PER_TB
