"""Input from outside that the gpu-partitioner must refuse cleanly and without unbounded work or memory (audit):
mig-parted YAML (ConvertMigPartedConfig), ListLayouts' driver branch and profile lists, ApplyLayout's GPU, the
length of a layout."""

from __future__ import annotations

import time

import pytest
from greenserve.common import mig_geometry as geometry
from greenserve.gpu_partitioner import migparted
from greenserve.gpu_partitioner.apply import ApplyCoordinator
from greenserve.gpu_partitioner.backend import NotFoundError
from greenserve.gpu_partitioner.backend_sim import SimulatedBackend
from greenserve.gpu_partitioner.migparted import MigPartedError
from greenserve.v1 import common_pb2, gpu_partitioner_pb2

from tests.gpu_partitioner.test_service import _invalid, _start

A100 = geometry.geometry("A100-40GB")
A100_ENUM = common_pb2.GPU_MODEL_A100_40GB


@pytest.mark.parametrize("text", ["[" * 50_000 + "]" * 50_000, "a: " + "{b: " * 5_000 + "1" + "}" * 5_000],
                         ids=["nested-lists", "nested-mappings"])
def test_deeply_nested_yaml_is_a_clean_refusal(text: str) -> None:
    """A few kB of nested brackets made PyYAML recurse past Python's limit: RecursionError, which
    ConvertMigPartedConfig answered with INTERNAL instead of INVALID_ARGUMENT naming the YAML."""
    with pytest.raises(MigPartedError) as exc:
        migparted.parse(text, A100)
    assert exc.value.path == "yaml"


@pytest.mark.parametrize("text", ["version: " + "1" * 5_000 + "\n",
                                  "version: v1\nmig-configs:\n  x:\n    - devices: [" + "9" * 5_000 + "]\n"
                                  "      mig-enabled: false\n"], ids=["version", "device-index"])
def test_an_integer_too_long_to_convert_is_a_clean_refusal(text: str) -> None:
    """An integer literal of more than 4,300 digits made PyYAML's int() raise ValueError (Python's limit on
    integer string conversion), not a yaml.YAMLError: it escaped parse and the RPC answered INTERNAL."""
    with pytest.raises(MigPartedError) as exc:
        migparted.parse(text, A100)
    assert exc.value.path == "yaml"


def test_a_huge_instance_count_is_refused_at_once() -> None:
    """`mig-devices: {1g.5gb: 1000000}` built a list of a million profile names, searched placements for all of
    them and answered with a message naming each (9 MB); 10^9 took the service's memory. No GPU holds more
    instances than it has memory slices: past that the entry cannot fit, said in a short message."""
    text = ("version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: true\n"
            "      mig-devices: {1g.5gb: 1000000}\n")
    t0 = time.monotonic()
    with pytest.raises(MigPartedError) as exc:
        migparted.parse(text, A100)
    assert time.monotonic() - t0 < 0.5
    assert exc.value.path == "mig-configs.x[0].mig-devices" and "does not fit" in exc.value.message
    assert len(str(exc.value)) < 500


def test_yaml_aliases_cannot_multiply_the_layouts() -> None:
    """Aliases let a few kB of YAML name the same long device list in every entry of every config: 300 configs x
    300 devices were 90,000 layouts (and a few more kB, millions), all built in memory. A file expands to at most
    MAX_ITEMS entries, devices and profile keys in all."""
    devices = ", ".join(str(i) for i in range(300))
    text = (f"version: v1\nmig-configs:\n  c: &e\n    - devices: [{devices}]\n      mig-enabled: true\n"
            "      mig-devices: {7g.40gb: 1}\n") + "".join(f"  c{i}: *e\n" for i in range(300))
    with pytest.raises(MigPartedError) as exc:
        migparted.parse(text, A100)
    assert exc.value.path == "mig-configs" and str(migparted.MAX_ITEMS) in exc.value.message
    # a file within the bound still converts
    small = migparted.parse(text.split("  c0:")[0], A100)
    assert len(small) == 1 and len(small[0].layouts) == 300


def test_list_layouts_cache_stays_bounded_whatever_the_driver_branches_asked() -> None:
    """ListLayouts' driver_branch (any uint32) and profile list (any order) were keys of an unbounded cache of
    enumerated layouts: every distinct request stayed in memory for the life of the service."""
    for driver in range(1, 2_000):
        A100.maximal_layouts(["1g.5gb", "7g.40gb"], driver=driver)
    info = geometry._maximal_layouts_cached.cache_info()
    assert info.maxsize is not None and info.currsize <= info.maxsize <= 1024
    # answers are unchanged by the bound
    assert len(A100.maximal_layouts(["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"], driver=470)) == 18


async def test_applies_to_unknown_gpus_leave_no_state_behind(db) -> None:
    """ApplyCoordinator.apply made a lock for the request's gpu_uuid before looking the GPU up, and kept it: every
    ApplyLayout naming an unknown GPU (NOT_FOUND; the uuid any length up to the message limit) stayed in memory for
    the life of the service, a few MB per request at most."""
    backend = SimulatedBackend(db, [("A100-40GB", True)])
    coordinator = ApplyCoordinator(db, backend, None)
    for i in range(200):
        with pytest.raises(NotFoundError):
            await coordinator.apply(f"GPU-unknown-{i}-" + "x" * 10_000, [], ["7g.40gb"], dry_run=True)
    assert coordinator._locks == {}
    gpu_uuid = backend.list_gpus()[0].uuid
    result = await coordinator.apply(gpu_uuid, [], ["7g.40gb"], dry_run=True)
    assert result.state == "pending" and list(coordinator._locks) == [gpu_uuid]


async def test_a_layout_with_more_placements_than_any_gpu_holds_is_refused_first(start_inprocess, router) -> None:
    """DiffLayouts, ApplyLayout and ConvertMigPartedConfig turned every placement of a request into Python objects
    and searched a placement for each unplaced one on the event loop: a 10 MB request of a million placements held
    the service for about 2.5 s (4 s explicit) and answered with an 8 MB message; a few in parallel starved every
    other call. No GPU holds more GPU instances than it has memory slices (8), so a longer layout is refused at
    once, naming its placements."""
    _svc, stub, channel = await _start(start_inprocess, router)
    many = common_pb2.MigLayout(placements=[common_pb2.MigPlacement(profile="1g.5gb")] * 100_000)
    try:
        detail = await _invalid(stub.DiffLayouts(gpu_partitioner_pb2.DiffLayoutsRequest(
            **{"gpu_model": A100_ENUM, "from": common_pb2.MigLayout(), "to": many})))
        assert detail.startswith("to.placements") and "at most 8" in detail
        inv = await stub.GetInventory(gpu_partitioner_pb2.GetInventoryRequest())
        many.gpu_uuid = inv.gpus[0].uuid
        detail = await _invalid(stub.ApplyLayout(gpu_partitioner_pb2.ApplyLayoutRequest(layout=many, dry_run=True)))
        assert detail.startswith("layout.placements") and "at most 8" in detail
        detail = await _invalid(stub.ConvertMigPartedConfig(gpu_partitioner_pb2.ConvertMigPartedConfigRequest(
            gpu_model=A100_ENUM, layouts=gpu_partitioner_pb2.NamedLayouts(name="x", layouts=[many]))))
        assert detail.startswith("layouts.layouts[0].placements") and "at most 8" in detail
        # a full GPU's layout still goes through
        seven = common_pb2.MigLayout(placements=[common_pb2.MigPlacement(profile="1g.5gb")] * 7)
        await stub.DiffLayouts(gpu_partitioner_pb2.DiffLayoutsRequest(
            **{"gpu_model": A100_ENUM, "from": common_pb2.MigLayout(), "to": seven}))
    finally:
        await channel.close()
