"""The few settings the engine backend reads, for callers without a ProfilerSettings (the bench, the CLI)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class EngineSettingsView:
    nvml_power: str = "auto"
    nvml_device_index: int = 0
    cache_manager_addr: str = "127.0.0.1:50054"
    tls_ca: Path | None = None
    auth_token: str | None = None

    def token(self) -> str | None:
        return self.auth_token
