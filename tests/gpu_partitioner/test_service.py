"""GpuPartitionerService over real gRPC with the simulated backend and an in-test router; CLI included."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from greenserve.common.client import ChannelConfig, create_channel
from greenserve.gpu_partitioner.service import GpuPartitionerSettings, build
from greenserve.v1 import common_pb2, gpu_partitioner_pb2, gpu_partitioner_pb2_grpc
from greenserve_client.commands import mig as mig_cli

from tests.gpu_partitioner.conftest import RunningRouter

A100 = common_pb2.GPU_MODEL_A100_40GB


def P(profile: str, start: int = 0, size: int = 0) -> common_pb2.MigPlacement:
    return common_pb2.MigPlacement(profile=profile, start=start, size=size)


async def _start(start_inprocess: Any, router: RunningRouter, **extra: Any) -> tuple[Any, gpu_partitioner_pb2_grpc.GpuPartitionerServiceStub, grpc.aio.Channel]:
    svc = await start_inprocess(GpuPartitionerSettings, build, backend="simulated", sim_gpus="A100-40GB,H100-80GB:nomig",
                                router_addr=router.address, energy_sample_interval_s=0,
                                **{"follow_plans": False, **extra})  # no optimizer here (test_follow.py has one)
    channel = create_channel(ChannelConfig(address=svc.address))
    return svc, gpu_partitioner_pb2_grpc.GpuPartitionerServiceStub(channel), channel


async def _invalid(call: Any) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.value.details()
    return exc.value.details() or ""


async def test_inventory_layouts_diff_apply_energy_over_grpc(start_inprocess: Any, router: RunningRouter) -> None:
    _svc, stub, channel = await _start(start_inprocess, router)
    try:
        inv = await stub.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())
        assert inv.backend == gpu_partitioner_pb2.NVML_BACKEND_SIMULATED
        assert [(g.model, g.mig_enabled) for g in inv.gpus] == [(A100, True), (common_pb2.GPU_MODEL_H100_80GB, False)]
        gpu = inv.gpus[0].uuid

        layouts = await stub.ListLayouts(gpu_partitioner_pb2.ListLayoutsRequest(
            gpu_model=A100, profiles=["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]))
        assert len(layouts.layouts) == 19
        pre = await stub.ListLayouts(gpu_partitioner_pb2.ListLayoutsRequest(
            gpu_model=A100, profiles=["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"], driver_branch=470))
        assert len(pre.layouts) == 18

        diff = await stub.DiffLayouts(gpu_partitioner_pb2.DiffLayoutsRequest(**{
            "gpu_model": A100, "from": common_pb2.MigLayout(placements=[P("4g.20gb", 0, 4), P("3g.20gb", 4, 4)]),
            "to": common_pb2.MigLayout(placements=[P("3g.20gb"), P("2g.10gb"), P("2g.10gb")])}))
        assert [p.profile for p in diff.kept] == ["3g.20gb"]
        assert [s.kind for s in diff.steps] == [gpu_partitioner_pb2.LAYOUT_STEP_KIND_DESTROY] + [gpu_partitioner_pb2.LAYOUT_STEP_KIND_CREATE] * 2

        # apply CLOVER config 8 (2g, 2g, 3g), then config 9 keeping the 3g; the router drains engines
        first = await stub.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(
            layout=common_pb2.MigLayout(gpu_uuid=gpu, placements=[P("2g.10gb", 0, 2), P("2g.10gb", 2, 2), P("3g.20gb", 4, 4)])))
        assert first.record.state == gpu_partitioner_pb2.APPLY_STATE_SUCCEEDED, first.record.error
        by_start = {i.placement_start: i.uuid for i in first.record.instances}
        router.state.engines.update({"e-left": by_start[2], "e-3g": by_start[4]})
        second = await stub.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(
            layout=common_pb2.MigLayout(gpu_uuid=gpu, placements=[P("2g.10gb", 0, 2), P("1g.5gb"), P("1g.5gb"), P("3g.20gb", 4, 4)]),
            plan_version=3))
        assert second.record.state == gpu_partitioner_pb2.APPLY_STATE_SUCCEEDED, second.record.error
        assert second.record.done_steps == 3
        assert router.state.calls == [("drain", ("e-left",)), ("undrain", ("e-left",))]
        got = await stub.GetApply(gpu_partitioner_pb2.GetApplyRequest(apply_id=second.record.apply_id))
        assert got.record.state == gpu_partitioner_pb2.APPLY_STATE_SUCCEEDED

        inv = await stub.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())
        insts = {i.placement_start: i for i in inv.gpus[0].instances}
        assert insts[4].uuid == by_start[4] and insts[4].engine_id == "e-3g"
        assert insts[4].kubernetes_resource == "nvidia.com/mig-3g.20gb"
        assert sorted(insts) == [0, 2, 3, 4]

        energy = await stub.GetEnergy(gpu_partitioner_pb2.GetEnergyRequest(gpu_uuids=[gpu]))
        energy = await stub.GetEnergy(gpu_partitioner_pb2.GetEnergyRequest(gpu_uuids=[gpu]))
        g = energy.gpus[0]
        assert g.power_w > 0 and g.split_rule
        assert sum(i.power_w for i in g.instances) + g.unallocated_power_w == pytest.approx(g.power_w)
        assert {i.mig_uuid for i in g.instances} == {i.uuid for i in inv.gpus[0].instances}

        # bad input names the field and changes nothing
        assert "gpu_model" in await _invalid(stub.ListLayouts(gpu_partitioner_pb2.ListLayoutsRequest()))
        assert "profiles[1]" in await _invalid(stub.ListLayouts(gpu_partitioner_pb2.ListLayoutsRequest(gpu_model=A100, profiles=["1g.5gb", "5g.1gb"])))
        assert "layout.gpu_uuid" in await _invalid(stub.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest()))
        detail = await _invalid(stub.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(
            layout=common_pb2.MigLayout(gpu_uuid=gpu, placements=[P("4g.20gb", 0, 4), P("3g.20gb", 1, 4)]))))
        assert "layout.placements[1]" in detail
        assert "to.placements[0]" in await _invalid(stub.DiffLayouts(gpu_partitioner_pb2.DiffLayoutsRequest(
            gpu_model=A100, to=common_pb2.MigLayout(placements=[P("7g.40gb", 1, 8)]))))
        with pytest.raises(grpc.aio.AioRpcError) as nf:
            await stub.GetApply(gpu_partitioner_pb2.GetApplyRequest(apply_id="nope"))
        assert nf.value.code() == grpc.StatusCode.NOT_FOUND
        # H100 with MIG off: enabling needs no reset, so the apply enables MIG, then creates
        h100 = await stub.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(
            layout=common_pb2.MigLayout(gpu_uuid=inv.gpus[1].uuid, placements=[P("7g.80gb", 0, 8)])))
        assert h100.record.state == gpu_partitioner_pb2.APPLY_STATE_SUCCEEDED, h100.record.error
        assert h100.record.steps[0].kind == gpu_partitioner_pb2.LAYOUT_STEP_KIND_ENABLE_MIG
        with pytest.raises(grpc.aio.AioRpcError) as nf:
            await stub.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(
                layout=common_pb2.MigLayout(gpu_uuid="GPU-unknown", placements=[P("7g.80gb", 0, 8)])))
        assert nf.value.code() == grpc.StatusCode.NOT_FOUND
        after = await stub.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())
        assert [i.uuid for i in after.gpus[0].instances] == [i.uuid for i in inv.gpus[0].instances]
    finally:
        await channel.close()


async def test_an_instance_running_two_engines_reports_both(start_inprocess: Any, router: RunningRouter,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # GetInventory joined the router's engines on one instance into engine_id ("e-3g,e-3g/decode"): readers took
    # it for one engine, so the optimizer's merged fleet held an engine "e-3g,e-3g/decode" that exists nowhere.
    # Now engine_ids lists them and engine_id holds the first (for readers from before engine_ids).
    import asyncio

    from greenserve.optimizer.fleet import merge_fleet, validate_gpu_report
    from greenserve.v1 import optimizer_pb2

    svc, stub, channel = await _start(start_inprocess, router)
    try:
        gpu = (await stub.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())).gpus[0].uuid
        applied = await stub.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(
            layout=common_pb2.MigLayout(gpu_uuid=gpu, placements=[P("3g.20gb", 4, 4)])))
        assert applied.record.state == gpu_partitioner_pb2.APPLY_STATE_SUCCEEDED, applied.record.error
        mig = applied.record.instances[0].uuid
        router.state.engines.update({"e-3g": mig, "e-3g/decode": mig})
        inv = await stub.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())
    finally:
        await channel.close()
    inst = inv.gpus[0].instances[0]
    assert list(inst.engine_ids) == ["e-3g", "e-3g/decode"] and inst.engine_id == "e-3g"

    # What the optimizer makes of the node's report: two engines of the GPU's pool on that instance.
    reported = common_pb2.Gpu()
    reported.CopyFrom(inv.gpus[0])
    reported.pool = "chat"
    report = optimizer_pb2.ReportGpusRequest(node=reported.node, gpus=[reported])
    validate_gpu_report(report)
    merged = merge_fleet(common_pb2.FleetInventory(pools=[common_pb2.Pool(name="chat", model="m")]),
                         {reported.node: report})
    assert [(e.id, e.mig_uuid) for e in merged.pools[0].engines] == [("e-3g", mig), ("e-3g/decode", mig)]

    assert await asyncio.to_thread(mig_cli.main, ["show", "--gpu-partitioner-addr", svc.address]) == 0
    assert "e-3g,e-3g/decode" in capsys.readouterr().out


async def test_simulated_gpus_survive_a_restart(start_inprocess: Any, router: RunningRouter, tmp_path: Any) -> None:
    db_url = f"sqlite:///{tmp_path / 'gp.db'}"
    svc, stub, channel = await _start(start_inprocess, router, db_url=db_url)
    gpu = (await stub.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())).gpus[0].uuid
    rec = await stub.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(
        layout=common_pb2.MigLayout(gpu_uuid=gpu, placements=[P("7g.40gb", 0, 8)])))
    await channel.close()
    await svc.server.stop(0)
    _svc2, stub2, channel2 = await _start(start_inprocess, router, db_url=db_url)
    try:
        inv = await stub2.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())
        assert inv.gpus[0].uuid == gpu
        assert [i.uuid for i in inv.gpus[0].instances] == [rec.record.instances[0].uuid]
    finally:
        await channel2.close()


async def test_mig_parted_conversion(start_inprocess: Any, router: RunningRouter) -> None:
    _svc, stub, channel = await _start(start_inprocess, router)
    try:
        text = """
version: v1
mig-configs:
  all-balanced:
    - device-filter: ["0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    - device-filter: ["0x20B210DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 2}
  custom:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3c.3g.20gb": 2}
"""
        reply = await stub.ConvertMigPartedConfig(gpu_partitioner_pb2.ConvertMigPartedConfigRequest(yaml=text, gpu_model=A100))
        configs = {c.name: c for c in reply.configs}
        balanced = configs["all-balanced"].layouts
        assert len(balanced) == 1 and balanced[0].gpu_uuid == ""  # the 80GB entry is filtered out
        assert sorted((p.profile, p.start) for p in balanced[0].placements) == [
            ("1g.5gb", 0), ("1g.5gb", 1), ("2g.10gb", 2), ("3g.20gb", 4)]
        inv = await stub.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())
        assert configs["custom"].layouts[0].gpu_uuid == inv.gpus[0].uuid
        out = await stub.ConvertMigPartedConfig(gpu_partitioner_pb2.ConvertMigPartedConfigRequest(
            gpu_model=A100, layouts=gpu_partitioner_pb2.NamedLayouts(name="clover-9", layouts=[balanced[0]])))
        back = await stub.ConvertMigPartedConfig(gpu_partitioner_pb2.ConvertMigPartedConfigRequest(yaml=out.yaml, gpu_model=A100))
        assert [(p.profile, p.start) for p in back.configs[0].layouts[0].placements] == [(p.profile, p.start) for p in balanced[0].placements]
        assert "mig-configs.x[0].mig-enabled" in await _invalid(stub.ConvertMigPartedConfig(
            gpu_partitioner_pb2.ConvertMigPartedConfigRequest(gpu_model=A100, yaml="version: v1\nmig-configs:\n  x:\n    - devices: all\n")))
        assert "unknown key" in await _invalid(stub.ConvertMigPartedConfig(
            gpu_partitioner_pb2.ConvertMigPartedConfigRequest(gpu_model=A100, yaml="version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: false\n      color: red\n")))
        assert "does not fit" in await _invalid(stub.ConvertMigPartedConfig(
            gpu_partitioner_pb2.ConvertMigPartedConfigRequest(gpu_model=A100, yaml="version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {'4g.20gb': 2}\n")))
    finally:
        await channel.close()


def test_cli_layouts_and_diff(capsys: pytest.CaptureFixture[str]) -> None:
    assert mig_cli.main(["layouts", "--gpu", "A100-40GB", "--profiles", "1g.5gb,2g.10gb,3g.20gb,4g.20gb,7g.40gb", "--json"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    doc = json.loads(last)
    assert doc["gpu"] == "A100-40GB" and len(doc["layouts"]) == 19
    assert doc["layouts"][1] == [{"profile": "4g.20gb", "start": 0, "size": 4}, {"profile": "3g.20gb", "start": 4, "size": 4}]
    assert mig_cli.main(["diff", "--gpu", "A100-40GB", "--from", "7g.40gb@0", "--to", "3g.20gb@4,4g.20gb@0", "--json"]) == 0
    diff = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [s["kind"] for s in diff["steps"]] == ["destroy", "create", "create"]
    assert mig_cli.main(["layouts", "--gpu", "A100-40GB", "--profiles", "3g.40gb"]) == 2
    assert "3g.40gb" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        mig_cli.main(["layouts", "--gpu", "V100"])
    assert exc.value.code == 2


async def test_cli_show_and_apply(start_inprocess: Any, router: RunningRouter, capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    svc, _stub, channel = await _start(start_inprocess, router)
    await channel.close()
    addr = ["--gpu-partitioner-addr", svc.address]
    assert await asyncio.to_thread(mig_cli.main, ["show", "--json", *addr]) == 0
    inv = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    gpu = inv["gpus"][0]["uuid"]
    assert inv["backend"] == "NVML_BACKEND_SIMULATED"
    assert await asyncio.to_thread(mig_cli.main, ["apply", "--gpu-uuid", gpu, "--layout", "3g.20gb,3g.20gb", *addr]) == 0
    out = capsys.readouterr().out
    assert "SUCCEEDED" in out and out.count("CUDA_VISIBLE_DEVICES=MIG-") == 2
    assert await asyncio.to_thread(mig_cli.main, ["apply", "--gpu-uuid", gpu, "--layout", "7g.40gb@0", "--dry-run", *addr]) == 0
    assert "destroy 3g.20gb@4:4" in capsys.readouterr().out
    assert await asyncio.to_thread(mig_cli.main, ["apply", "--gpu-uuid", gpu, "--layout", "3g.20gb@2", *addr]) == 2
