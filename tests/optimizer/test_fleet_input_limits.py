"""What an outside caller can make the optimizer's fleet inputs cost: declarations and reports at their limits.

Found by an adversarial audit of SetFleet / ReportGpus (each test failed on the code before its fix)."""

from __future__ import annotations

import time

import grpc
import pytest
from greenserve.optimizer import fleet as fleet_module
from greenserve.optimizer.fleet import validate_fleet
from greenserve.v1 import common_pb2, optimizer_pb2

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
