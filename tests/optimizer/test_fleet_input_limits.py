"""What an outside caller can make the optimizer's fleet inputs cost: declarations and reports at their limits.

Found by an adversarial audit of SetFleet / ReportGpus (each test failed on the code before its fix)."""

from __future__ import annotations

import time

from greenserve.optimizer.fleet import validate_fleet
from greenserve.v1 import common_pb2

GPUS = 16_384  # a quarter of MAX_GPUS; one SetFleet of this many short UUIDs is ~150 kB


def test_a_fleet_of_many_gpus_is_validated_in_linear_time() -> None:
    # The duplicate-UUID check built a set of all earlier GPUs for every GPU (quadratic): 4,000 GPUs took 6 s,
    # MAX_GPUS (65,536) ~25 min of CPU on a worker thread for one SetFleet request.
    fleet = common_pb2.FleetInventory(gpus=[common_pb2.Gpu(uuid=f"GPU-{i}") for i in range(GPUS)])
    started = time.perf_counter()
    validate_fleet(fleet)
    assert time.perf_counter() - started < 5.0
