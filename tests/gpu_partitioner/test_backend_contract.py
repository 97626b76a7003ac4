"""The backend contract: the simulated backend and the NVML backend (over a fake libnvidia-ml) answer alike."""

from __future__ import annotations

import pytest
from greenserve.gpu_partitioner.backend import (
    InsufficientResourcesError,
    InUseError,
    InvalidPlacementError,
    NotFoundError,
    NotSupportedError,
    ResetRequiredError,
)
from greenserve.common.mig_geometry import Placement

from tests.gpu_partitioner.conftest import Harness


def _gpus(h: Harness) -> tuple[str, str, str]:
    gpus = h.backend.list_gpus()
    assert [g.model for g in gpus] == ["A100-40GB", "H100-80GB", "A100-40GB"]
    return gpus[0].uuid, gpus[1].uuid, gpus[2].uuid


def test_inventory_reports_models_and_mig_mode(harness: Harness) -> None:
    gpus = harness.backend.list_gpus()
    assert [(g.index, g.mig_capable, g.mig_enabled, g.mig_pending) for g in gpus] == [
        (0, True, True, False), (1, True, False, False), (2, True, False, False)]
    assert all(g.uuid.startswith("GPU-") and g.instances == [] for g in gpus)
    assert gpus[0].memory_bytes >= 40 * 1024**3


def test_create_and_destroy_with_explicit_placements(harness: Harness) -> None:
    a100, _, _ = _gpus(harness)
    b = harness.backend
    made = [b.create_instance(a100, p) for p in (Placement(4, 4, "3g.20gb"), Placement(0, 2, "2g.10gb"),
                                                  Placement(2, 1, "1g.5gb"), Placement(3, 1, "1g.5gb"))]
    assert all(m.uuid.startswith("MIG-") for m in made) and len({m.uuid for m in made}) == 4
    gpu = b.gpu(a100)
    assert gpu.layout == sorted([Placement(4, 4, "3g.20gb"), Placement(0, 2, "2g.10gb"), Placement(2, 1, "1g.5gb"),
                                 Placement(3, 1, "1g.5gb")])
    assert {i.uuid for i in gpu.instances} == {m.uuid for m in made}
    assert next(i for i in gpu.instances if i.profile == "3g.20gb").memory_bytes == 19968 * 1024**2
    b.destroy_instance(a100, Placement(0, 2, "2g.10gb"))
    assert Placement(0, 2, "2g.10gb") not in b.gpu(a100).layout
    # the freed slices take a GI again
    b.create_instance(a100, Placement(0, 1, "1g.5gb"))
    assert len(b.gpu(a100).instances) == 4


def test_overlap_and_limits_are_insufficient_resources(harness: Harness) -> None:
    a100, _, _ = _gpus(harness)
    b = harness.backend
    b.create_instance(a100, Placement(4, 4, "3g.20gb"))
    with pytest.raises(InsufficientResourcesError):
        b.create_instance(a100, Placement(4, 2, "2g.10gb"))
    with pytest.raises(InsufficientResourcesError):
        b.create_instance(a100, Placement(6, 2, "1g.10gb"))
    b.create_instance(a100, Placement(0, 4, "3g.20gb"))
    with pytest.raises(InsufficientResourcesError):  # a third 3g: count and slices
        b.create_instance(a100, Placement(0, 4, "3g.20gb"))
    assert len(b.gpu(a100).instances) == 2  # failed creates left nothing behind


def test_illegal_start_or_size_is_invalid_argument(harness: Harness) -> None:
    a100, _, _ = _gpus(harness)
    for bad in (Placement(1, 4, "3g.20gb"), Placement(7, 1, "1g.5gb"), Placement(0, 3, "3g.20gb"), Placement(1, 2, "2g.10gb")):
        with pytest.raises(InvalidPlacementError):
            harness.backend.create_instance(a100, bad)
    assert harness.backend.gpu(a100).instances == []


def test_destroy_with_a_process_is_in_use(harness: Harness) -> None:
    a100, _, _ = _gpus(harness)
    inst = harness.backend.create_instance(a100, Placement(0, 8, "7g.40gb"))
    harness.start_process(a100, inst.uuid)
    with pytest.raises(InUseError):
        harness.backend.destroy_instance(a100, Placement(0, 8, "7g.40gb"))
    assert harness.backend.gpu(a100).layout == [Placement(0, 8, "7g.40gb")]


def test_destroy_unknown_instance_is_not_found(harness: Harness) -> None:
    a100, _, _ = _gpus(harness)
    with pytest.raises(NotFoundError):
        harness.backend.destroy_instance(a100, Placement(0, 2, "2g.10gb"))
    with pytest.raises(NotFoundError):
        harness.backend.gpu("GPU-does-not-exist")


def test_mig_off_refuses_instances(harness: Harness) -> None:
    _, _, a100_off = _gpus(harness)
    with pytest.raises(NotSupportedError):
        harness.backend.create_instance(a100_off, Placement(0, 8, "7g.40gb"))


def test_a100_mode_change_waits_for_a_reset(harness: Harness) -> None:
    _, _, a100_off = _gpus(harness)
    with pytest.raises(ResetRequiredError):
        harness.backend.set_mig_mode(a100_off, True)
    gpu = harness.backend.gpu(a100_off)
    assert gpu.mig_pending and not gpu.mig_enabled
    harness.reset(a100_off)
    gpu = harness.backend.gpu(a100_off)
    assert gpu.mig_enabled and not gpu.mig_pending
    harness.backend.create_instance(a100_off, Placement(0, 4, "4g.20gb"))


def test_h100_mode_change_is_immediate_and_disable_needs_no_instances(harness: Harness) -> None:
    _, h100, _ = _gpus(harness)
    harness.backend.set_mig_mode(h100, True)
    assert harness.backend.gpu(h100).mig_enabled
    inst = harness.backend.create_instance(h100, Placement(0, 4, "3g.40gb"))
    assert inst.memory_bytes == 40448 * 1024**2
    with pytest.raises(InUseError):
        harness.backend.set_mig_mode(h100, False)
    harness.backend.destroy_instance(h100, Placement(0, 4, "3g.40gb"))
    harness.backend.set_mig_mode(h100, False)
    assert not harness.backend.gpu(h100).mig_enabled


def test_geometry_and_power(harness: Harness) -> None:
    a100, _, _ = _gpus(harness)
    geo = harness.backend.geometry(a100)
    assert geo.profile("3g.20gb").profile_id == 9 and geo.profile("3g.20gb").memory_slices == 4
    assert geo.profile("1g.10gb").starts == (0, 2, 4, 6)
    reading = harness.backend.read_power(a100)
    assert reading.power_w is not None and reading.power_w > 0
    assert reading.energy_j is not None and reading.energy_j >= 0
