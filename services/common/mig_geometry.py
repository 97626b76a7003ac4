"""MIG geometry: GPU-instance profiles and placements per GPU model, layout validation and enumeration.

A GPU has 8 memory slices and 7 compute slices. A GPU instance (GI) of a profile occupies the memory slices
``[start, start + size)`` where ``size`` is the profile's *memory* slice count (a 3g takes 4) and ``start`` is one
of the profile's legal starts. A layout (set of placed GIs) is valid when (the rules of NVIDIA's MIG User Guide,
https://docs.nvidia.com/datacenter/tesla/mig-user-guide/, "Supported MIG Profiles" and "Concepts", and of the NVML
API reference, https://docs.nvidia.com/deploy/nvml-api/, ``nvmlDeviceCreateGpuInstanceWithPlacement``):

1. every profile is one the GPU model offers (and the driver is new enough for it);
2. every placement uses the profile's memory size and a legal start;
3. no two GIs overlap on the memory axis;
4. no profile exceeds its instance count (``info.instanceCount``);
5. the compute slices add up to at most 7;
6. a 4g and a 3g together need driver R510 or newer;
7. [I] a ``+me`` 1g GI does not coexist with another 1g GI (mig-parted's rule; see the data file).

All rules are predicates on the *set* of GIs, so a subset of a valid layout is valid: destroying GIs
never breaks validity, which the planner relies on.

A layout is **maximal** for a set of allowed profiles when it is valid and no GI of an allowed profile
can be added at any legal start without breaking a rule. With the five classic A100 profiles
(1g.5gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb) this gives NVIDIA's 19 configurations (18 before R510).

The engines on an instance: an instance can run several (a DPD pair's prefiller and its decoder).
``MigInstance.engine_ids`` lists them; ``engine_id`` holds the first for readers that predate ``engine_ids``, and an
older gpu-partitioner sent only ``engine_id`` with all of them joined by ','. Read as one id that made an engine "a,b"
that exists nowhere, so every reader goes through ``instance_engine_ids``.

Profiles and placements come from ``data/mig_profiles.toml``; the NVML backend replaces them with what
the GPU reports (``GpuGeometry.with_device_profiles``).
"""

from __future__ import annotations

import json
import tomllib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only annotations: the CLI imports this module without loading the stubs
    from greenserve.v1 import common_pb2

DATA_FILE = Path(__file__).with_name("data") / "mig_profiles.toml"

#: Newest driver branch assumed when the caller does not say (all rules of current drivers apply).
CURRENT_DRIVER = 10_000

# Reasons a placement is refused; the backends map them to NVML's error codes.
REASON_INVALID = "invalid_argument"  # unknown profile, wrong size or start (NVML_ERROR_INVALID_ARGUMENT)
REASON_RESOURCES = "insufficient_resources"  # overlap, count, compute, +me (NVML_ERROR_INSUFFICIENT_RESOURCES)
REASON_NOT_SUPPORTED = "not_supported"  # profile or combination needs a newer driver (NVML_ERROR_NOT_SUPPORTED)


@dataclass(frozen=True, order=True)
class Placement:
    """One GI of a layout: profile name, first memory slice and number of memory slices."""

    start: int
    size: int
    profile: str

    @property
    def mask(self) -> int:
        """Bit mask of the memory slices it occupies."""
        return ((1 << self.size) - 1) << self.start

    def to_json(self) -> dict[str, object]:
        """The CLI/journal form: {"profile": ..., "start": ..., "size": ...}."""
        return {"profile": self.profile, "start": self.start, "size": self.size}

    @staticmethod
    def from_json(value: dict[str, Any]) -> Placement:
        return Placement(start=int(value["start"]), size=int(value["size"]), profile=str(value["profile"]))

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}:{self.size}"


@dataclass(frozen=True)
class MigProfile:
    """A GPU-instance profile of one GPU model (values of ``nvmlDeviceGetGpuInstanceProfileInfo``)."""

    name: str
    nvml_constant: str
    nvml_value: int
    profile_id: int
    compute_slices: int
    memory_slices: int
    starts: tuple[int, ...]
    max_instances: int
    memory_mib: int
    media_extensions: bool = False
    min_driver: int = 0

    @property
    def kubernetes_resource(self) -> str:
        """Extended resource name the NVIDIA device plugin advertises (mixed strategy): '+' becomes '.'."""
        return "nvidia.com/mig-" + self.name.replace("+", ".")


class LayoutError(ValueError):
    """A layout breaks a rule. ``index`` is the offending placement (or -1), ``reason`` a REASON_* code."""

    def __init__(self, message: str, *, index: int = -1, reason: str = REASON_INVALID) -> None:
        super().__init__(message)
        self.index = index
        self.reason = reason


@dataclass(frozen=True)
class GpuGeometry:
    """Profiles, placements and rules of one GPU model."""

    model: str
    display_name: str
    profiles: tuple[MigProfile, ...]
    memory_slices: int = 8
    compute_slices: int = 7
    memory_mib: int = 0
    mode_change_needs_reset: bool = True
    min_driver: int = 0
    four_plus_three_min_driver: int = 510
    me_exclusive_with_1g: bool = True
    max_power_w: float = 0.0
    sim_idle_power_w: float = 0.0
    pci_ids: tuple[str, ...] = ()
    name_patterns: tuple[str, ...] = ()
    source: str = "table"  # "table" or "nvml" (read from the device)
    _by_name: dict[str, MigProfile] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name.update({p.name: p for p in self.profiles})

    def profile(self, name: str) -> MigProfile:
        """The profile called `name`; KeyError when the model has none."""
        return self._by_name[name]

    def has_profile(self, name: str) -> bool:
        return name in self._by_name

    def profile_by_id(self, profile_id: int) -> MigProfile | None:
        return next((p for p in self.profiles if p.profile_id == profile_id), None)

    def with_device_profiles(self, profiles: Sequence[MigProfile]) -> GpuGeometry:
        """A copy whose profile table is what the device reported (names/placements from NVML)."""
        return replace(self, profiles=tuple(profiles), source="nvml", _by_name={})

    # ----------------------------------------------------------------------------------------------
    # Rules
    # ----------------------------------------------------------------------------------------------

    def check_add(self, layout: Sequence[Placement], new: Placement, *, driver: int = CURRENT_DRIVER) -> str | None:
        """Why `new` cannot join the valid `layout` (message; ``LayoutError.reason`` via `check_add_reason`)."""
        problem = self.check_add_reason(layout, new, driver=driver)
        return None if problem is None else problem[1]

    def check_add_reason(
        self, layout: Sequence[Placement], new: Placement, *, driver: int = CURRENT_DRIVER
    ) -> tuple[str, str] | None:
        """(reason, message) when `new` cannot be added to the valid `layout`, else None."""
        if not self.has_profile(new.profile):
            known = ", ".join(p.name for p in self.profiles)
            return REASON_INVALID, f"{self.model} has no MIG profile {new.profile!r} (known: {known})"
        prof = self.profile(new.profile)
        if driver < prof.min_driver:
            return REASON_NOT_SUPPORTED, f"{prof.name} needs driver R{prof.min_driver} or newer"
        if new.size != prof.memory_slices:
            return REASON_INVALID, f"{prof.name} occupies {prof.memory_slices} memory slices, not {new.size}"
        if new.start not in prof.starts:
            return REASON_INVALID, f"{prof.name} cannot start at memory slice {new.start} (legal: {list(prof.starts)})"
        used = 0
        compute = prof.compute_slices
        same = 0
        for other in layout:
            used |= other.mask
            oprof = self._by_name.get(other.profile)
            if oprof is None:
                continue
            compute += oprof.compute_slices
            if other.profile == new.profile:
                same += 1
        if used & new.mask:
            clash = next(o for o in layout if o.mask & new.mask)
            return REASON_RESOURCES, f"{new} overlaps {clash} on the memory slices"
        if same + 1 > prof.max_instances:
            return REASON_RESOURCES, f"at most {prof.max_instances} x {prof.name} per GPU"
        if compute > self.compute_slices:
            return REASON_RESOURCES, f"{compute} compute slices exceed the GPU's {self.compute_slices}"
        if self.me_exclusive_with_1g and prof.compute_slices == 1:
            for other in layout:
                oprof = self._by_name.get(other.profile)
                if oprof is not None and oprof.compute_slices == 1 and (oprof.media_extensions or prof.media_extensions):
                    return REASON_RESOURCES, f"a +me 1g instance cannot share the GPU with another 1g ({other} and {new})"
        if driver < self.four_plus_three_min_driver:
            sizes = {self._by_name[o.profile].compute_slices for o in layout if o.profile in self._by_name}
            if (prof.compute_slices == 4 and 3 in sizes) or (prof.compute_slices == 3 and 4 in sizes):
                return REASON_NOT_SUPPORTED, f"4g + 3g on one GPU needs driver R{self.four_plus_three_min_driver}+"
        return None

    def validate(self, layout: Sequence[Placement], *, driver: int = CURRENT_DRIVER) -> None:
        """Raise LayoutError naming the first offending placement; None when the layout is valid."""
        placed: list[Placement] = []
        for index, placement in enumerate(layout):
            problem = self.check_add_reason(placed, placement, driver=driver)
            if problem is not None:
                raise LayoutError(problem[1], index=index, reason=problem[0])
            placed.append(placement)

    def is_valid(self, layout: Sequence[Placement], *, driver: int = CURRENT_DRIVER) -> bool:
        try:
            self.validate(layout, driver=driver)
        except LayoutError:
            return False
        return True

    def candidates(self, profiles: Iterable[str] | None = None) -> list[Placement]:
        """Every (profile, legal start) placement of the allowed profiles."""
        names = [p.name for p in self.profiles] if profiles is None else list(profiles)
        out: list[Placement] = []
        for name in names:
            prof = self.profile(name)
            out.extend(Placement(start=s, size=prof.memory_slices, profile=name) for s in prof.starts)
        return out

    def is_maximal(self, layout: Sequence[Placement], profiles: Iterable[str] | None = None, *, driver: int = CURRENT_DRIVER) -> bool:
        """Valid and no GI of an allowed profile fits anywhere."""
        if not self.is_valid(layout, driver=driver):
            return False
        return all(self.check_add_reason(layout, c, driver=driver) is not None for c in self.candidates(profiles))

    def maximal_layouts(self, profiles: Iterable[str] | None = None, *, driver: int = CURRENT_DRIVER) -> list[tuple[Placement, ...]]:
        """All maximal layouts of the allowed profiles, in NVIDIA's figure order (see `figure_key`)."""
        names = tuple(p.name for p in self.profiles) if profiles is None else tuple(dict.fromkeys(profiles))
        for name in names:
            if not self.has_profile(name):
                raise LayoutError(f"{self.model} has no MIG profile {name!r}", reason=REASON_INVALID)
        return list(_maximal_layouts_cached(self, names, driver))

    def figure_key(self, layout: Sequence[Placement]) -> tuple[object, ...]:
        """Sort key reproducing the order of NVIDIA's A100 figure that CLOVER numbers (Fig. 1).

        The figure lists layouts whose left half (memory slices 0-3) is one GI (7g, 4g, 3g) first, by that
        GI's size and then by the right half; then the others grouped by their right half (3g, 2g+1g,
        1g+1g+1g) and ordered by their left half (2g+2g, 2g+1g+1g, 1g+1g+2g, 1g x 4). CLOVER's text fixes
        configurations 1 (7g), 3 (4g, 2g, 1g), 10 ({1g, 1g, 2g, 3g}) and 19 (7 x 1g); the tests check them.
        """
        ordered = sorted(layout)
        half = self.memory_slices // 2

        def sizes(items: Iterable[Placement]) -> tuple[tuple[int, int, int], ...]:
            return tuple(
                (-self.profile(p.profile).compute_slices, -p.size, int(self.profile(p.profile).media_extensions))
                for p in items
            )

        left = [p for p in ordered if p.start < half]
        right = [p for p in ordered if p.start >= half]
        if len(left) == 1 and (left[0].size >= half):
            return (0, sizes(left), sizes(right))
        return (1, sizes(right), sizes(left))


#: Enumerations kept (LRU): the few an optimizer asks for stay hot, while ListLayouts' driver_branch (any uint32) and
#: profile lists (any order) cannot grow the cache without bound.
MAXIMAL_LAYOUTS_CACHED = 256


@lru_cache(maxsize=MAXIMAL_LAYOUTS_CACHED)
def _maximal_layouts_cached(geometry: GpuGeometry, names: tuple[str, ...], driver: int) -> tuple[tuple[Placement, ...], ...]:
    cands = sorted(geometry.candidates(names))
    found: list[tuple[Placement, ...]] = []

    def extend(start_index: int, layout: list[Placement]) -> None:
        # Depth-first over candidates in a fixed order: each valid set is visited exactly once.
        for i in range(start_index, len(cands)):
            c = cands[i]
            if geometry.check_add_reason(layout, c, driver=driver) is None:
                layout.append(c)
                extend(i + 1, layout)
                layout.pop()
        if layout and all(geometry.check_add_reason(layout, c, driver=driver) is not None for c in cands):
            found.append(tuple(sorted(layout)))

    extend(0, [])
    unique = sorted(set(found), key=geometry.figure_key)
    return tuple(unique)


# --------------------------------------------------------------------------------------------------
# Loading the tables
# --------------------------------------------------------------------------------------------------


def _load_table(path: Path) -> dict[str, GpuGeometry]:
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    models: dict[str, GpuGeometry] = {}
    for model, spec in data["models"].items():
        profiles = tuple(
            MigProfile(
                name=p["name"], nvml_constant=p["nvml_constant"], nvml_value=int(p["nvml_value"]),
                profile_id=int(p["profile_id"]), compute_slices=int(p["compute_slices"]),
                memory_slices=int(p["memory_slices"]), starts=tuple(int(s) for s in p["starts"]),
                max_instances=int(p["max_instances"]), memory_mib=int(p["memory_mib"]),
                media_extensions=bool(p.get("media_extensions", False)), min_driver=int(p.get("min_driver", 0)),
            )
            for p in spec["profiles"]
        )
        models[model] = GpuGeometry(
            model=model, display_name=spec["display_name"], profiles=profiles,
            memory_slices=int(spec["memory_slices"]), compute_slices=int(spec["compute_slices"]),
            memory_mib=int(spec["memory_mib"]), mode_change_needs_reset=bool(spec["mode_change_needs_reset"]),
            min_driver=int(spec["min_driver"]), four_plus_three_min_driver=int(spec["four_plus_three_min_driver"]),
            me_exclusive_with_1g=bool(spec["me_exclusive_with_1g"]), max_power_w=float(spec["max_power_w"]),
            sim_idle_power_w=float(spec["sim_idle_power_w"]), pci_ids=tuple(spec["pci_ids"]),
            name_patterns=tuple(spec["name_patterns"]),
        )
    return models


@cache
def models() -> dict[str, GpuGeometry]:
    """The GPU models of the data file, by name ("A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB")."""
    return _load_table(DATA_FILE)


MODEL_NAMES: tuple[str, ...] = ("A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB")


def geometry(model: str) -> GpuGeometry:
    """Geometry of a model name; KeyError naming the known models otherwise."""
    table = models()
    if model not in table:
        raise KeyError(f"unknown GPU model {model!r}; known: {', '.join(table)}")
    return table[model]


def identify_model(*, name: str = "", pci_device_id: int | None = None) -> str | None:
    """Model key of a GPU from its PCI device id (device<<16 | vendor) or, failing that, its product name."""
    if pci_device_id is not None:
        wanted = f"0X{pci_device_id & 0xFFFFFFFF:08X}"
        for key, geo in models().items():
            if wanted in {p.upper() for p in geo.pci_ids}:
                return key
    upper = name.upper()
    # Longest pattern first, so "H100 80GB HBM3" wins over "H100".
    pairs = sorted(((pat.upper(), key) for key, geo in models().items() for pat in geo.name_patterns), key=lambda t: -len(t[0]))
    for pattern, key in pairs:
        if pattern in upper:
            return key
    return None


def parse_layout(geo: GpuGeometry, text: str) -> tuple[list[Placement], list[str]]:
    """Parse a CLI layout: JSON (a list of {"profile","start"[,"size"]} or the `mig layouts` object's layout),
    or "PROFILE@START,PROFILE,..." (an item without @START is placed by the planner). "" or "empty" is the
    empty layout. Returns (placed, unplaced profile names). Raises LayoutError on malformed text."""
    text = text.strip()
    if text in ("", "empty", "[]"):
        return [], []
    placed: list[Placement] = []
    unplaced: list[str] = []
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LayoutError(f"layout is not valid JSON: {exc}") from None
        if not isinstance(items, list):
            raise LayoutError("layout JSON must be a list of {profile, start, size}")
        for i, item in enumerate(items):
            if not isinstance(item, dict) or "profile" not in item:
                raise LayoutError(f"item {i} must be an object with 'profile'", index=i)
            name = str(item["profile"])
            if "start" not in item:
                unplaced.append(name)
                continue
            size = item.get("size")
            if size is None:
                size = geo.profile(name).memory_slices if geo.has_profile(name) else 0
            try:
                placed.append(Placement(start=int(item["start"]), size=int(size), profile=name))
            except (TypeError, ValueError):
                raise LayoutError(f"item {i}: start and size must be integers", index=i) from None
        return placed, unplaced
    for i, token in enumerate(t.strip() for t in text.split(",")):
        if not token:
            raise LayoutError(f"empty item {i} in layout {text!r}", index=i)
        name, _, start = token.partition("@")
        if not start:
            unplaced.append(name)
            continue
        if not start.isdigit():
            raise LayoutError(f"item {i} {token!r}: start must be a memory-slice index", index=i)
        size = geo.profile(name).memory_slices if geo.has_profile(name) else 0
        placed.append(Placement(start=int(start), size=size, profile=name))
    return placed, unplaced


def counts(layout: Iterable[Placement]) -> Counter[str]:
    """Profile -> number of GIs (mig-parted's view of a layout)."""
    return Counter(p.profile for p in layout)


def instance_engine_ids(instance: common_pb2.MigInstance) -> list[str]:
    """The ids of the engines on ``instance``: ``engine_ids``, or for an old sender (``engine_ids`` empty) its
    ``engine_id`` split at ',' (an engine id never holds one, so a single id comes back as it is)."""
    if instance.engine_ids:
        return list(instance.engine_ids)
    return [engine_id for engine_id in instance.engine_id.split(",") if engine_id]
