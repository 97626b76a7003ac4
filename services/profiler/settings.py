"""Settings of greenserve-profiler: its flags and GREENSERVE_* environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, field_validator

from greenserve.common.config import DependencyAddresses, ServiceSettings


class ProfilerSettings(ServiceSettings, DependencyAddresses):
    """Flags and GREENSERVE_* env vars of greenserve-profiler."""

    service_name: ClassVar[str] = "profiler"

    import_published: bool = Field(
        True, description="on start, store the seeds' published tables as PUBLISHED profiles when none are stored")
    engine_backend: bool = Field(True, description="accept SWEEP_BACKEND_ENGINE sweeps (real engines over HTTP)")
    nvml_power: str = Field("auto", description="GPU power for engine sweeps: auto (NVML when it initialises), "
                            "nvml (required), off (the engine's own power metric only)")
    nvml_device_index: int = Field(0, ge=0, le=63, description="NVML index of the GPU the profiled engine runs on")
    engine_launcher: str = Field(
        "none", description="engine sweeps without --engine-url start one engine per configuration: emulator "
        "(greenserve-engine-sim with the configuration's simulator profile), vllm (vllm serve), none (refused)")
    engine_port_range: str = Field("8200-8299", description="ports of the engines the profiler starts (LOW-HIGH)")
    engine_start_timeout_s: float = Field(600.0, gt=0, le=3600, description="longest wait for a started engine")
    engine_cuda_visible_devices: str = Field(
        "", description="the device the profiled engine runs on (GPU or MIG-... UUID): CUDA_VISIBLE_DEVICES of "
        "started vLLM engines (empty: they inherit the profiler's own); a MIG UUID takes that instance's power "
        "share from the gpu-partitioner")
    engine_gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="vllm serve --gpu-memory-utilization")
    engine_log_dir: Path | None = Field(None, description="logs of the engines the profiler starts (default: none)")

    @field_validator("engine_launcher")
    @classmethod
    def _known_launcher(cls, value: str) -> str:
        if value not in ("none", "emulator", "vllm"):
            raise ValueError(f"must be none, emulator or vllm, got {value!r}")
        return value

    @field_validator("engine_port_range")
    @classmethod
    def _port_range(cls, value: str) -> str:
        from greenserve.common.engine_launch import parse_port_range  # the launcher's own rule

        parse_port_range(value)  # at start: else every sweep that launches an engine fails on it
        return value

    @field_validator("nvml_power")
    @classmethod
    def _known_nvml_mode(cls, value: str) -> str:
        if value not in ("auto", "nvml", "off"):
            raise ValueError(f"must be auto, nvml or off, got {value!r}")
        return value
