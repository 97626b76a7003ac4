"""NVML-only logic (over FakeNvml: no GPU in CI), backend selection, and the energy split."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest
from greenserve.gpu_partitioner import service
from greenserve.gpu_partitioner.backend import (
    GpuState,
    InstanceState,
    InsufficientResourcesError,
    InUseError,
    PowerReading,
    ResetRequiredError,
)
from greenserve.gpu_partitioner.backend_nvml import NvmlBackend
from greenserve.gpu_partitioner.energy import EnergyAccountant, Share, split
from greenserve.common.mig_geometry import Placement, geometry

from tests.gpu_partitioner.fake_pynvml import FakeNvml

REPO = Path(__file__).resolve().parents[2]


def test_profiles_and_placements_are_read_from_the_device() -> None:
    fake = FakeNvml([("A100-40GB", True)])
    backend = NvmlBackend(fake)
    uuid = backend.list_gpus()[0].uuid
    geo = backend.geometry(uuid)
    assert geo.source == "nvml" and geo.model == "A100-40GB"
    assert {p.name: (p.profile_id, p.memory_slices, p.starts) for p in geo.profiles}["1g.5gb+me"] == (20, 1, (0, 1, 2, 3, 4, 5, 6))
    backend.create_instance(uuid, Placement(4, 4, "3g.20gb"))
    assert "CreateGpuInstanceWithPlacement(9,4,4)" in fake.calls  # info.id 9, not the constant 2; size 4, not 3


def test_set_mig_mode_activation_status_is_checked() -> None:
    fake = FakeNvml([("H100-80GB", False)])
    backend = NvmlBackend(fake)
    uuid = backend.list_gpus()[0].uuid
    fake.devices[0].set_mig_status = pynvml.NVML_ERROR_IN_USE
    with pytest.raises(InUseError):
        backend.set_mig_mode(uuid, True)
    fake.devices[0].set_mig_status = pynvml.NVML_ERROR_RESET_REQUIRED
    with pytest.raises(ResetRequiredError):
        backend.set_mig_mode(uuid, True)
    fake.devices[0].set_mig_status = None
    backend.set_mig_mode(uuid, True)
    assert backend.gpu(uuid).mig_enabled


def test_failed_compute_instance_creation_leaves_no_gpu_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([("A100-40GB", True)])
    backend = NvmlBackend(fake)
    uuid = backend.list_gpus()[0].uuid

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)

    monkeypatch.setattr(fake, "nvmlGpuInstanceCreateComputeInstance", refuse, raising=False)
    with pytest.raises(InsufficientResourcesError):
        backend.create_instance(uuid, Placement(0, 8, "7g.40gb"))
    assert fake.devices[0].gis == {}


def test_power_and_energy_units() -> None:
    fake = FakeNvml([("A100-40GB", True)])
    fake.devices[0].power_mw, fake.devices[0].energy_mj = 123_456, 7_000_000
    backend = NvmlBackend(fake)
    assert backend.read_power(backend.list_gpus()[0].uuid) == PowerReading(power_w=123.456, energy_j=7000.0)


def test_service_falls_back_to_the_simulator_when_nvml_does_not_initialise(monkeypatch: pytest.MonkeyPatch, db: Any) -> None:
    def no_library() -> NvmlBackend:
        return NvmlBackend(FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))

    monkeypatch.setattr(service, "NvmlBackend", no_library)
    settings = service.GpuPartitionerSettings.model_validate({"backend": "auto"})

    class Ctx:
        pass

    ctx = Ctx()
    ctx.db = db  # type: ignore[attr-defined]
    backend, note = service.open_backend(settings, ctx)  # type: ignore[arg-type]
    assert backend.kind == "simulated" and "LibraryNotFound" in note
    with pytest.raises(ValueError, match=r"--backend nvml: NVML unavailable \(NVMLError_LibraryNotFound"):
        service.open_backend(service.GpuPartitionerSettings.model_validate({"backend": "nvml"}), ctx)  # type: ignore[arg-type]
    monkeypatch.setattr(service, "NvmlBackend", lambda: NvmlBackend(FakeNvml([("A100-40GB", True)])))
    backend, _ = service.open_backend(settings, ctx)  # type: ignore[arg-type]
    assert backend.kind == "nvml"


def test_cli_with_backend_nvml_and_no_nvml_says_so_without_a_traceback(tmp_path: Any) -> None:
    """`greenserve-gpu-partitioner --backend nvml` on a host whose NVML does not initialise printed two chained
    tracebacks (pynvml's OSError, then NVMLError_LibraryNotFound out of asyncio.run); now one error line, exit 1."""
    code = (
        "import pynvml, sys\n"
        "from greenserve.gpu_partitioner import service\n"
        "from greenserve.gpu_partitioner.backend_nvml import NvmlBackend\n"
        "from greenserve.gpu_partitioner.__main__ import main\n"
        "from tests.gpu_partitioner.fake_pynvml import FakeNvml\n"
        "service.NvmlBackend = lambda: NvmlBackend(FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, "--backend", "nvml", "--port", "0", "--data-dir",
                           str(tmp_path)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "greenserve-gpu-partitioner: error: --backend nvml: NVML unavailable" in proc.stderr


def test_split_adds_up_and_follows_compute_and_activity() -> None:
    shares = [Share("a", 3, 1.0), Share("b", 1, 0.0), Share("c", 2, 1.0)]
    out = split(700.0, 70.0, shares)
    assert sum(out.by_instance.values()) + out.unallocated == pytest.approx(700.0)
    assert out.unallocated == pytest.approx(70.0 * 1 / 7)  # 1 compute slice unallocated
    assert out.by_instance["b"] == pytest.approx(70.0 / 7)  # idle share only
    assert out.by_instance["a"] - 30.0 == pytest.approx((630.0) * 3 / 5)
    no_activity = split(700.0, 70.0, [Share("a", 3), Share("b", 4)])
    assert no_activity.by_instance["b"] / no_activity.by_instance["a"] == pytest.approx(4 / 3)
    assert split(50.0, 70.0, []).unallocated == 50.0


def test_accountant_attributes_counter_deltas(db: Any) -> None:
    geo = geometry("A100-40GB")
    acc = EnergyAccountant(db)
    gpu = GpuState(uuid="GPU-x", index=0, name="A100", model="A100-40GB", memory_bytes=1, mig_capable=True, mig_enabled=True,
                   instances=[InstanceState("7g.40gb", 0, 8, 1, 0, "MIG-a", 1)])
    acc.sample(gpu, geo, PowerReading(100.0, 1000.0))
    view = acc.sample(gpu, geo, PowerReading(100.0, 1600.0))
    assert view.instances[0].energy_j == pytest.approx(600.0)  # a 7g holds every compute slice
    view = acc.sample(gpu, geo, PowerReading(100.0, 50.0))  # driver reload: counter restarted
    assert view.instances[0].energy_j == pytest.approx(650.0)
