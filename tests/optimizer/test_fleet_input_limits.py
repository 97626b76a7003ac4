"""What an outside caller can make the optimizer's fleet inputs cost: declarations and reports at their limits.

Found by an adversarial audit of SetFleet / ReportGpus (each test failed on the code before its fix)."""

from __future__ import annotations

import time

import grpc
import pytest
from greenserve.optimizer import fleet as fleet_module
from greenserve.optimizer.fleet import validate_fleet
from greenserve.v1 import common_pb2, optimizer_pb2

from tests.optimizer.conftest import pool
from tests.optimizer.test_plans import _setup

GPUS = 16_384  # a quarter of MAX_GPUS; one SetFleet of this many short UUIDs is ~150 kB


def test_a_fleet_of_many_gpus_is_validated_in_linear_time() -> None:
    # The duplicate-UUID check built a set of all earlier GPUs for every GPU (quadratic): 4,000 GPUs took 6 s,
    # MAX_GPUS (65,536) ~25 min of CPU on a worker thread for one SetFleet request.
    fleet = common_pb2.FleetInventory(gpus=[common_pb2.Gpu(uuid=f"GPU-{i}") for i in range(GPUS)])
    started = time.perf_counter()
    validate_fleet(fleet)
    assert time.perf_counter() - started < 5.0


async def test_gpu_reports_from_ever_new_nodes_stop_at_the_limit(forecaster, optimizer, monkeypatch) -> None:
    # Every ReportGpus from a node name not seen before added an entry to the in-memory reports (and a row): a
    # caller inventing node names grew the optimizer's memory, and the fleet every plan is computed over, without
    # bound. Now a new node past MAX_REPORTING_NODES, or reported GPUs past MAX_GPUS in all, is RESOURCE_EXHAUSTED.
    monkeypatch.setattr(fleet_module, "MAX_REPORTING_NODES", 3, raising=False)
    monkeypatch.setattr(fleet_module, "MAX_GPUS", 4)
    _, stub, _ = await _setup(forecaster, optimizer, schedule_plans=False)

    def report(node: str, gpus: int) -> optimizer_pb2.ReportGpusRequest:
        return optimizer_pb2.ReportGpusRequest(node=node, gpus=[
            common_pb2.Gpu(uuid=f"GPU-{node}-{i}", model=common_pb2.GPU_MODEL_A100_80GB) for i in range(gpus)])

    for node in ("n1", "n2", "n3"):
        await stub.ReportGpus(report(node, 1))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ReportGpus(report("n4", 0))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "node" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:  # 2 + 1 + 1 other GPUs would be 5 > 4
        await stub.ReportGpus(report("n1", 3))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "gpus" in err.value.details()
    # A known node still reports (a changed inventory within the limits).
    fleet = (await stub.ReportGpus(report("n1", 2))).fleet
    assert sorted(g.uuid for g in fleet.gpus) == ["GPU-n1-0", "GPU-n1-1", "GPU-n2-0", "GPU-n3-0"]


def _instance(**kw: object) -> common_pb2.MigInstance:
    return common_pb2.MigInstance(**({"uuid": "MIG-1", "profile": "3g.40gb"} | kw))


BAD_REPORTED = [
    (common_pb2.Gpu(uuid="GPU-x", model=77), "gpus[0].model"),
    (common_pb2.Gpu(uuid="GPU-x", pool="chat pool\n"), "gpus[0].pool"),
    (common_pb2.Gpu(uuid="GPU-x", hardware="../A100"), "gpus[0].hardware"),
    (common_pb2.Gpu(uuid="GPU-x", instances=[_instance(uuid="MIG 1\n")]), "gpus[0].instances[0].uuid"),
    (common_pb2.Gpu(uuid="GPU-x", instances=[_instance(profile="3g.40gb\n")]), "gpus[0].instances[0].profile"),
    (common_pb2.Gpu(uuid="GPU-x", instances=[_instance(engine_id="evil id\n")]), "gpus[0].instances[0].engine_id"),
    (common_pb2.Gpu(uuid="GPU-x", instances=[_instance(engine_id="a,evil id")]), "gpus[0].instances[0].engine_id"),
    (common_pb2.Gpu(uuid="GPU-x", instances=[_instance(engine_ids=["a", "evil id\n"])]),
     "gpus[0].instances[0].engine_ids[1]"),
    (common_pb2.Gpu(uuid="GPU-x", instances=[_instance(engine_ids=["a", "a,b"])]), "gpus[0].instances[0].engine_ids[1]"),
    (common_pb2.Gpu(uuid="GPU-x", instances=[_instance(engine_ids=["a"], engine_id="b")]),
     "gpus[0].instances[0].engine_id"),
    (common_pb2.Gpu(uuid="GPU-x", instances=[_instance(engine_ids=[f"e{k}" for k in range(9)])]),
     "gpus[0].instances[0].engine_ids"),
]


@pytest.mark.parametrize(("gpu", "field"), BAD_REPORTED, ids=[f for _, f in BAD_REPORTED])
async def test_reported_gpus_are_checked_like_declared_ones(forecaster, optimizer, gpu, field) -> None:
    # A report's pool, hardware, MIG instances and their engine ids go into the merged fleet (an instance's engine
    # joins its GPU's pool, named by the reported id), so into every plan; only the node and GPU UUIDs were checked:
    # an engine id with spaces and a newline was stored, listed by GetFleet and given routing weight in plans.
    _, stub, _ = await _setup(forecaster, optimizer, schedule_plans=False)
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(pools=[pool("chat", [])])))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ReportGpus(optimizer_pb2.ReportGpusRequest(node="n1", gpus=[gpu]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith(f"{field}: ")
    assert not (await stub.GetFleet(optimizer_pb2.GetFleetRequest())).fleet.gpus


async def test_a_node_reports_every_engine_of_an_instance(forecaster, optimizer) -> None:
    # An instance may run several engines (a prefiller and its decoder). The gpu-partitioner sent them joined by ','
    # in engine_id, and merge_fleet made one engine "n1-6f0c2d1e,n1-6f0c2d1e/decode" of them, which exists nowhere
    # (and got routing weight). Now each arrives as an engine of the GPU's pool: from engine_ids (engine_id is the
    # first, for old readers), and from an old gpu-partitioner's engine_id, a single id or ids joined by ','.
    _, stub, _ = await _setup(forecaster, optimizer, schedule_plans=False)
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(pools=[pool("chat", [])])))
    gpu = common_pb2.Gpu(uuid="GPU-a", model=common_pb2.GPU_MODEL_A100_80GB, name="NVIDIA A100-SXM4-80GB",
                         mig_enabled=True, pool="chat", instances=[
                             _instance(uuid="MIG-6f0c2d1e-aaaa", engine_id="n1-6f0c2d1e",
                                       engine_ids=["n1-6f0c2d1e", "n1-6f0c2d1e/decode"],
                                       kubernetes_resource="nvidia.com/mig-3g.40gb"),
                             _instance(uuid="MIG-7a1b", profile="1g.10gb+me", placement_start=6)])
    old_sender = common_pb2.Gpu(uuid="GPU-b", model=common_pb2.GPU_MODEL_A100_80GB, mig_enabled=True, pool="chat",
                                instances=[_instance(uuid="MIG-b0", engine_id="n1-b0"),
                                           _instance(uuid="MIG-b4", placement_start=4, engine_id="n1-b4,n1-b4/decode")])
    fleet = (await stub.ReportGpus(optimizer_pb2.ReportGpusRequest(node="n1", gpus=[gpu, old_sender]))).fleet
    assert [g.uuid for g in fleet.gpus] == ["GPU-a", "GPU-b"]
    assert [(e.id, e.mig_uuid) for e in fleet.pools[0].engines] == [
        ("n1-6f0c2d1e", "MIG-6f0c2d1e-aaaa"), ("n1-6f0c2d1e/decode", "MIG-6f0c2d1e-aaaa"),
        ("n1-b0", "MIG-b0"), ("n1-b4", "MIG-b4"), ("n1-b4/decode", "MIG-b4")]
