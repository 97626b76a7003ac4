"""Every tunable of the carbon model (``CarbonParams``), loaded from the cited defaults ``data/carbon_defaults.toml``
(``load_default_params``) or another TOML file of that layout, with overrides: PUE, lifetimes, the embodied carbon
of each component and the per-TB embodied carbon of the SSD, HDD and DRAM cache tiers (``DISK_MEDIA``: the
disk media a cache's disk tier can be on).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from greenserve.common.carbon_units import SECONDS_PER_YEAR, at_least, non_negative, positive
from greenserve.common.embodied_carbon import COMPONENT_KINDS, ComponentSpec, Platform, PlatformItem

__all__ = [
    "DEFAULT_DRAM_EMBODIED_G_PER_TB",
    "DEFAULT_HDD_EMBODIED_G_PER_TB",
    "DISK_MEDIA",
    "CarbonParams",
    "load_default_params",
]

_DEFAULTS_RESOURCE = ("data", "carbon_defaults.toml")

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
        object.__setattr__(self, "pue", at_least("pue", self.pue, 1.0))
        object.__setattr__(self, "default_lifetime_s", positive("default_lifetime_s", self.default_lifetime_s))
        object.__setattr__(
            self, "ssd_embodied_g_per_tb", non_negative("ssd_embodied_g_per_tb", self.ssd_embodied_g_per_tb)
        )
        object.__setattr__(self, "ssd_lifetime_s", positive("ssd_lifetime_s", self.ssd_lifetime_s))
        object.__setattr__(
            self, "dram_embodied_g_per_tb", non_negative("dram_embodied_g_per_tb", self.dram_embodied_g_per_tb)
        )
        object.__setattr__(self, "dram_lifetime_s", positive("dram_lifetime_s", self.dram_lifetime_s))
        object.__setattr__(
            self, "hdd_embodied_g_per_tb", non_negative("hdd_embodied_g_per_tb", self.hdd_embodied_g_per_tb)
        )
        object.__setattr__(self, "hdd_lifetime_s", positive("hdd_lifetime_s", self.hdd_lifetime_s))
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
        default_lifetime_s = positive("defaults.lifetime_years", defaults.get("lifetime_years")) * SECONDS_PER_YEAR
        pue = defaults.get("pue", 1.0)

        def lifetime_s(where: str, years: Any) -> float:
            return default_lifetime_s if years is None else positive(f"{where}.lifetime_years", years) * SECONDS_PER_YEAR

        def storage(table: str, default_g_per_tb: float | None) -> tuple[float, float]:
            """(embodied g per TB, lifetime s) of a storage table; ``default_g_per_tb`` None: the table is required."""
            entry = _table(document, table, required=default_g_per_tb is None)
            kg = entry.get("embodied_kg_per_tb", None if default_g_per_tb is None else default_g_per_tb / 1000.0)
            return (non_negative(f"{table}.embodied_kg_per_tb", kg) * 1000.0,
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
                        embodied_g=non_negative(f"{where}.embodied_kg", entry.get("embodied_kg")) * 1000.0,
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
        # each field by name (all are floats): a **dict would also type-check against ``components``
        params = replace(
            self, pue=scalars.get("pue", self.pue),
            default_lifetime_s=scalars.get("default_lifetime_s", self.default_lifetime_s),
            ssd_embodied_g_per_tb=scalars.get("ssd_embodied_g_per_tb", self.ssd_embodied_g_per_tb),
            ssd_lifetime_s=scalars.get("ssd_lifetime_s", self.ssd_lifetime_s),
            dram_embodied_g_per_tb=scalars.get("dram_embodied_g_per_tb", self.dram_embodied_g_per_tb),
            dram_lifetime_s=scalars.get("dram_lifetime_s", self.dram_lifetime_s),
            hdd_embodied_g_per_tb=scalars.get("hdd_embodied_g_per_tb", self.hdd_embodied_g_per_tb),
            hdd_lifetime_s=scalars.get("hdd_lifetime_s", self.hdd_lifetime_s),
        ) if scalars else self
        specs = {spec.key: spec for spec in params.components}
        for key, changes in per_component.items():
            if key in specs:
                spec = specs[key]
                specs[key] = replace(spec, embodied_g=changes.get("embodied_g", spec.embodied_g),
                                     lifetime_s=changes.get("lifetime_s", spec.lifetime_s))
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
