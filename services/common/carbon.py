"""The greenserve carbon model: one library, used by every service. This module holds its operational and combined
formulas and the CLOVER objective; ``embodied_carbon`` the embodied carbon of devices and cache storage,
``carbon_params`` the parameters (``CarbonParams``, the cited defaults), ``carbon_units`` the units, conversions and
argument checks.

Formulas (the papers are listed in docs/papers.md):

* Operational carbon, GreenCache Eq. 2 / GreenLLM Eq. 2::

      C_o = E x PUE x CI            (E in kWh, CI in gCO2e/kWh; the papers use PUE = 1)

* Embodied carbon of one component (GreenCache Eq. 1), a platform (Eq. 3) and allocated cache storage (Eq. 4):
  ``embodied_carbon``. The cache tiers (``cache_tiers_embodied_g``) charge Eq. 4 with the disk medium's own per-TB
  figure (``CarbonParams.disk_rate``: NVMe and SATA SSDs the SSD rate, an HDD 1/8 of it after Tannu & Nair,
  HotCarbon 2022) and the DRAM tier's (GreenCache footnote 1).

* Interval total, GreenCache Eq. 5, evaluated as in Eq. 6 (see ``interval_carbon``)::

      C = E x CI + C_e,Cache + sum_comp (T / LT_comp) x C_e,comp

* Per-request total, GreenLLM Eq. 1-3: the embodied part is also divided by the mean batch size::

      C_req = t_req / (mean_BS x LT) x C_e + E_req x CI

* CLOVER objective, CLOVER Eq. 1-3 (maximised, subject to the p95 SLA of Eq. 5)::

      dAccuracy = (A - A_base) / A_base x 100 %
      dCarbon   = (C_base - E x ci) / C_base x 100 %
      f         = lambda x dCarbon + (1 - lambda) x dAccuracy

Invalid inputs raise ``ValueError`` whose message starts with the offending argument's name (``carbon_units``);
services map it to gRPC INVALID_ARGUMENT.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# load_default_params and J_PER_KWH are not used here: they stay importable as carbon.<name> (with CarbonParams and
# Platform) for the router's core.py and receipt.py, which read them so (carbon.load_default_params(), ...).
from greenserve.common.carbon_params import CarbonParams, load_default_params  # noqa: F401
from greenserve.common.carbon_units import (  # noqa: F401
    J_PER_KWH,
    at_least,
    finite_number,
    in_unit_interval,
    non_negative,
    positive,
)
from greenserve.common.embodied_carbon import Platform, cache_embodied_g

__all__ = [
    "CarbonBreakdown",
    "IntervalCarbon",
    "cache_tiers_embodied_g",
    "clover_delta_accuracy_pct",
    "clover_delta_carbon_pct",
    "clover_objective",
    "interval_carbon",
    "operational_g",
    "request_carbon",
]


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
# the formulas
# ------------------------------------------------------------------------------------------------


def operational_g(*, energy_kwh: float, ci_g_per_kwh: float, pue: float = 1.0) -> float:
    """Operational carbon C_o = E x PUE x CI (GreenCache Eq. 2, GreenLLM Eq. 2; the papers use PUE 1)."""
    energy = non_negative("energy_kwh", energy_kwh)
    ci = non_negative("ci_g_per_kwh", ci_g_per_kwh)
    factor = at_least("pue", pue, 1.0)
    return energy * factor * ci


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
    batch = at_least("mean_batch_size", mean_batch_size, 1.0)
    duration = non_negative("duration_s", duration_s)
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
    duration = non_negative("duration_s", duration_s)
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
    accuracy = in_unit_interval("accuracy_frac", accuracy_frac)
    base = in_unit_interval("base_accuracy_frac", base_accuracy_frac)
    if base <= 0.0:
        raise ValueError(f"base_accuracy_frac must be finite and in (0, 1], got {base_accuracy_frac!r}")
    return (accuracy - base) / base * 100.0


def clover_delta_carbon_pct(*, carbon_g: float, base_carbon_g: float) -> float:
    """CLOVER Eq. 2: (C_base - E x ci) / C_base x 100 %, a reduction (positive = less carbon).

    ``carbon_g`` is E(x^p, x^v) x ci, the configuration's carbon per request at the current carbon
    intensity (``operational_g``); ``base_carbon_g`` is C_base, the per-request carbon of the
    highest-quality model on a dedicated GPU at a fixed baseline carbon intensity."""
    carbon = non_negative("carbon_g", carbon_g)
    base = positive("base_carbon_g", base_carbon_g)
    return (base - carbon) / base * 100.0


def clover_objective(*, carbon_delta_pct: float, accuracy_delta_pct: float, lambda_: float) -> float:
    """CLOVER Eq. 3: f = lambda x dCarbon + (1 - lambda) x dAccuracy, to be maximised (Eq. 4) subject
    to the p95 latency SLA (Eq. 5, checked by the caller). Inputs are Eq. 2 and Eq. 1 in percent."""
    weight = in_unit_interval("lambda_", lambda_)
    carbon = finite_number("carbon_delta_pct", carbon_delta_pct)
    accuracy = finite_number("accuracy_delta_pct", accuracy_delta_pct)
    return weight * carbon + (1.0 - weight) * accuracy
