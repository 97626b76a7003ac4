"""Days off of a region: Saturdays, Sundays and the region's public holidays.

Grid carbon intensity follows demand, and demand on a public holiday looks like a Sunday's (offices and industry
closed): Christmas, New Year's Eve observed on a Friday, Thanksgiving. The calendar members of the forecaster
(:mod:`.day_type`) and the combination's weekend adjustment treat such a day as an off day when the model is
fitted with a :class:`Holidays` calendar. Holidays come from the ``holidays`` package (country and subdivision
rules, observed dates included); they are known years ahead, so using them peeks at nothing.

:func:`holidays_for_region` maps the region keys the forecaster stores (Electricity Maps zones such as
``US-CAL-CISO`` or ``DE``, EnsembleCI balancing authorities such as ``CISO``) to a calendar; a region it does not
know gets none (weekends only).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from functools import lru_cache

import numpy as np

_DAY_S = 86_400
#: Unix time 0 (1970-01-01) was a Thursday: weekday index 3 with Monday = 0.
_EPOCH_WEEKDAY = 3
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


def weekday_of(times_s: np.ndarray) -> np.ndarray:
    """UTC weekday (Monday = 0 ... Sunday = 6) of each Unix time."""
    return (np.floor_divide(np.asarray(times_s, dtype=np.int64), _DAY_S) + _EPOCH_WEEKDAY) % 7


#: Region keys that are not ``CC`` or ``CC-...`` with CC a country: balancing authorities and zones whose holidays
#: are those of a state (US grids serve one state or several; several: federal holidays only).
_REGION_ALIASES: dict[str, tuple[str, str | None]] = {
    "CISO": ("US", "CA"), "US-CAL-CISO": ("US", "CA"), "US-CAL": ("US", "CA"),
    "ERCO": ("US", "TX"), "ERCOT": ("US", "TX"), "US-TEX-ERCO": ("US", "TX"), "US-TEX": ("US", "TX"),
    "NYIS": ("US", "NY"), "US-NY-NYIS": ("US", "NY"), "ISNE": ("US", None), "US-NE-ISNE": ("US", None),
    "MISO": ("US", None), "US-MIDW-MISO": ("US", None), "PJM": ("US", None), "US-MIDA-PJM": ("US", None),
    "SPP": ("US", None), "GER": ("DE", None), "UK": ("GB", None),
}


@dataclass(frozen=True)
class Holidays:
    """Public holidays of ``country`` (ISO 3166-1 alpha-2), optionally of one ``subdivision`` (state, region)."""

    country: str
    subdivision: str | None = None

    def __post_init__(self) -> None:
        import holidays as holidays_lib

        supported = holidays_lib.list_supported_countries()
        if self.country not in supported:
            raise ValueError(f"holidays: unknown country {self.country!r}")
        if self.subdivision is not None and self.subdivision not in supported[self.country]:
            raise ValueError(f"holidays: {self.country} has no subdivision {self.subdivision!r}")

    @classmethod
    def parse(cls, spec: str) -> Holidays:
        """``"DE"`` or ``"US-CA"`` (country, then optionally a subdivision after a dash)."""
        country, _, subdivision = spec.strip().upper().partition("-")
        return cls(country, subdivision or None)

    @property
    def name(self) -> str:
        return self.country + (f"-{self.subdivision}" if self.subdivision else "")

    def holiday_days(self, first_day: int, last_day: int) -> np.ndarray:
        """Unix day numbers (days since 1970-01-01) of the holidays from ``first_day`` to ``last_day``."""
        first_year = date.fromordinal(first_day + _EPOCH_ORDINAL).year
        last_year = date.fromordinal(last_day + _EPOCH_ORDINAL).year
        days = np.concatenate([_holiday_days_of_year(self.country, self.subdivision, year)
                               for year in range(first_year, last_year + 1)])
        return days[(days >= first_day) & (days <= last_day)]

    def off_days(self, times_s: np.ndarray) -> np.ndarray:
        """Per Unix time: on a Saturday, Sunday or public holiday (UTC date)?"""
        times_s = np.asarray(times_s, dtype=np.int64)
        off = weekday_of(times_s) >= 5
        if len(times_s):
            day = np.floor_divide(times_s, _DAY_S)
            off |= np.isin(day, self.holiday_days(int(day.min()), int(day.max())))
        return off


@lru_cache(maxsize=256)
def _holiday_days_of_year(country: str, subdivision: str | None, year: int) -> np.ndarray:
    import holidays as holidays_lib

    calendar = holidays_lib.country_holidays(country, subdiv=subdivision, years=year)
    return np.array(sorted(d.toordinal() - _EPOCH_ORDINAL for d in calendar), dtype=np.int64)


def off_days(times_s: np.ndarray, holidays: Holidays | None) -> np.ndarray:
    """Saturdays and Sundays, plus the holidays of ``holidays`` when given."""
    if holidays is None:
        return weekday_of(times_s) >= 5
    return holidays.off_days(times_s)


def holidays_for_region(region: str) -> Holidays | None:
    """The holiday calendar of a stored region key, or None when the key names no known country."""
    key = region.strip().upper()
    if key in _REGION_ALIASES:
        return Holidays(*_REGION_ALIASES[key])
    country = key.split("-", 1)[0]
    try:
        return Holidays(country)
    except ValueError:
        return None
