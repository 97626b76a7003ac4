"""Import and export NVIDIA mig-parted configuration files (``version: v1``, ``mig-configs``).

Format (``NVIDIA/mig-parted api/spec/v1/spec.go`` and the examples of its README)::

    version: v1
    mig-configs:
      <name>:
        - devices: all | [0, 1, ...]        # GPU positions in PCI order
          mig-enabled: true | false
          mig-devices: {"1g.5gb": 2, "3g.20gb": 1}   # required when enabled, empty/absent when disabled
          device-filter: ["0x20B010DE", ...]         # optional: only GPUs with these PCI ids

Unknown keys are errors, as in mig-parted. Profile keys may carry a compute-instance prefix
(``"3c.3g.20gb"``): only full-size compute instances (prefix equal to the GI's slices) are accepted, since
the partitioner runs one engine per GI.

mig-parted is count-based: a config says *how many* of each profile, not *where*. Importing places the
counts with the planner's packing rule (``layout_diff.resolve_target``); exporting drops placements. An entry
with ``mig-enabled: false`` becomes a layout with no GIs. ``devices: all`` becomes one layout with an empty
``gpu_uuid`` (every GPU of the model); an index becomes the UUID of the GPU at that index when the service
knows it, else ``index:<n>``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from greenserve.gpu_partitioner import layout_diff
from greenserve.common.mig_geometry import GpuGeometry, LayoutError, Placement

ENTRY_KEYS = {"devices", "mig-enabled", "mig-devices", "device-filter"}
#: Entries, device indices, profile keys and device-filter ids one file may expand to, in all. YAML aliases let a
#: few kB name one long list in every entry of every config (millions of layouts); real files hold dozens.
MAX_ITEMS = 10_000
_CI_PREFIX = re.compile(r"^(\d+)c\.(\d+g\..+)$")


class MigPartedError(ValueError):
    """The YAML breaks the spec; `path` names the offending key (e.g. ``mig-configs.all-1g.5gb[0].devices``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclass
class ImportedLayout:
    """One GPU's layout from an imported config."""

    gpu_uuid: str
    placements: list[Placement]
    mig_enabled: bool = True


@dataclass
class ImportedConfig:
    """A named mig-parted config converted to layouts for one GPU model."""

    name: str
    layouts: list[ImportedLayout] = field(default_factory=list)


def _profile_name(geo: GpuGeometry, key: str, path: str) -> str:
    match = _CI_PREFIX.match(key)
    if match:
        ci_slices, gi_name = int(match.group(1)), match.group(2)
        if not geo.has_profile(gi_name):
            raise MigPartedError(path, f"{geo.model} has no MIG profile {gi_name!r}")
        if ci_slices != geo.profile(gi_name).compute_slices:
            raise MigPartedError(path, f"{key!r}: only full-size compute instances are supported (one engine per GI)")
        return gi_name
    if not geo.has_profile(key):
        raise MigPartedError(path, f"{geo.model} has no MIG profile {key!r} (known: {', '.join(p.name for p in geo.profiles)})")
    return key


def _device_filter(value: Any, path: str) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) and re.fullmatch(r"0x[0-9A-Fa-f]{8}", i) for i in items):
        raise MigPartedError(path, "device-filter must be a PCI id like 0x20B010DE or a list of them")
    return [i.upper().replace("0X", "0x") for i in items]


def parse(text: str, geo: GpuGeometry, *, index_to_uuid: Mapping[int, str] | None = None) -> list[ImportedConfig]:
    """Parse mig-parted YAML into layouts for `geo`'s model; MigPartedError names the bad key."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MigPartedError("yaml", f"not valid YAML: {exc}") from None
    except RecursionError:  # PyYAML composes nested collections recursively: a few kB of brackets exceed the limit
        raise MigPartedError("yaml", "not valid YAML: nested too deeply") from None
    except ValueError as exc:  # a constructor's int(): e.g. more digits than Python converts (4,300)
        raise MigPartedError("yaml", f"not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise MigPartedError("yaml", "the document must be a mapping with 'version' and 'mig-configs'")
    unknown = set(doc) - {"version", "mig-configs"}
    if unknown:
        raise MigPartedError(min(unknown), "unknown key")
    if doc.get("version") != "v1":
        raise MigPartedError("version", f"must be 'v1', got {doc.get('version')!r}")
    configs = doc.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise MigPartedError("mig-configs", "must be a non-empty mapping of config names to lists of entries")
    out: list[ImportedConfig] = []
    index_to_uuid = index_to_uuid or {}
    items = 0
    for name, entries in configs.items():
        cpath = f"mig-configs.{name}"
        if not isinstance(entries, list) or not entries:
            raise MigPartedError(cpath, "must be a non-empty list of entries")
        config = ImportedConfig(name=str(name))
        for i, entry in enumerate(entries):
            epath = f"{cpath}[{i}]"
            if not isinstance(entry, dict):
                raise MigPartedError(epath, "must be a mapping")
            items += 1 + sum(len(v) for k in ("devices", "mig-devices", "device-filter")
                             if isinstance(v := entry.get(k), (list, dict)))
            if items > MAX_ITEMS:
                raise MigPartedError("mig-configs", f"more than {MAX_ITEMS} entries, devices, mig-devices and "
                                     "device-filter items in all (YAML aliases count each time they are used)")
            unknown = set(entry) - ENTRY_KEYS
            if unknown:
                raise MigPartedError(f"{epath}.{min(unknown)}", "unknown key")
            if "devices" not in entry:
                raise MigPartedError(f"{epath}.devices", "required")
            devices = entry["devices"]
            if devices != "all" and not (
                isinstance(devices, list) and devices and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices)
            ):
                raise MigPartedError(f"{epath}.devices", "must be 'all' or a non-empty list of GPU indices")
            if not isinstance(entry.get("mig-enabled"), bool):
                raise MigPartedError(f"{epath}.mig-enabled", "required, true or false")
            enabled = entry["mig-enabled"]
            mig_devices = entry.get("mig-devices")
            if enabled and not isinstance(mig_devices, dict):
                raise MigPartedError(f"{epath}.mig-devices", "required (a mapping, possibly empty) when mig-enabled is true")
            if not enabled and mig_devices:
                raise MigPartedError(f"{epath}.mig-devices", "must be empty when mig-enabled is false")
            if "device-filter" in entry:
                wanted = _device_filter(entry["device-filter"], f"{epath}.device-filter")
                if not {w.upper() for w in wanted} & {p.upper() for p in geo.pci_ids}:
                    continue  # entry is for another GPU model
            names: list[str] = []
            for key, count in (mig_devices or {}).items():
                kpath = f"{epath}.mig-devices.{key}"
                if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                    raise MigPartedError(kpath, "count must be an integer >= 0")
                name = _profile_name(geo, str(key), kpath)
                if len(names) + count > geo.memory_slices:  # every GI takes a memory slice at least
                    raise MigPartedError(f"{epath}.mig-devices", f"does not fit on one {geo.model}: more than "
                                         f"{geo.memory_slices} GPU instances")
                names.extend([name] * count)
            try:
                placements = layout_diff.resolve_target(geo, [], names)
            except LayoutError as exc:
                raise MigPartedError(f"{epath}.mig-devices", f"does not fit on one {geo.model}: {exc}") from None
            targets = [""] if devices == "all" else [index_to_uuid.get(d, f"index:{d}") for d in devices]
            config.layouts.extend(ImportedLayout(gpu_uuid=t, placements=list(placements), mig_enabled=enabled) for t in targets)
        out.append(config)
    return out


def export(
    configs: Sequence[tuple[str, Sequence[tuple[str, Sequence[Placement]]]]], geo: GpuGeometry,
    *, uuid_to_index: Mapping[str, int] | None = None,
) -> str:
    """YAML for [(config name, [(gpu_uuid, placements), ...]), ...]; gpu_uuid "" means ``devices: all``.

    Every entry carries the model's PCI ids as ``device-filter``, so the file is safe on mixed nodes.
    """
    uuid_to_index = uuid_to_index or {}
    doc: dict[str, Any] = {"version": "v1", "mig-configs": {}}
    for name, layouts in configs:
        if not name or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", name):
            raise MigPartedError("name", f"config name {name!r} must be letters, digits, '.', '_', '+', '-'")
        groups: dict[tuple[tuple[str, int], ...], list[int] | str] = {}
        for gpu_uuid, placements in layouts:
            geo.validate(placements)
            key = tuple(sorted(Counter(p.profile for p in placements).items()))
            if gpu_uuid == "":
                groups[key] = "all"
                continue
            if gpu_uuid.startswith("index:") and gpu_uuid[6:].isdigit():
                index = int(gpu_uuid[6:])
            elif gpu_uuid in uuid_to_index:
                index = uuid_to_index[gpu_uuid]
            else:
                raise MigPartedError("gpu_uuid", f"unknown GPU {gpu_uuid!r}: mig-parted addresses GPUs by index")
            existing = groups.setdefault(key, [])
            if existing != "all":
                assert isinstance(existing, list)
                existing.append(index)
        entries = []
        for key, devices in groups.items():
            entries.append({
                "device-filter": list(geo.pci_ids),
                "devices": devices if devices == "all" else sorted(devices),
                "mig-enabled": True,
                "mig-devices": {profile: count for profile, count in key},
            })
        doc["mig-configs"][name] = entries
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
