"""Issue 35: the engines the gpu-partitioner runs on MIG instances showed no URL in `greenserve fleet show`
(`greenserve up`'s two emulators listen on 8100 and 8101): the node's report carried their ids only, so the
optimizer's fleet made engines without a URL. The report now carries each engine's URL as the router knows it."""

from __future__ import annotations

from typing import Any

import pytest
from greenserve.common.client import ChannelConfig, create_channel
from greenserve.common.errors import InvalidArgument
from greenserve.gpu_partitioner.service import GpuPartitionerSettings, build
from greenserve.optimizer.fleet import merge_fleet, validate_gpu_report
from greenserve.v1 import common_pb2, gpu_partitioner_pb2, gpu_partitioner_pb2_grpc, optimizer_pb2
from greenserve_client.commands.fleet import print_fleet

from tests.gpu_partitioner.conftest import RunningRouter


async def test_mig_engines_reach_the_fleet_with_their_urls(start_inprocess: Any, router: RunningRouter,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    svc = await start_inprocess(GpuPartitionerSettings, build, backend="simulated", sim_gpus="A100-40GB",
                                router_addr=router.address, energy_sample_interval_s=0, follow_plans=False)
    channel = create_channel(ChannelConfig(address=svc.address))
    stub = gpu_partitioner_pb2_grpc.GpuPartitionerServiceStub(channel)
    try:
        gpu = (await stub.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())).gpus[0].uuid
        applied = await stub.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(layout=common_pb2.MigLayout(
            gpu_uuid=gpu, placements=[common_pb2.MigPlacement(profile="3g.20gb", start=0, size=4),
                                      common_pb2.MigPlacement(profile="3g.20gb", start=4, size=4)])))
        assert applied.record.state == gpu_partitioner_pb2.APPLY_STATE_SUCCEEDED, applied.record.error
        first, second = (i.uuid for i in applied.record.instances)
        router.state.engines.update({"vm-a": first, "vm-b": second, "vm-c": second})
        router.state.urls.update({"vm-a": "http://127.0.0.1:8100", "vm-b": "http://127.0.0.1:8101"})  # vm-c: none
        (reported,) = (await stub.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())).gpus
    finally:
        await channel.close()
    urls = {i.uuid: dict(i.engine_urls) for i in reported.instances}
    assert urls == {first: {"vm-a": "http://127.0.0.1:8100"}, second: {"vm-b": "http://127.0.0.1:8101"}}

    reported.pool = "default"
    report = optimizer_pb2.ReportGpusRequest(node=reported.node, gpus=[reported])
    validate_gpu_report(report)
    merged = merge_fleet(common_pb2.FleetInventory(pools=[common_pb2.Pool(name="default", model="m")]),
                         {reported.node: report})
    assert {e.id: e.url for e in merged.pools[0].engines} == {
        "vm-a": "http://127.0.0.1:8100", "vm-b": "http://127.0.0.1:8101", "vm-c": ""}
    print_fleet(merged)
    rows = {line.split()[0]: line.split()[-1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("vm-")}
    assert rows == {"vm-a": "http://127.0.0.1:8100", "vm-b": "http://127.0.0.1:8101", "vm-c": "-"}


def test_a_reported_engine_url_is_checked() -> None:
    def report(urls: dict[str, str]) -> optimizer_pb2.ReportGpusRequest:
        gpu = common_pb2.Gpu(uuid="GPU-1", model=common_pb2.GPU_MODEL_A100_40GB, instances=[common_pb2.MigInstance(
            uuid="MIG-1", profile="3g.20gb", placement_size=4, engine_ids=["e1"], engine_id="e1", engine_urls=urls)])
        return optimizer_pb2.ReportGpusRequest(node="n1", gpus=[gpu])

    validate_gpu_report(report({"e1": "http://10.0.0.5:8100"}))
    with pytest.raises(InvalidArgument, match=r"engine_urls\[e1\]"):
        validate_gpu_report(report({"e1": "not a url"}))
    with pytest.raises(InvalidArgument, match="not an engine of the instance"):
        validate_gpu_report(report({"e2": "http://10.0.0.5:8100"}))
