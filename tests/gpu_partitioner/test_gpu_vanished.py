"""A GPU that vanishes between plan and apply (fallen off the bus): the NVML backend over a fake libnvidia-ml
refuses a layout for it with NotFoundError and leaves the other GPUs' instances as they were."""

from __future__ import annotations

import pytest
from greenserve.common.mig_geometry import Placement
from greenserve.gpu_partitioner.backend import NotFoundError

from tests.gpu_partitioner.conftest import Harness


@pytest.mark.parametrize("harness", ["nvml"], indirect=True)
def test_a_layout_for_a_vanished_gpu_is_not_found_and_the_others_are_kept(harness: Harness) -> None:
    b = harness.backend
    a100, _, gone = (g.uuid for g in b.list_gpus())
    kept = b.create_instance(a100, Placement(4, 4, "3g.20gb"))
    # planned against an inventory listing `gone`; the device drops out before the apply
    harness.device.devices = [d for d in harness.device.devices if d.uuid != gone]
    with pytest.raises(NotFoundError):
        b.create_instance(gone, Placement(0, 8, "7g.40gb"))
    with pytest.raises(NotFoundError):
        b.gpu(gone)
    assert gone not in {g.uuid for g in b.list_gpus()}
    assert [(i.uuid, i.profile) for i in b.gpu(a100).instances] == [(kept.uuid, "3g.20gb")]
