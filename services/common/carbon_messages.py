"""Conversion between the carbon model (greenserve.common.carbon) and its greenserve.v1 messages.

Everything that arrives over the wire is validated here and rejected with InvalidArgument naming the
field path (e.g. "carbon_params.components[1].lifetime_s"). Proto3 zero values mean "use the default".
"""

from __future__ import annotations

import math

from greenserve.common.carbon_params import CarbonParams, load_default_params
from greenserve.common.embodied_carbon import Platform
from greenserve.common.errors import InvalidArgument
from greenserve.v1 import common_pb2

# The platform charged when a request names no components: GreenCache Table 1's server without its
# SSD (SSD is charged by allocated size instead, Eq. 4).
DEFAULT_PLATFORM_COUNTS: dict[str, int] = {"gpu.L40": 4, "cpu.EPYC-7453": 1, "dram.DDR4-512GB": 1}

_KIND_NAMES = {
    common_pb2.COMPONENT_KIND_GPU: "gpu",
    common_pb2.COMPONENT_KIND_CPU: "cpu",
    common_pb2.COMPONENT_KIND_DRAM: "dram",
}
_KIND_ENUMS = {name: kind for kind, name in _KIND_NAMES.items()}


def require_finite(field: str, value: float, *, minimum: float | None = None,
                   maximum: float | None = None) -> float:
    """The value, or InvalidArgument naming `field` when it is NaN/inf, below `minimum` or above `maximum`."""
    if not math.isfinite(value):
        raise InvalidArgument(field, f"must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidArgument(field, f"must be >= {minimum:g}, got {value!r}")
    if maximum is not None and value > maximum:
        raise InvalidArgument(field, f"must be <= {maximum:g}, got {value!r}")
    return value


def params_from_proto(
    msg: common_pb2.CarbonParams, *, field: str = "carbon_params"
) -> tuple[CarbonParams, Platform]:
    """Defaults overridden by what `msg` sets, and the platform its components describe.

    A component that the defaults know (kind + name) takes the message's embodied carbon and lifetime
    when they are non-zero; an unknown one must give its embodied carbon. No components: the default
    platform (GreenCache Table 1 server).
    """
    overrides: dict[str, float] = {}
    if msg.pue != 0:
        overrides["pue"] = require_finite(f"{field}.pue", msg.pue, minimum=1.0)
    if msg.ssd_embodied_g_per_tb != 0:
        overrides["ssd_embodied_g_per_tb"] = require_finite(
            f"{field}.ssd_embodied_g_per_tb", msg.ssd_embodied_g_per_tb, minimum=0.0
        )
    if msg.ssd_lifetime_s != 0:
        overrides["ssd_lifetime_s"] = require_finite(f"{field}.ssd_lifetime_s", msg.ssd_lifetime_s, minimum=1e-9)
    counts: dict[str, int] = {}
    defaults = load_default_params()
    known = {spec.key for spec in defaults.components}
    for i, comp in enumerate(msg.components):
        path = f"{field}.components[{i}]"
        kind = _KIND_NAMES.get(comp.kind)
        if kind is None:
            raise InvalidArgument(f"{path}.kind", "must be GPU, CPU or DRAM (SSD is set by ssd_embodied_g_per_tb)")
        if not comp.name or "." in comp.name:
            raise InvalidArgument(f"{path}.name", f"must be a non-empty model name without '.', got {comp.name!r}")
        key = f"{kind}.{comp.name}"
        if key in counts:
            raise InvalidArgument(f"{path}.name", f"component {key} is listed twice")
        if comp.embodied_g != 0:
            overrides[f"{key}.embodied_g"] = require_finite(f"{path}.embodied_g", comp.embodied_g, minimum=0.0)
        elif key not in known:
            raise InvalidArgument(f"{path}.embodied_g", f"unknown component {key} needs its embodied carbon")
        if comp.lifetime_s != 0:
            overrides[f"{key}.lifetime_s"] = require_finite(f"{path}.lifetime_s", comp.lifetime_s, minimum=1e-9)
        counts[key] = comp.count or 1
    try:
        params = defaults.with_overrides(overrides)
    except ValueError as exc:  # the library re-validates; its message names the argument
        raise InvalidArgument(field, str(exc)) from exc
    return params, params.platform(counts or DEFAULT_PLATFORM_COUNTS)


def params_to_proto(params: CarbonParams, platform: Platform) -> common_pb2.CarbonParams:
    """The parameters and platform actually used, for echoing back to callers."""
    return common_pb2.CarbonParams(
        pue=params.pue,
        ssd_embodied_g_per_tb=params.ssd_embodied_g_per_tb,
        ssd_lifetime_s=params.ssd_lifetime_s,
        components=[
            common_pb2.EmbodiedComponent(
                kind=_KIND_ENUMS[item.component.kind],
                name=item.component.model,
                embodied_g=item.component.embodied_g,
                lifetime_s=item.component.lifetime_s,
                count=item.count,
            )
            for item in platform.items
        ],
    )


def breakdown_to_proto(
    *, operational_g: float, embodied_compute_g: float, embodied_storage_g: float, energy_kwh: float, ci_g_per_kwh: float
) -> common_pb2.CarbonBreakdown:
    return common_pb2.CarbonBreakdown(
        operational_g=operational_g,
        embodied_compute_g=embodied_compute_g,
        embodied_storage_g=embodied_storage_g,
        total_g=operational_g + embodied_compute_g + embodied_storage_g,
        energy_kwh=energy_kwh,
        ci_g_per_kwh=ci_g_per_kwh,
    )
