"""What a MIG backend is: the state it reports, the operations it offers and the errors it raises.

Beside MIG it sets a GPU's power limit and locks its SM clocks (power.py applies the plan's ``gpu_power``):
``power_limits``, ``set_power_limit``, ``supported_sm_clocks``, ``set_locked_clocks``, ``reset_locked_clocks``,
with the same errors (NO_PERMISSION without root, INVALID_ARGUMENT outside the limits, NOT_SUPPORTED).

Two implementations follow this contract: `backend_nvml.NvmlBackend` (real NVML through pynvml) and
`backend_sim.SimulatedBackend` (the same rules and errors, persisted in the service database). The errors mirror
the NVML return codes (``nvmlReturn_t`` in the NVML API reference, https://docs.nvidia.com/deploy/nvml-api/, as
nvidia-ml-py raises them: ``NVMLError_InUse``, ...), so the apply protocol handles both backends with one code
path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol

from greenserve.common.mig_geometry import GpuGeometry, Placement


class MigBackendError(Exception):
    """A backend operation failed; `nvml_code` is the NVML return code it corresponds to."""

    nvml_code: int = 999  # NVML_ERROR_UNKNOWN


class NotSupportedError(MigBackendError):
    """NVML_ERROR_NOT_SUPPORTED: MIG is off, the GPU has no MIG, or the profile is not offered."""

    nvml_code = 3


class InvalidPlacementError(MigBackendError):
    """NVML_ERROR_INVALID_ARGUMENT: a placement that is not legal for the profile."""

    nvml_code = 2


class NoPermissionError(MigBackendError):
    """NVML_ERROR_NO_PERMISSION: MIG management needs root / CAP_SYS_ADMIN or the MIG capabilities."""

    nvml_code = 4


class NotFoundError(MigBackendError):
    """NVML_ERROR_NOT_FOUND: no such GPU or GPU instance."""

    nvml_code = 6


class ResetRequiredError(MigBackendError):
    """NVML_ERROR_RESET_REQUIRED, or a MIG mode change pending a GPU reset (A100: current != pending)."""

    nvml_code = 16


class InUseError(MigBackendError):
    """NVML_ERROR_IN_USE: processes or compute instances still run on the instance (or the GPU)."""

    nvml_code = 19


class InsufficientResourcesError(MigBackendError):
    """NVML_ERROR_INSUFFICIENT_RESOURCES: the placement overlaps or a limit of the GPU is reached."""

    nvml_code = 23


@dataclass
class InstanceState:
    """One GI with its full-size compute instance as the backend sees it."""

    profile: str
    start: int
    size: int
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str  # "MIG-..." (what CUDA_VISIBLE_DEVICES takes)
    memory_bytes: int

    @property
    def placement(self) -> Placement:
        return Placement(start=self.start, size=self.size, profile=self.profile)


@dataclass
class GpuState:
    """One physical GPU."""

    uuid: str
    index: int
    name: str
    model: str | None  # key of geometry.models(), None when the tables do not know it
    memory_bytes: int
    mig_capable: bool
    mig_enabled: bool
    mig_pending: bool = False  # a mode change waits for a GPU reset (A100)
    instances: list[InstanceState] = field(default_factory=list)
    hardware: str = ""  # the GPU as the simulator's profiles name it ("A100-40GB", "T4"); "" when unknown

    @property
    def layout(self) -> list[Placement]:
        return sorted(i.placement for i in self.instances)

    @property
    def whole(self) -> bool:
        """Runs engines as a whole GPU: no MIG (unsupported) or MIG disabled (DPD's decoder on an older GPU)."""
        return not self.mig_capable or (not self.mig_enabled and not self.mig_pending)


@lru_cache(maxsize=1)
def simulator_gpus() -> dict[str, dict]:
    """The simulator's GPU figures by hardware name ("T4": memory, idle and max power, ...)."""
    from greenserve.simulator.mode_units import gpu_table

    return dict(gpu_table())


def hardware_name(name: str, model: str | None = None) -> str:
    """The simulator's name of a GPU: its MIG model key when known, else the simulator GPU whose name appears as a
    word of the NVML product name ("Tesla T4" -> "T4", "Tesla V100-SXM2-16GB" -> "V100"); "" when none does."""
    if model:
        return model
    for key in sorted(simulator_gpus(), key=len, reverse=True):
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", name, flags=re.IGNORECASE):
            return key
    return ""


@dataclass
class PowerReading:
    """Board power and the energy counter of one GPU (None where the GPU cannot tell)."""

    power_w: float | None
    energy_j: float | None


@dataclass(frozen=True)
class PowerLimits:
    """A GPU's power management limit, watts: the range it accepts, its default and the limit in force."""

    min_w: float
    max_w: float
    default_w: float
    current_w: float


class MigBackend(Protocol):
    """Operations the partitioner needs. Blocking calls: the service runs them in a worker thread."""

    kind: str  # "nvml" or "simulated"

    def driver_version(self) -> str:
        """Driver version string ("" when simulated)."""

    def driver_branch(self) -> int:
        """Driver major branch (e.g. 550); geometry.CURRENT_DRIVER when simulated."""

    def list_gpus(self) -> list[GpuState]:
        """All GPUs with their MIG state and instances."""

    def gpu(self, gpu_uuid: str) -> GpuState:
        """One GPU; NotFoundError when unknown."""

    def geometry(self, gpu_uuid: str) -> GpuGeometry:
        """Profiles and placements of the GPU (from the device when it can tell, else the tables)."""

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> None:
        """Switch MIG mode; ResetRequiredError when the change waits for a GPU reset, InUseError when busy."""

    def create_instance(self, gpu_uuid: str, placement: Placement) -> InstanceState:
        """Create a GI at an explicit placement and its full-size compute instance."""

    def destroy_instance(self, gpu_uuid: str, placement: Placement) -> None:
        """Destroy the compute instances of the GI at `placement`, then the GI; InUseError when busy."""

    def read_power(self, gpu_uuid: str) -> PowerReading:
        """Board power (W) and energy counter (J since driver load)."""

    def instance_activity(self, gpu_uuid: str) -> dict[str, float] | None:
        """Per-MIG-UUID activity in [0, 1] when the backend can measure it, else None (A100 NVML)."""

    def power_limits(self, gpu_uuid: str) -> PowerLimits:
        """nvmlDeviceGetPowerManagementLimitConstraints, ...DefaultLimit and ...Limit, in watts."""

    def set_power_limit(self, gpu_uuid: str, watts: float) -> None:
        """nvmlDeviceSetPowerManagementLimit (milliwatts); NoPermissionError without root."""

    def supported_sm_clocks(self, gpu_uuid: str) -> list[int]:
        """nvmlDeviceGetSupportedGraphicsClocks at the highest supported memory clock, MHz, highest first."""

    def set_locked_clocks(self, gpu_uuid: str, min_mhz: int, max_mhz: int) -> None:
        """nvmlDeviceSetGpuLockedClocks(min, max); NoPermissionError without root."""

    def reset_locked_clocks(self, gpu_uuid: str) -> None:
        """nvmlDeviceResetGpuLockedClocks: clocks unlocked (the GPU's own boost behaviour)."""

    def close(self) -> None:
        """Release NVML (or nothing)."""
