"""Issue 21, defect 3, end to end with the real router and gpu-partitioner (simulated MIG backend):

* after a router restart, an ApplyLayout still drains the engine on the slice it destroys (the router
  stored the engine's MIG UUID; it used to forget it, and the live engine's slice was destroyed undrained);
* an engine the router knows on a slice to destroy that is not drained (here: registered while the apply
  waited for the drain) makes the apply refuse with FAILED_PRECONDITION naming it, with nothing destroyed.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from greenserve.gpu_partitioner.service import GpuPartitionerSettings
from greenserve.gpu_partitioner.service import build as build_partitioner
from greenserve.router.front.service import RouterSettings
from greenserve.router.front.service import build as build_router
from greenserve.simulator.emulator import EmulatorConfig, EngineEmulator
from greenserve.v1 import common_pb2, gpu_partitioner_pb2, gpu_partitioner_pb2_grpc, router_pb2, router_pb2_grpc

from tests.conftest import free_port

ROUTER = {"http_port": -1, "watch_plans": False, "feeds": False, "health_interval_s": 0.2,
          "scrape_interval_s": 0.1, "stale_after_s": 1.0, "log_level": "WARNING"}
FIRST = [("2g.10gb", 0, 2), ("2g.10gb", 2, 2), ("3g.20gb", 4, 4)]
SECOND = [("2g.10gb", 0, 2), ("1g.5gb", 2, 1), ("1g.5gb", 3, 1), ("3g.20gb", 4, 4)]


def _layout(gpu: str, placements: list[tuple[str, int, int]]) -> common_pb2.MigLayout:
    return common_pb2.MigLayout(gpu_uuid=gpu, placements=[
        common_pb2.MigPlacement(profile=p, start=s, size=n) for p, s, n in placements])


async def _partitioned(start_inprocess: Any, router_address: str) -> tuple[Any, Any, str, str, grpc.aio.Channel]:
    """A partitioner whose GPU holds FIRST; returns (partitioner, stub, GPU UUID, UUID of the slice at 2, channel)."""
    partitioner = await start_inprocess(GpuPartitionerSettings, build_partitioner, backend="simulated",
                                        sim_gpus="A100-40GB", router_addr=router_address,
                                        energy_sample_interval_s=0)
    channel = grpc.aio.insecure_channel(partitioner.address)
    mig = gpu_partitioner_pb2_grpc.GpuPartitionerServiceStub(channel)
    gpu = (await mig.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())).gpus[0].uuid
    first = await mig.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(layout=_layout(gpu, FIRST)))
    assert first.record.state == gpu_partitioner_pb2.APPLY_STATE_SUCCEEDED, first.record.error
    return partitioner, mig, gpu, {i.placement_start: i.uuid for i in first.record.instances}[2], channel


async def test_apply_after_a_router_restart_still_drains_the_engine(start_inprocess: Any) -> None:
    port = free_port()
    router = await start_inprocess(RouterSettings, build_router, port=port, **ROUTER)
    partitioner, mig, gpu, slice_uuid, p_channel = await _partitioned(start_inprocess, router.address)
    channel = grpc.aio.insecure_channel(router.address)
    try:
        await router_pb2_grpc.RouterServiceStub(channel).RegisterEngine(router_pb2.RegisterEngineRequest(
            engine=common_pb2.Engine(id="e-left", url="http://127.0.0.1:9", pool="default", model="m",
                                     mig_uuid=slice_uuid)))
        await router.server.stop(0)  # the router restarts (same database, same address)
        await start_inprocess(RouterSettings, build_router, port=port, **ROUTER)

        link = partitioner.server.registrations[0].servicer.coordinator.router
        drained: list[tuple[str, ...]] = []
        real_drain = link.drain

        async def spy(engine_ids: Any, timeout_s: float) -> list[str]:
            drained.append(tuple(engine_ids))
            return await real_drain(engine_ids, timeout_s)

        link.drain = spy
        second = await mig.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(layout=_layout(gpu, SECOND),
                                                                              drain_timeout_s=10))
        assert second.record.state == gpu_partitioner_pb2.APPLY_STATE_SUCCEEDED, second.record.error
        assert drained == [("e-left",)], "the restarted router still knew the engine on the destroyed slice"
    finally:
        await channel.close()
        await p_channel.close()


async def test_apply_refuses_to_destroy_a_slice_with_an_undrained_engine(start_inprocess: Any) -> None:
    emu = EngineEmulator(EmulatorConfig(host="127.0.0.1", port=0, time_scale=2.0))
    await emu.start()
    router = await start_inprocess(RouterSettings, build_router, **ROUTER)
    partitioner, mig, gpu, slice_uuid, p_channel = await _partitioned(start_inprocess, router.address)
    channel = grpc.aio.insecure_channel(router.address)
    routers = router_pb2_grpc.RouterServiceStub(channel)
    try:
        await routers.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
            id="e-busy", url=emu.url, pool="default", model=emu.model, mig_uuid=slice_uuid)))
        link = partitioner.server.registrations[0].servicer.coordinator.router
        real_drain = link.drain

        async def drain_while_another_registers(engine_ids: Any, timeout_s: float) -> list[str]:
            busy = await real_drain(engine_ids, timeout_s)
            # a second engine lands on the same slice while the apply drains the first
            await routers.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
                id="e-late", url="http://127.0.0.1:9", pool="default", model="m", mig_uuid=slice_uuid)))
            return busy

        link.drain = drain_while_another_registers
        before = (await mig.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())).gpus[0].instances
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await mig.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(layout=_layout(gpu, SECOND),
                                                                         drain_timeout_s=10))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "e-late" in info.value.details() and slice_uuid in info.value.details()
        after = (await mig.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())).gpus[0].instances
        assert [i.uuid for i in after] == [i.uuid for i in before], "nothing was destroyed"
        # the engine the apply drained takes work again (undrained before the refusal was sent)
        listed = (await routers.ListEngines(router_pb2.ListEnginesRequest())).engines
        states = {s.engine.id: s.engine.state for s in listed}
        assert states["e-busy"] not in (common_pb2.ENGINE_STATE_DRAINED, common_pb2.ENGINE_STATE_DRAINING)
    finally:
        await channel.close()
        await p_channel.close()
        await emu.stop()
