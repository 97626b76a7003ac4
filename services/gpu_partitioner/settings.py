"""Settings of greenserve-gpu-partitioner: its flags and GREENSERVE_* environment variables."""

from __future__ import annotations

import socket
from typing import ClassVar, Literal

from pydantic import Field

from greenserve.common.config import DependencyAddresses, ServiceSettings
from greenserve.gpu_partitioner.follow import PlanFollowSettings


class GpuPartitionerSettings(ServiceSettings, DependencyAddresses, PlanFollowSettings):
    """Flags and GREENSERVE_* env vars of greenserve-gpu-partitioner."""

    service_name: ClassVar[str] = "gpu_partitioner"

    backend: Literal["auto", "nvml", "simulated"] = Field(
        "auto", description="MIG backend: auto (NVML when nvmlInit works, else simulated), nvml or simulated")
    sim_gpus: str = Field(
        "A100-40GB", description="simulated GPUs, comma-separated models (A100-40GB, A100-80GB, H100-80GB, "
        "H200-141GB), ':nomig' to start with MIG off, or GPUs without MIG (T4, V100, L40: where a DPD pair's "
        "decoder runs); used on first start of an empty database")
    recovery_policy: Literal["rollback", "resume"] = Field(
        "rollback", description="what to do at start with an apply a crash left open: restore the previous layout "
        "(rollback) or finish it (resume, once its drain was done); the same for a GPU power limit / clock change")
    require_router: bool = Field(
        True, description="refuse to destroy GPU instances when the router cannot be asked to drain their engines")
    energy_sample_interval_s: float = Field(
        15.0, ge=0, le=3600, description="seconds between energy samples (0: only on GetEnergy and applies); "
        "15 s is CodeCarbon's default measure_power_secs (codecarbon EmissionsTracker)")
    node_name: str = Field(default_factory=socket.gethostname, description="node name reported in the inventory")
