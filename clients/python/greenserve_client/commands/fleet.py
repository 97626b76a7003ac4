"""`greenserve fleet ...`: the fleet inventory the optimizer plans over.

    greenserve fleet set FILE [--json]     declare pools, engines, variants, cache limits and GPUs (YAML or JSON)
    greenserve fleet show [--json]         the inventory in force: declared, merged with the GPUs the
                                           gpu-partitioners report

FILE holds one FleetInventory with the proto's field names in snake_case (see docs/optimizer.md and
deploy/fleet.example.yaml): ``pools`` (name, model, region, slo, engines, variants, load_series_key,
max_cache_dram_bytes, max_cache_disk_bytes, cache_step_bytes, mean_prompt_tokens, mean_output_tokens), ``gpus``
and ``max_cache_storage_bytes``. Enums take their proto names (``GPU_MODEL_A100_80GB``, ``ENGINE_KIND_VLLM``).
A ``*_bytes`` field also takes a size with a unit ("64GiB", "2 TB"). The output of ``fleet show --json``
(``{"fleet": ..., "updated_at": ...}``) is accepted as it is.

An unknown key or a value of the wrong type ends with exit status 2 and the key's path
(``pools[0].slo.ttft_s``); the optimizer's own checks (references between pools, engines, variants and GPUs)
come back as INVALID_ARGUMENT naming the field, also exit 2. Nothing is stored unless the whole file is valid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from google.protobuf.message_factory import GetMessageClass

from greenserve.common import strict_json
from greenserve.common.cli_parser import Parser
from greenserve.common.file_errors import cannot_read
from greenserve_client.cli import print_table
from greenserve_client.commands import optimizer_client

PROG = "greenserve fleet"
MAX_FILE_BYTES = 64 * 1024 * 1024
GIB = 1024**3


class FleetFileError(ValueError):
    """A fleet file that does not describe a FleetInventory; ``path`` names the key."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


_TYPE_NAMES = {
    FieldDescriptor.TYPE_STRING: "a string", FieldDescriptor.TYPE_BOOL: "true or false",
    FieldDescriptor.TYPE_DOUBLE: "a number", FieldDescriptor.TYPE_FLOAT: "a number",
    FieldDescriptor.TYPE_UINT32: "a non-negative integer", FieldDescriptor.TYPE_UINT64: "a non-negative integer",
    FieldDescriptor.TYPE_INT32: "an integer", FieldDescriptor.TYPE_INT64: "an integer",
}


def _expected(field: FieldDescriptor) -> str:
    if field.type == FieldDescriptor.TYPE_ENUM:
        names = [v.name for v in field.enum_type.values if not v.name.endswith("_UNSPECIFIED")]
        return "one of " + ", ".join(names)
    if field.name.endswith("_bytes"):
        return "a byte count or a size like '64GiB' or '2 TB'"
    return _TYPE_NAMES.get(field.type, "a value of its type")


def _scalar(desc: Descriptor, field: FieldDescriptor, value: Any, path: str) -> Any:
    """``value`` checked (and a size string turned into bytes) by protobuf's own JSON parser for this field."""
    if field.name.endswith("_bytes") and isinstance(value, str):
        from pydantic import ByteSize, TypeAdapter, ValidationError

        try:
            value = int(TypeAdapter(ByteSize).validate_python(value))
        except ValidationError:
            raise FleetFileError(path, f"must be {_expected(field)}, got {value!r}") from None
    if isinstance(value, bool) and field.type != FieldDescriptor.TYPE_BOOL:
        hint = " (YAML reads yes/no/on/off as booleans: quote the value)" if field.type == FieldDescriptor.TYPE_STRING else ""
        raise FleetFileError(path, f"must be {_expected(field)}, got {value!r}{hint}")
    if value is None:
        raise FleetFileError(path, f"must be {_expected(field)}, got nothing (null)")
    try:
        ParseDict({field.name: [value] if field.is_repeated else value}, GetMessageClass(desc)())
    except (ParseError, OverflowError, ValueError):  # OverflowError: an infinite number for an enum
        raise FleetFileError(path, f"must be {_expected(field)}, got {value!r}") from None
    return value


def _check(desc: Descriptor, data: Any, path: str) -> dict[str, Any]:
    """``data`` checked against the message ``desc`` key by key, every error naming its path."""
    if not isinstance(data, dict):
        raise FleetFileError(path, f"must be a mapping of {desc.name} fields, got {type(data).__name__}")
    by_name = {f.name: f for f in desc.fields} | {f.json_name: f for f in desc.fields}
    out: dict[str, Any] = {}
    for key, value in data.items():
        field = by_name.get(key) if isinstance(key, str) else None
        where = f"{path}.{key}" if path else str(key)
        if field is None:
            raise FleetFileError(where, f"unknown key; {desc.name} has {', '.join(f.name for f in desc.fields)}")
        where = f"{path}.{field.name}" if path else field.name
        if field.name in out:
            raise FleetFileError(where, "given twice (snake_case and camelCase)")
        if field.is_repeated:
            if not isinstance(value, list):
                raise FleetFileError(where, f"must be a list, got {type(value).__name__}")
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                out[field.name] = [_check(field.message_type, item, f"{where}[{i}]") for i, item in enumerate(value)]
            else:
                out[field.name] = [_scalar(desc, field, item, f"{where}[{i}]") for i, item in enumerate(value)]
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            out[field.name] = _check(field.message_type, value, where)
        else:
            out[field.name] = _scalar(desc, field, value, where)
    return out


def parse_fleet(data: Any) -> Any:
    """A FleetInventory from loaded YAML/JSON; FleetFileError naming the first bad key."""
    from greenserve.v1 import common_pb2

    if isinstance(data, dict) and "fleet" in data and set(data) <= {"fleet", "updated_at"}:
        data = data["fleet"]  # the output of `greenserve fleet show --json`
    if data is None:
        raise FleetFileError("", "the file is empty")
    checked = _check(common_pb2.FleetInventory.DESCRIPTOR, data, "")
    return ParseDict(checked, common_pb2.FleetInventory())


def load_fleet_file(path: Path) -> Any:
    """Reads and parses a fleet file (JSON when it ends in .json, else YAML, which also reads JSON); FleetFileError
    (without the file's name) when it is not a FleetInventory, OSError when it cannot be read."""
    import yaml

    if path.stat().st_size > MAX_FILE_BYTES:
        raise FleetFileError("", f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise FleetFileError("", f"not valid JSON: {exc}") from None
    except yaml.YAMLError as exc:
        raise FleetFileError("", f"not valid YAML: {' '.join(str(exc).split())}") from None
    return parse_fleet(data)


def _size(n: int) -> str:
    if n == 0:
        return "-"
    if n >= 10**12:
        return f"{n / 10**12:g} TB"
    return f"{n / GIB:g} GiB"


def print_fleet(fleet: Any, updated_at: str = "") -> None:
    from greenserve.v1 import common_pb2

    if updated_at:
        print(f"declared {updated_at}")
    rows = []
    for pool in fleet.pools:
        slo = pool.slo
        rows.append({
            "pool": pool.name, "model": pool.model, "region": pool.region,
            "slo": f"TTFT {slo.ttft_s:g}s TPOT {slo.tpot_s:g}s @{slo.attainment_fraction:g}",
            "engines": str(len(pool.engines)),
            "variants": ", ".join(f"{v.name} ({v.quality_fraction:g})" for v in pool.variants) or "-",
            "cache dram/disk": f"{_size(pool.max_cache_dram_bytes)} / {_size(pool.max_cache_disk_bytes)}",
        })
    if rows:
        print_table(rows, ["pool", "model", "region", "slo", "engines", "variants", "cache dram/disk"])
    else:
        print("no pools declared (greenserve fleet set FILE)")
    engines = [{"engine": e.id, "pool": p.name, "hardware": e.hardware or "-", "variant": e.model_variant or "-",
                "gpu": e.gpu_uuid or "-", "mig": e.mig_uuid or "-", "url": e.url or "-"}
               for p in fleet.pools for e in p.engines]
    if engines:
        print()
        print_table(engines, ["engine", "pool", "hardware", "variant", "gpu", "mig", "url"])
    if fleet.gpus:
        print()
        print_table([{
            "gpu": g.uuid, "node": g.node or "-", "model": g.hardware or common_pb2.GpuModel.Name(g.model).removeprefix("GPU_MODEL_"),
            "pool": g.pool or "-", "mig": ("on: " + ",".join(i.profile for i in g.instances)) if g.mig_enabled else "off",
            "reported by": g.reported_by or "-"} for g in fleet.gpus],
            ["gpu", "node", "model", "pool", "mig", "reported by"])
    if fleet.max_cache_storage_bytes:
        print(f"fleet cache storage limit: {_size(fleet.max_cache_storage_bytes)}")


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="the fleet inventory the optimizer plans over")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    set_ = sub.add_parser("set", help="declare the fleet from a YAML or JSON file")
    set_.add_argument("file", type=Path, metavar="FILE", help="FleetInventory in YAML or JSON (snake_case keys)")
    set_.add_argument("--json", action="store_true", help="print the merged fleet as one JSON object")
    show = sub.add_parser("show", help="the fleet in force (declared + GPUs the gpu-partitioners report)")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    for remote in (set_, show):
        optimizer_client.add_optimizer_flags(remote)
    return parser


def _as_dict(fleet: Any) -> dict[str, Any]:
    return MessageToDict(fleet, preserving_proto_field_name=True)


def cmd_set(ns: argparse.Namespace) -> int:
    from greenserve.v1 import optimizer_pb2

    try:
        fleet = load_fleet_file(ns.file)
    except FleetFileError as exc:
        return optimizer_client.fail(f"{PROG} set", f"{ns.file}: {exc}")
    except OSError as exc:
        return optimizer_client.fail(f"{PROG} set", cannot_read(exc, ns.file))
    except UnicodeDecodeError as exc:
        return optimizer_client.fail(f"{PROG} set", f"{Path(ns.file).absolute()}: not UTF-8 text: {exc}")
    try:
        reply = asyncio.run(optimizer_client.call(ns, "SetFleet", optimizer_pb2.SetFleetRequest(fleet=fleet)))
    except grpc.aio.AioRpcError as exc:
        return optimizer_client.rpc_error(f"{PROG} set", exc, ns)
    merged = reply.fleet  # type: ignore[attr-defined]
    if ns.json:
        print(strict_json.dumps({"fleet": _as_dict(merged)}))
    else:
        n_engines = sum(len(p.engines) for p in merged.pools)
        print(f"fleet set: {len(merged.pools)} pools, {n_engines} engines, {len(merged.gpus)} GPUs")
    return 0


def cmd_show(ns: argparse.Namespace) -> int:
    from greenserve.v1 import optimizer_pb2

    try:
        reply = asyncio.run(optimizer_client.call(ns, "GetFleet", optimizer_pb2.GetFleetRequest()))
    except grpc.aio.AioRpcError as exc:
        return optimizer_client.rpc_error(f"{PROG} show", exc, ns)
    updated = reply.updated_at.ToJsonString() if reply.HasField("updated_at") else ""  # type: ignore[attr-defined]
    if ns.json:
        print(strict_json.dumps({"fleet": _as_dict(reply.fleet), "updated_at": updated or None}))  # type: ignore[attr-defined]
    else:
        print_fleet(reply.fleet, updated)  # type: ignore[attr-defined]
    return 0


def main(argv: list[str]) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    optimizer_client.check_timeout(parser, ns)
    return cmd_set(ns) if ns.action == "set" else cmd_show(ns)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
