"""`greenserve mig ...`: MIG layouts.

    greenserve mig layouts --gpu MODEL [--profiles P,P,...] [--driver R] [--json]
        every maximal valid layout of MODEL (A100-40GB, A100-80GB, H100-80GB, H200-141GB) using only the
        listed profiles (default: all); the last line with --json is
        {"gpu": MODEL, "layouts": [[{"profile": "3g.20gb", "start": 4, "size": 4}, ...], ...]}
        with start and size in memory slices, as NVML places GPU instances.
    greenserve mig diff --gpu MODEL --from LAYOUT --to LAYOUT [--json]
        the minimal destroy/create steps (computed locally, no service needed).
    greenserve mig show [--json]
        GPUs, MIG instances, UUIDs and attached engines, from the gpu-partitioner.
    greenserve mig apply --gpu-uuid UUID --layout LAYOUT [--dry-run] [--json]
        apply a layout through the gpu-partitioner (drain, destroy, create, verify, undrain).

LAYOUT: "3g.20gb@4,2g.10gb@0,1g.5gb@2" (PROFILE@START; an item without @START is placed by the planner),
a JSON list like one layout of `mig layouts --json`, or "empty". The first two commands run without any
service; show and apply talk to the gpu-partitioner over gRPC.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import grpc
from greenserve.common.cli_parser import Parser
from greenserve.common.config import DependencyAddresses
from greenserve.common.mig_geometry import instance_engine_ids
from greenserve.common import mig_geometry as geometry_mod
from greenserve.gpu_partitioner import layout_diff
from greenserve.common.mig_geometry import CURRENT_DRIVER, LayoutError

from greenserve_client import rpc_errors
from greenserve_client.cli import _add_connection_flags, _channel_config, print_table

MODELS = geometry_mod.MODEL_NAMES


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="greenserve mig", description="MIG layouts: enumerate, diff, show and apply")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    layouts = sub.add_parser("layouts", help="list every maximal valid layout of a GPU model")
    layouts.add_argument("--gpu", required=True, metavar="MODEL", help=f"one of {', '.join(MODELS)}")
    layouts.add_argument("--profiles", help="comma-separated profiles allowed (default: all of the model)")
    layouts.add_argument("--driver", type=int, default=0, metavar="R",
                         help="driver branch whose rules apply, e.g. 470 (default: current; R510+ allows 4g+3g)")
    layouts.add_argument("--json", action="store_true", help="print one JSON object")

    diff = sub.add_parser("diff", help="minimal destroy/create steps from one layout to another")
    diff.add_argument("--gpu", required=True, metavar="MODEL", help=f"one of {', '.join(MODELS)}")
    diff.add_argument("--from", dest="from_layout", required=True, metavar="LAYOUT", help="current layout")
    diff.add_argument("--to", dest="to_layout", required=True, metavar="LAYOUT", help="target layout")
    diff.add_argument("--json", action="store_true", help="print one JSON object")

    show = sub.add_parser("show", help="GPUs and MIG instances from the gpu-partitioner")
    show.add_argument("--json", action="store_true", help="print one JSON object")

    apply = sub.add_parser("apply", help="apply a layout through the gpu-partitioner")
    apply.add_argument("--gpu-uuid", required=True, help="GPU to change (see `greenserve mig show`)")
    apply.add_argument("--layout", required=True, metavar="LAYOUT", help="target layout")
    apply.add_argument("--dry-run", action="store_true", help="print the steps only")
    apply.add_argument("--plan-version", type=int, default=0, help="plan version the layout comes from (0: manual)")
    apply.add_argument("--drain-timeout-s", type=float, default=0.0, help="longest wait for draining (default 120)")
    apply.add_argument("--json", action="store_true", help="print one JSON object")

    for remote in (show, apply):
        remote.add_argument("--gpu-partitioner-addr",
                            help="host:port (default env GREENSERVE_GPU_PARTITIONER_ADDR or 127.0.0.1:50055)")
        _add_connection_flags(remote)
    return parser


def _geometry(parser: argparse.ArgumentParser, model: str) -> geometry_mod.GpuGeometry:
    if model not in MODELS:
        parser.error(f"--gpu must be one of {', '.join(MODELS)}, got {model!r}")
    return geometry_mod.geometry(model)


def _fail(message: str) -> int:
    print(f"greenserve mig: error: {message}", file=sys.stderr)
    return 2


def cmd_layouts(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> int:
    geo = _geometry(parser, ns.gpu)
    profiles = None
    if ns.profiles is not None:
        profiles = [p.strip() for p in ns.profiles.split(",") if p.strip()]
        unknown = [p for p in profiles if not geo.has_profile(p)]
        if unknown or not profiles:
            return _fail(f"--profiles: {ns.gpu} has no MIG profile {', '.join(unknown) or '(none given)'}; "
                         f"known: {', '.join(p.name for p in geo.profiles)}")
    if ns.driver < 0:
        return _fail("--driver must be a driver branch like 470 or 550")
    layouts = geo.maximal_layouts(profiles, driver=ns.driver or CURRENT_DRIVER)
    if ns.json:
        print(json.dumps({"gpu": ns.gpu, "layouts": [[p.to_json() for p in layout] for layout in layouts]}))
        return 0
    rows = [{"#": str(i), "layout": "  ".join(str(p) for p in layout),
             "compute": f"{sum(geo.profile(p.profile).compute_slices for p in layout)}/{geo.compute_slices}",
             "memory": f"{sum(p.size for p in layout)}/{geo.memory_slices}"}
            for i, layout in enumerate(layouts, 1)]
    print_table(rows, ["#", "layout", "compute", "memory"])
    print(f"{len(layouts)} maximal layouts of {ns.gpu} (PROFILE@START:SIZE in memory slices)")
    return 0


def cmd_diff(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> int:
    geo = _geometry(parser, ns.gpu)
    try:
        current, unplaced = geometry_mod.parse_layout(geo, ns.from_layout)
        if unplaced:
            return _fail(f"--from: give every instance a placement (PROFILE@START); missing for {', '.join(unplaced)}")
        try:
            geo.validate(current)
        except LayoutError as exc:
            return _fail(f"--from: {exc}")
        placed, unplaced = geometry_mod.parse_layout(geo, ns.to_layout)
        try:
            target = layout_diff.resolve_target(geo, placed, unplaced, current)
        except LayoutError as exc:
            return _fail(f"--to: {exc}")
    except LayoutError as exc:
        return _fail(str(exc))
    result = layout_diff.plan(geo, current, target)
    if ns.json:
        print(json.dumps({"gpu": ns.gpu, "steps": [s.to_json() for s in result.steps],
                          "kept": [p.to_json() for p in result.kept], "target": [p.to_json() for p in result.target]}))
        return 0
    for i, step in enumerate(result.steps, 1):
        print(f"{i:2d}. {step}")
    print(f"kept running: {', '.join(map(str, result.kept)) or 'none'}")
    return 0


def _address(ns: argparse.Namespace) -> str:
    return ns.gpu_partitioner_addr or DependencyAddresses().gpu_partitioner_addr


async def _call(ns: argparse.Namespace, method: str, request: object) -> object:
    from greenserve.common.client import create_channel
    from greenserve.v1 import gpu_partitioner_pb2_grpc

    channel = create_channel(_channel_config(ns, _address(ns)))
    try:
        stub = gpu_partitioner_pb2_grpc.GpuPartitionerServiceStub(channel)
        return await getattr(stub, method)(request)
    finally:
        await channel.close()


def _rpc_error(exc: grpc.aio.AioRpcError, ns: argparse.Namespace) -> int:
    return rpc_errors.report(f"greenserve mig {ns.action}", exc, "gpu-partitioner", _address(ns),
                             "--gpu-partitioner-addr")


def cmd_show(ns: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict
    from greenserve.v1 import common_pb2, gpu_partitioner_pb2

    try:
        reply = asyncio.run(_call(ns, "GetInventory", gpu_partitioner_pb2.GetInventoryRequest()))
    except grpc.aio.AioRpcError as exc:
        return _rpc_error(exc, ns)
    assert isinstance(reply, gpu_partitioner_pb2.GetInventoryResponse)
    if ns.json:
        print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True)))
        return 0
    print(f"backend: {gpu_partitioner_pb2.NvmlBackend.Name(reply.backend)}  driver: {reply.driver_version or '-'}")
    rows = []
    for gpu in reply.gpus:
        rows.append({"gpu": f"{gpu.index}: {gpu.uuid}", "model": common_pb2.GpuModel.Name(gpu.model).removeprefix("GPU_MODEL_"),
                     "mig": "on" if gpu.mig_enabled else "off", "instance": "", "engine": "", "k8s resource": ""})
        for inst in gpu.instances:
            rows.append({"gpu": "", "model": "", "mig": "",
                         "instance": f"{inst.profile}@{inst.placement_start}:{inst.placement_size} {inst.uuid}",
                         "engine": ",".join(instance_engine_ids(inst)) or "-",
                         "k8s resource": inst.kubernetes_resource})
    print_table(rows, ["gpu", "model", "mig", "instance", "engine", "k8s resource"])
    return 0


def cmd_apply(ns: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict
    from greenserve.v1 import common_pb2, gpu_partitioner_pb2

    if not 0 <= ns.drain_timeout_s <= 86400 or ns.plan_version < 0:  # also refuses nan
        return _fail("--drain-timeout-s must be in [0, 86400] and --plan-version >= 0")
    try:
        inventory = asyncio.run(_call(ns, "GetInventory", gpu_partitioner_pb2.GetInventoryRequest()))
        assert isinstance(inventory, gpu_partitioner_pb2.GetInventoryResponse)
        gpu = next((g for g in inventory.gpus if g.uuid == ns.gpu_uuid), None)
        if gpu is None:
            return _fail(f"--gpu-uuid: the gpu-partitioner has no GPU {ns.gpu_uuid!r}")
        model = {common_pb2.GPU_MODEL_A100_40GB: "A100-40GB", common_pb2.GPU_MODEL_A100_80GB: "A100-80GB",
                 common_pb2.GPU_MODEL_H100_80GB: "H100-80GB", common_pb2.GPU_MODEL_H200_141GB: "H200-141GB"}.get(gpu.model)
        if model is None:
            return _fail(f"GPU {ns.gpu_uuid} has no MIG geometry this client knows")
        geo = geometry_mod.geometry(model)
        try:
            placed, unplaced = geometry_mod.parse_layout(geo, ns.layout)
        except LayoutError as exc:
            return _fail(f"--layout: {exc}")
        layout = common_pb2.MigLayout(gpu_uuid=ns.gpu_uuid, placements=[
            *(common_pb2.MigPlacement(profile=p.profile, start=p.start, size=p.size) for p in placed),
            *(common_pb2.MigPlacement(profile=name, start=0, size=0) for name in unplaced),
        ])
        request = gpu_partitioner_pb2.ApplyLayoutRequest(layout=layout, plan_version=ns.plan_version, dry_run=ns.dry_run,
                                                         drain_timeout_s=ns.drain_timeout_s)
        reply = asyncio.run(_call(ns, "ApplyLayout", request))
    except grpc.aio.AioRpcError as exc:
        return _rpc_error(exc, ns)
    assert isinstance(reply, gpu_partitioner_pb2.ApplyLayoutResponse)
    record = reply.record
    if ns.json:
        print(json.dumps(MessageToDict(record, preserving_proto_field_name=True)))
    else:
        state = gpu_partitioner_pb2.ApplyState.Name(record.state).removeprefix("APPLY_STATE_")
        print(f"apply {record.apply_id or '(dry run)'}: {state}{' - ' + record.error if record.error else ''}")
        for i, step in enumerate(record.steps, 1):
            kind = gpu_partitioner_pb2.LayoutStepKind.Name(step.kind).removeprefix("LAYOUT_STEP_KIND_").lower()
            where = f" {step.placement.profile}@{step.placement.start}:{step.placement.size}" if step.placement.profile else ""
            print(f"{i:2d}. {kind}{where}")
        for inst in record.instances:
            print(f"CUDA_VISIBLE_DEVICES={inst.uuid}  # {inst.profile}@{inst.placement_start}:{inst.placement_size}")
    ok = record.state in (gpu_partitioner_pb2.APPLY_STATE_SUCCEEDED, gpu_partitioner_pb2.APPLY_STATE_PENDING)
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    if ns.action == "layouts":
        return cmd_layouts(parser, ns)
    if ns.action == "diff":
        return cmd_diff(parser, ns)
    if not 0 < getattr(ns, "timeout_s", 1.0) <= 86400:  # also refuses nan
        parser.error(f"--timeout-s must be in (0, 86400] seconds, got {ns.timeout_s}")
    if ns.action == "show":
        return cmd_show(ns)
    return cmd_apply(ns)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
