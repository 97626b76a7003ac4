"""Embodied carbon of hardware: one component amortised over its use (GreenCache Eq. 1), the devices a deployment
holds (``ComponentSpec``, ``PlatformItem``, ``Platform``: GreenCache Eq. 3) and allocated cache storage (GreenCache
Eq. 4).

* Amortised embodied carbon of one component, GreenCache Eq. 1 (and Eq. 6 per component)::

      (T / LT) x C_e

* Platform embodied carbon, GreenCache Eq. 3: sum over components (GPU, CPU, memory, SSD).

* Cache (SSD) embodied carbon, charged by the allocated size, GreenCache Eq. 4::

      C_e,Cache = S_alloc x (T / LT_SSD) x C_e,SSD^Unit       (C_e,SSD^Unit per TB)
"""

from __future__ import annotations

from dataclasses import dataclass

from greenserve.common.carbon_units import BYTES_PER_TB, non_negative, positive

__all__ = [
    "COMPONENT_KINDS",
    "ComponentSpec",
    "Platform",
    "PlatformItem",
    "amortised_embodied_g",
    "cache_embodied_g",
]

COMPONENT_KINDS: tuple[str, ...] = ("gpu", "cpu", "dram")
"""Kinds of per-device components. SSD cache storage is charged per TB instead (GreenCache Eq. 4)."""


def amortised_embodied_g(*, duration_s: float, lifetime_s: float, embodied_g: float) -> float:
    """Embodied carbon attributed to ``duration_s`` of use: (T / LT) x C_e (GreenCache Eq. 1)."""
    duration = non_negative("duration_s", duration_s)
    lifetime = positive("lifetime_s", lifetime_s)
    embodied = non_negative("embodied_g", embodied_g)
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
        size_tb = non_negative("allocated_tb", allocated_tb)
    else:
        size_tb = non_negative("allocated_bytes", allocated_bytes) / BYTES_PER_TB
    duration = non_negative("duration_s", duration_s)
    lifetime = positive("lifetime_s", lifetime_s)
    per_tb = non_negative("ssd_embodied_g_per_tb", ssd_embodied_g_per_tb)
    return size_tb * (duration / lifetime) * per_tb



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
        object.__setattr__(self, "embodied_g", non_negative(f"{self.key}.embodied_g", self.embodied_g))
        object.__setattr__(self, "lifetime_s", positive(f"{self.key}.lifetime_s", self.lifetime_s))

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
        duration = non_negative("duration_s", duration_s)
        return sum(
            item.count
            * amortised_embodied_g(
                duration_s=duration,
                lifetime_s=item.component.lifetime_s,
                embodied_g=item.component.embodied_g,
            )
            for item in self.items
        )
