"""The greenserve carbon model: one library, used by every service.

Formulas (the papers are the seeds named in DESIGN.md, section "Carbon model"):

* Operational carbon, GreenCache Eq. 2 / GreenLLM Eq. 2::

      C_o = E x PUE x CI            (E in kWh, CI in gCO2e/kWh; the papers use PUE = 1)

* Amortised embodied carbon of one component, GreenCache Eq. 1 (and Eq. 6 per component)::

      (T / LT) x C_e

* Platform embodied carbon, GreenCache Eq. 3: sum over components (GPU, CPU, memory, SSD).

* Cache (SSD) embodied carbon, charged by the allocated size, GreenCache Eq. 4::

      C_e,Cache = S_alloc x (T / LT_SSD) x C_e,SSD^Unit       (C_e,SSD^Unit per TB)

  with the disk medium's own per-TB figure (``CarbonParams.disk_rate``: NVMe and SATA SSDs the SSD rate, an HDD
  1/8 of it after Tannu & Nair, HotCarbon 2022) and the DRAM tier's (GreenCache footnote 1).

* Interval total, GreenCache Eq. 5, evaluated as in Eq. 6 (see ``interval_carbon``)::

      C = E x CI + C_e,Cache + sum_comp (T / LT_comp) x C_e,comp

* Per-request total, GreenLLM Eq. 1-3: the embodied part is also divided by the mean batch size::

      C_req = t_req / (mean_BS x LT) x C_e + E_req x CI

* CLOVER objective, CLOVER Eq. 1-3 (maximised, subject to the p95 SLA of Eq. 5)::

      dAccuracy = (A - A_base) / A_base x 100 %
      dCarbon   = (C_base - E x ci) / C_base x 100 %
      f         = lambda x dCarbon + (1 - lambda) x dAccuracy

Units are in every name: ``_g`` grams CO2e, ``_kwh`` kilowatt-hours, ``_j`` joules, ``_w`` watts,
``_s`` seconds, ``_bytes`` bytes, ``_tb`` terabytes (10**12 bytes), ``_g_per_kwh`` carbon intensity,
``_pct`` percent (80.0 means 80 %), ``_frac`` a fraction in [0, 1]. All public functions take
keyword arguments only, so a value can never land in a slot of the wrong unit.

Invalid inputs (negative, non-finite, lifetime <= 0, batch size < 1, PUE < 1, ...) raise ``ValueError``
whose message starts with the offending argument's name; services map it to gRPC INVALID_ARGUMENT.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from numbers import Real
from typing import Any

__all__ = [
    "SECONDS_PER_YEAR",
    "BYTES_PER_TB",
    "J_PER_KWH",
    "COMPONENT_KINDS",
    "DISK_MEDIA",
    "CarbonBreakdown",
    "IntervalCarbon",
    "ComponentSpec",
    "PlatformItem",
    "Platform",
    "CarbonParams",
    "load_default_params",
    "energy_kwh_from_j",
    "energy_kwh_from_power",
    "tb_from_bytes",
    "operational_g",
    "amortised_embodied_g",
    "cache_embodied_g",
    "request_carbon",
    "interval_carbon",
    "clover_delta_accuracy_pct",
    "clover_delta_carbon_pct",
    "clover_objective",
]

SECONDS_PER_YEAR: float = 365 * 24 * 3600.0
"""Length of a lifetime year (365 days). The papers give lifetimes in years only."""

BYTES_PER_TB: float = 1e12
"""Decimal terabyte, the unit SSD capacities (and GreenCache's 1 TB allocation steps) are quoted in."""

J_PER_KWH: float = 3.6e6

COMPONENT_KINDS: tuple[str, ...] = ("gpu", "cpu", "dram")
"""Kinds of per-device components. SSD cache storage is charged per TB instead (GreenCache Eq. 4)."""

_DEFAULTS_RESOURCE = ("data", "carbon_defaults.toml")


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return number


def _at_least(name: str, value: Any, minimum: float) -> float:
    """A finite number >= minimum (the message says 'finite and >= minimum' for every failure)."""
    try:
        number = _number(name, value)
    except ValueError:
        number = math.nan
    if not number >= minimum:  # also catches nan
        raise ValueError(f"{name} must be finite and >= {minimum:g}, got {value!r}")
    return number


def _positive(name: str, value: Any) -> float:
    try:
        number = _number(name, value)
    except ValueError:
        number = math.nan
    if not number > 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return number


def _non_negative(name: str, value: Any) -> float:
    return _at_least(name, value, 0.0)


def _in_unit_interval(name: str, value: Any) -> float:
    try:
        number = _number(name, value)
    except ValueError:
        number = math.nan
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"{name} must be finite and in [0, 1], got {value!r}")
    return number


# ------------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CarbonBreakdown:
    """Operational + embodied carbon, in grams CO2e. ``total_g`` is derived."""

    operational_g: float
    embodied_g: float
    total_g: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total_g", self.operational_g + self.embodied_g)


@dataclass(frozen=True)
class IntervalCarbon:
    """GreenCache Eq. 5 for one interval, split into its three terms (grams CO2e)."""

    operational_g: float
    cache_embodied_g: float
    other_embodied_g: float
    embodied_g: float = field(init=False)
    total_g: float = field(init=False)

    def __post_init__(self) -> None:
        embodied = self.cache_embodied_g + self.other_embodied_g
        object.__setattr__(self, "embodied_g", embodied)
        object.__setattr__(self, "total_g", self.operational_g + embodied)


# ------------------------------------------------------------------------------------------------
# unit helpers
# ------------------------------------------------------------------------------------------------


def energy_kwh_from_j(*, energy_j: float) -> float:
    """Joules to kWh (1 kWh = 3.6 MJ)."""
    return _non_negative("energy_j", energy_j) / J_PER_KWH


def energy_kwh_from_power(*, power_w: float, duration_s: float) -> float:
    """Energy of a constant (or mean) power draw over a duration, in kWh."""
    return _non_negative("power_w", power_w) * _non_negative("duration_s", duration_s) / J_PER_KWH


def tb_from_bytes(*, size_bytes: float) -> float:
    """Bytes to decimal terabytes (10**12 bytes)."""
    return _non_negative("size_bytes", size_bytes) / BYTES_PER_TB


# ------------------------------------------------------------------------------------------------
# the formulas
# ------------------------------------------------------------------------------------------------


def operational_g(*, energy_kwh: float, ci_g_per_kwh: float, pue: float = 1.0) -> float:
    """Operational carbon C_o = E x PUE x CI (GreenCache Eq. 2, GreenLLM Eq. 2; the papers use PUE 1)."""
    energy = _non_negative("energy_kwh", energy_kwh)
    ci = _non_negative("ci_g_per_kwh", ci_g_per_kwh)
    factor = _at_least("pue", pue, 1.0)
    return energy * factor * ci


def amortised_embodied_g(*, duration_s: float, lifetime_s: float, embodied_g: float) -> float:
    """Embodied carbon attributed to ``duration_s`` of use: (T / LT) x C_e (GreenCache Eq. 1)."""
    duration = _non_negative("duration_s", duration_s)
    lifetime = _positive("lifetime_s", lifetime_s)
    embodied = _non_negative("embodied_g", embodied_g)
    return duration / lifetime * embodied


def cache_embodied_g(
    *,
    duration_s: float,
    lifetime_s: float,
    ssd_embodied_g_per_tb: float,
    allocated_tb: float | None = None,
    allocated_bytes: float | None = None,
) -> float:
    """Embodied carbon of allocated cache storage, S_alloc x (T / LT) x C_e,SSD^Unit (GreenCache Eq. 4).

    Give the allocation as exactly one of ``allocated_tb`` or ``allocated_bytes`` (10**12 bytes per TB).
    """
    if (allocated_tb is None) == (allocated_bytes is None):
        raise ValueError(
            "allocated_tb or allocated_bytes: give exactly one, "
            f"got allocated_tb={allocated_tb!r}, allocated_bytes={allocated_bytes!r}"
        )
    if allocated_tb is not None:
        size_tb = _non_negative("allocated_tb", allocated_tb)
    else:
        size_tb = _non_negative("allocated_bytes", allocated_bytes) / BYTES_PER_TB
    duration = _non_negative("duration_s", duration_s)
    lifetime = _positive("lifetime_s", lifetime_s)
    per_tb = _non_negative("ssd_embodied_g_per_tb", ssd_embodied_g_per_tb)
    return size_tb * (duration / lifetime) * per_tb


# ------------------------------------------------------------------------------------------------
# components, platforms, parameters
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ComponentSpec:
    """One hardware device type: its embodied carbon per unit and its lifetime."""

    kind: str
    model: str
    embodied_g: float
    lifetime_s: float

    def __post_init__(self) -> None:
        if self.kind not in COMPONENT_KINDS:
            raise ValueError(f"kind must be one of {', '.join(COMPONENT_KINDS)}, got {self.kind!r}")
        if not isinstance(self.model, str) or not self.model or "." in self.model:
            raise ValueError(f"model must be a non-empty name without '.', got {self.model!r}")
        object.__setattr__(self, "embodied_g", _non_negative(f"{self.key}.embodied_g", self.embodied_g))
        object.__setattr__(self, "lifetime_s", _positive(f"{self.key}.lifetime_s", self.lifetime_s))

    @property
    def key(self) -> str:
        """``"<kind>.<model>"``, e.g. ``"gpu.A100"``; the name used in overrides and platforms."""
        return f"{self.kind}.{self.model}"


@dataclass(frozen=True)
class PlatformItem:
    component: ComponentSpec
    count: int

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"count of {self.component.key} must be an integer >= 1, got {self.count!r}")


@dataclass(frozen=True)
class Platform:
    """The devices a deployment holds for a period, e.g. 4 x L40 + 1 CPU + 512 GB DRAM (GreenCache
    Table 1 without its SSD). Cache SSD capacity is not part of a platform: it is charged by the
    allocated size (``cache_embodied_g``)."""

    items: tuple[PlatformItem, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "items", tuple(self.items))
        keys = [item.component.key for item in self.items]
        duplicates = sorted({key for key in keys if keys.count(key) > 1})
        if duplicates:
            raise ValueError(f"items must name each component once, repeated: {', '.join(duplicates)}")

    @property
    def embodied_g(self) -> float:
        """Total (not amortised) embodied carbon of the platform, GreenCache Eq. 3 without the SSD."""
        return sum(item.count * item.component.embodied_g for item in self.items)

    def amortised_embodied_g(self, *, duration_s: float) -> float:
        """sum over components of count x (T / LT_comp) x C_e,comp (GreenCache Eq. 6, 'other embodied')."""
        duration = _non_negative("duration_s", duration_s)
        return sum(
            item.count
            * amortised_embodied_g(
                duration_s=duration,
                lifetime_s=item.component.lifetime_s,
                embodied_g=item.component.embodied_g,
            )
            for item in self.items
        )


_SCALAR_FIELDS = ("pue", "default_lifetime_s", "ssd_embodied_g_per_tb", "ssd_lifetime_s", "dram_embodied_g_per_tb",
                  "dram_lifetime_s", "hdd_embodied_g_per_tb", "hdd_lifetime_s")
# GreenCache Table 1, row "Memory": 512 GB DDR4 = 30.8 kgCO2e -> 30.8 / 0.512 = 60.16 kgCO2e per TB (footnote 1 applies
# Eq. 4 to DRAM too). Used when a TOML file has no [dram_cache] table.
DEFAULT_DRAM_EMBODIED_G_PER_TB = 30.8e3 / 0.512
# Tannu & Nair, "The Dirty Secret of SSDs: Embodied Carbon" (HotCarbon 2022): 0.16 kgCO2e per GB of SSD, 0.02 per GB of
# HDD, so an HDD TB carries 1/8 of an SSD TB; applied to GreenCache's SSD rate (30 kgCO2e/TB). Used when a TOML file has
# no [hdd] table.
DEFAULT_HDD_EMBODIED_G_PER_TB = 30.0e3 * 0.02 / 0.16
DISK_MEDIA: tuple[str, ...] = ("nvme", "sata-ssd", "hdd")
"""Disk media a cache's disk tier can be on (the simulator's ``tiers.DISK_MEDIA``). Both SSDs are charged the SSD rate:
their embodied carbon is in the flash (Tannu & Nair give one per-GB figure for NAND SSDs, whatever the interface)."""
_COMPONENT_FIELDS = ("embodied_g", "lifetime_s")


@dataclass(frozen=True)
class CarbonParams:
    """Every tunable of the carbon model, in grams and seconds.

    Load the cited defaults with ``CarbonParams.load()`` (or ``load_default_params()``); change any
    value with ``overrides``, a mapping of field name to value:

    * ``"pue"``, ``"default_lifetime_s"``, ``"ssd_embodied_g_per_tb"``, ``"ssd_lifetime_s"``;
    * ``"<kind>.<model>.embodied_g"`` / ``"<kind>.<model>.lifetime_s"`` for a component, e.g.
      ``"gpu.A100.lifetime_s"``. Naming an unknown component adds it; it then needs ``embodied_g``,
      and its lifetime defaults to ``default_lifetime_s``.
    """

    pue: float
    default_lifetime_s: float
    ssd_embodied_g_per_tb: float
    ssd_lifetime_s: float
    components: tuple[ComponentSpec, ...]
    dram_embodied_g_per_tb: float = DEFAULT_DRAM_EMBODIED_G_PER_TB
    dram_lifetime_s: float = 5 * 365 * 24 * 3600.0
    hdd_embodied_g_per_tb: float = DEFAULT_HDD_EMBODIED_G_PER_TB
    hdd_lifetime_s: float = 5 * 365 * 24 * 3600.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "pue", _at_least("pue", self.pue, 1.0))
        object.__setattr__(self, "default_lifetime_s", _positive("default_lifetime_s", self.default_lifetime_s))
        object.__setattr__(
            self, "ssd_embodied_g_per_tb", _non_negative("ssd_embodied_g_per_tb", self.ssd_embodied_g_per_tb)
        )
        object.__setattr__(self, "ssd_lifetime_s", _positive("ssd_lifetime_s", self.ssd_lifetime_s))
        object.__setattr__(
            self, "dram_embodied_g_per_tb", _non_negative("dram_embodied_g_per_tb", self.dram_embodied_g_per_tb)
        )
        object.__setattr__(self, "dram_lifetime_s", _positive("dram_lifetime_s", self.dram_lifetime_s))
        object.__setattr__(
            self, "hdd_embodied_g_per_tb", _non_negative("hdd_embodied_g_per_tb", self.hdd_embodied_g_per_tb)
        )
        object.__setattr__(self, "hdd_lifetime_s", _positive("hdd_lifetime_s", self.hdd_lifetime_s))
        components = tuple(sorted(self.components, key=lambda spec: spec.key))
        keys = [spec.key for spec in components]
        if len(set(keys)) != len(keys):
            raise ValueError(f"components must have unique keys, got {keys}")
        object.__setattr__(self, "components", components)

    # -- lookup --------------------------------------------------------------------------------

    def disk_rate(self, medium: str = "") -> tuple[float, float]:
        """(embodied g per TB, lifetime s) of a cache disk on ``medium`` (``DISK_MEDIA``; empty: the SSD rate, as
        before media were told apart); ValueError naming the medium if unknown."""
        if medium == "hdd":
            return self.hdd_embodied_g_per_tb, self.hdd_lifetime_s
        if medium in ("", "nvme", "sata-ssd"):
            return self.ssd_embodied_g_per_tb, self.ssd_lifetime_s
        raise ValueError(f"disk medium {medium!r} is unknown; known: {', '.join(DISK_MEDIA)}")

    def component(self, key: str) -> ComponentSpec:
        """The component named ``"<kind>.<model>"``; ValueError naming the key if unknown."""
        for spec in self.components:
            if spec.key == key:
                return spec
        known = ", ".join(spec.key for spec in self.components)
        raise ValueError(f"component {key!r} is unknown; known: {known}")

    def platform(self, counts: Mapping[str, int]) -> Platform:
        """A platform from component keys and counts, e.g. ``{"gpu.L40": 4, "cpu.EPYC-7453": 1}``."""
        return Platform(tuple(PlatformItem(self.component(key), count) for key, count in counts.items()))

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        overrides: Mapping[str, float] | None = None,
    ) -> CarbonParams:
        """Parameters from a TOML file in the layout of ``data/carbon_defaults.toml`` (the packaged
        defaults when ``path`` is None), then ``overrides`` applied on top."""
        if path is None:
            params = _packaged_defaults()
        else:
            with open(path, "rb") as handle:
                params = cls.from_toml_dict(tomllib.load(handle))
        return params.with_overrides(overrides or {})

    @classmethod
    def from_toml_dict(cls, document: Mapping[str, Any]) -> CarbonParams:
        """Parameters from a parsed TOML document (papers' units: kg, years, TB)."""
        version = document.get("schema_version", 1)
        if version != 1:
            raise ValueError(f"schema_version must be 1, got {version!r}")
        defaults = _table(document, "defaults")
        default_lifetime_s = _positive("defaults.lifetime_years", defaults.get("lifetime_years")) * SECONDS_PER_YEAR
        pue = defaults.get("pue", 1.0)

        def lifetime_s(where: str, years: Any) -> float:
            return default_lifetime_s if years is None else _positive(f"{where}.lifetime_years", years) * SECONDS_PER_YEAR

        def storage(table: str, default_g_per_tb: float | None) -> tuple[float, float]:
            """(embodied g per TB, lifetime s) of a storage table; ``default_g_per_tb`` None: the table is required."""
            entry = _table(document, table, required=default_g_per_tb is None)
            kg = entry.get("embodied_kg_per_tb", None if default_g_per_tb is None else default_g_per_tb / 1000.0)
            return (_non_negative(f"{table}.embodied_kg_per_tb", kg) * 1000.0,
                    lifetime_s(table, entry.get("lifetime_years")))

        components: list[ComponentSpec] = []
        for kind in COMPONENT_KINDS:
            for model, entry in _table(document, kind, required=False).items():
                where = f"{kind}.{model}"
                if not isinstance(entry, Mapping):
                    raise ValueError(f"{where} must be a table, got {entry!r}")
                unknown = set(entry) - {"embodied_kg", "lifetime_years"}
                if unknown:
                    raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
                components.append(
                    ComponentSpec(
                        kind=kind,
                        model=model,
                        embodied_g=_non_negative(f"{where}.embodied_kg", entry.get("embodied_kg")) * 1000.0,
                        lifetime_s=lifetime_s(where, entry.get("lifetime_years")),
                    )
                )
        ssd_g_per_tb, ssd_lifetime_s = storage("ssd", None)
        dram_g_per_tb, dram_lifetime_s = storage("dram_cache", DEFAULT_DRAM_EMBODIED_G_PER_TB)
        hdd_g_per_tb, hdd_lifetime_s = storage("hdd", DEFAULT_HDD_EMBODIED_G_PER_TB)
        return cls(
            hdd_embodied_g_per_tb=hdd_g_per_tb,
            hdd_lifetime_s=hdd_lifetime_s,
            dram_embodied_g_per_tb=dram_g_per_tb,
            dram_lifetime_s=dram_lifetime_s,
            pue=pue,
            default_lifetime_s=default_lifetime_s,
            ssd_embodied_g_per_tb=ssd_g_per_tb,
            ssd_lifetime_s=ssd_lifetime_s,
            components=tuple(components),
        )

    def with_overrides(self, overrides: Mapping[str, float]) -> CarbonParams:
        """A copy with the named fields replaced (see the class docstring for the names)."""
        scalars: dict[str, float] = {}
        per_component: dict[str, dict[str, float]] = {}
        for name, value in overrides.items():
            if name in _SCALAR_FIELDS:
                scalars[name] = value
                continue
            key, _, attribute = name.rpartition(".")
            kind = key.partition(".")[0]
            if attribute not in _COMPONENT_FIELDS or kind not in COMPONENT_KINDS or key.count(".") != 1:
                raise ValueError(
                    f"override {name!r} is unknown; use one of {', '.join(_SCALAR_FIELDS)} "
                    "or '<kind>.<model>.embodied_g' / '<kind>.<model>.lifetime_s' "
                    f"with kind in {', '.join(COMPONENT_KINDS)}"
                )
            per_component.setdefault(key, {})[attribute] = value
        params = replace(self, **scalars) if scalars else self
        specs = {spec.key: spec for spec in params.components}
        for key, changes in per_component.items():
            if key in specs:
                specs[key] = replace(specs[key], **changes)
            else:
                if "embodied_g" not in changes:
                    raise ValueError(f"override for new component {key!r} needs {key}.embodied_g")
                kind, _, model = key.partition(".")
                specs[key] = ComponentSpec(
                    kind=kind,
                    model=model,
                    embodied_g=changes["embodied_g"],
                    lifetime_s=changes.get("lifetime_s", params.default_lifetime_s),
                )
        return replace(params, components=tuple(specs.values()))


def _table(document: Mapping[str, Any], name: str, *, required: bool = True) -> Mapping[str, Any]:
    value = document.get(name)
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"[{name}] must be a table in the carbon parameters file, got {value!r}")
    return value


@lru_cache(maxsize=1)
def _packaged_defaults() -> CarbonParams:
    resource = resources.files(__package__).joinpath(*_DEFAULTS_RESOURCE)
    return CarbonParams.from_toml_dict(tomllib.loads(resource.read_text(encoding="utf-8")))


def load_default_params(overrides: Mapping[str, float] | None = None) -> CarbonParams:
    """The packaged, cited defaults (``data/carbon_defaults.toml``) with optional overrides."""
    return CarbonParams.load(None, overrides)


# ------------------------------------------------------------------------------------------------
# request and interval carbon
# ------------------------------------------------------------------------------------------------


def request_carbon(
    *,
    duration_s: float,
    energy_kwh: float,
    ci_g_per_kwh: float,
    mean_batch_size: float,
    platform: Platform,
    pue: float = 1.0,
) -> CarbonBreakdown:
    """Carbon of one request, GreenLLM Eq. 1-3.

    embodied_g = sum over the platform of count x t_req / (mean_BS x LT_comp) x C_e,comp  (Eq. 1)
    operational_g = E_req x PUE x CI                                                       (Eq. 2)

    ``duration_s`` is the request's execution time t_req, ``mean_batch_size`` the engine's average
    batch size while serving it (>= 1), ``energy_kwh`` the request's share of the energy E_req.
    GreenLLM counts GPUs only (section V-A, "Accounting scope"): pass a GPU-only platform to match it.
    """
    batch = _at_least("mean_batch_size", mean_batch_size, 1.0)
    duration = _non_negative("duration_s", duration_s)
    operational = operational_g(energy_kwh=energy_kwh, ci_g_per_kwh=ci_g_per_kwh, pue=pue)
    embodied = platform.amortised_embodied_g(duration_s=duration) / batch
    return CarbonBreakdown(operational_g=operational, embodied_g=embodied)


def cache_tiers_embodied_g(*, dram_bytes: float, disk_bytes: float, duration_s: float, params: CarbonParams,
                           disk_medium: str = "") -> float:
    """Embodied carbon of an allocated DRAM tier and disk tier for ``duration_s`` (GreenCache Eq. 4 for each
    tier, with the tier's own per-TB figure and lifetime; footnote 1 applies Eq. 4 to DRAM); the disk at its
    medium's rate (``CarbonParams.disk_rate``: HDD or SSD; empty: SSD)."""
    disk_g_per_tb, disk_lifetime_s = params.disk_rate(disk_medium)
    disk = cache_embodied_g(allocated_bytes=disk_bytes, duration_s=duration_s, lifetime_s=disk_lifetime_s,
                            ssd_embodied_g_per_tb=disk_g_per_tb)
    dram = cache_embodied_g(allocated_bytes=dram_bytes, duration_s=duration_s, lifetime_s=params.dram_lifetime_s,
                            ssd_embodied_g_per_tb=params.dram_embodied_g_per_tb)
    return disk + dram


def interval_carbon(
    *,
    duration_s: float,
    energy_kwh: float,
    ci_g_per_kwh: float,
    platform: Platform,
    params: CarbonParams,
    cache_allocated_tb: float = 0.0,
) -> IntervalCarbon:
    """Carbon of running ``platform`` with ``cache_allocated_tb`` of SSD cache for one interval
    (GreenCache Eq. 5).

    Eq. 5 is printed as C = E x CI + (T/LT)(C_e,Cache + C_e,Others), but C_e,Cache of Eq. 4 already
    contains T/LT; applying T/LT twice would be dimensionally wrong. This follows the paper's ILP
    objective, Eq. 6, which amortises each term once, with each component's own lifetime:

        C = E x PUE x CI + S_alloc x (T / LT_SSD) x C_e,SSD^Unit + sum_comp (T / LT_comp) x C_e,comp

    ``params`` supplies PUE and the SSD per-TB embodied carbon and lifetime.
    """
    duration = _non_negative("duration_s", duration_s)
    operational = operational_g(energy_kwh=energy_kwh, ci_g_per_kwh=ci_g_per_kwh, pue=params.pue)
    cache = cache_embodied_g(
        allocated_tb=cache_allocated_tb,
        duration_s=duration,
        lifetime_s=params.ssd_lifetime_s,
        ssd_embodied_g_per_tb=params.ssd_embodied_g_per_tb,
    )
    others = platform.amortised_embodied_g(duration_s=duration)
    return IntervalCarbon(operational_g=operational, cache_embodied_g=cache, other_embodied_g=others)


# ------------------------------------------------------------------------------------------------
# CLOVER objective
# ------------------------------------------------------------------------------------------------


def clover_delta_accuracy_pct(*, accuracy_frac: float, base_accuracy_frac: float) -> float:
    """CLOVER Eq. 1: (A - A_base) / A_base x 100 %. A_base is the accuracy with the highest-quality
    variant everywhere, so the result is normally <= 0 (not enforced)."""
    accuracy = _in_unit_interval("accuracy_frac", accuracy_frac)
    base = _in_unit_interval("base_accuracy_frac", base_accuracy_frac)
    if base <= 0.0:
        raise ValueError(f"base_accuracy_frac must be finite and in (0, 1], got {base_accuracy_frac!r}")
    return (accuracy - base) / base * 100.0


def clover_delta_carbon_pct(*, carbon_g: float, base_carbon_g: float) -> float:
    """CLOVER Eq. 2: (C_base - E x ci) / C_base x 100 %, a reduction (positive = less carbon).

    ``carbon_g`` is E(x^p, x^v) x ci, the configuration's carbon per request at the current carbon
    intensity (``operational_g``); ``base_carbon_g`` is C_base, the per-request carbon of the
    highest-quality model on a dedicated GPU at a fixed baseline carbon intensity."""
    carbon = _non_negative("carbon_g", carbon_g)
    base = _positive("base_carbon_g", base_carbon_g)
    return (base - carbon) / base * 100.0


def clover_objective(*, carbon_delta_pct: float, accuracy_delta_pct: float, lambda_: float) -> float:
    """CLOVER Eq. 3: f = lambda x dCarbon + (1 - lambda) x dAccuracy, to be maximised (Eq. 4) subject
    to the p95 latency SLA (Eq. 5, checked by the caller). Inputs are Eq. 2 and Eq. 1 in percent."""
    weight = _in_unit_interval("lambda_", lambda_)
    carbon = _number("carbon_delta_pct", carbon_delta_pct)
    accuracy = _number("accuracy_delta_pct", accuracy_delta_pct)
    return weight * carbon + (1.0 - weight) * accuracy
