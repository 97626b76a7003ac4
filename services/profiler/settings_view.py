"""The few settings the engine backend reads, for callers without a ProfilerSettings (the bench, the CLI)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class EngineSettingsView:
    nvml_power: str = "auto"
    nvml_device_index: int = 0
    cache_manager_addr: str = "127.0.0.1:50054"
    gpu_partitioner_addr: str = ""
    tls_ca: Path | None = None
    auth_token: str | None = None
    engine_launcher: str = "none"
    engine_port_range: str = "8200-8299"
    engine_start_timeout_s: float = 600.0
    engine_cuda_visible_devices: str = ""
    engine_gpu_memory_utilization: float = 0.9
    engine_log_dir: Path | None = None

    def token(self) -> str | None:
        return self.auth_token
