"""GPU power over a measurement window through NVML (pynvml's documented calls).

Preferred: ``nvmlDeviceGetTotalEnergyConsumption`` (millijoules since the driver loaded, Volta+): mean power is
the counter's delta over the window, as Zeus and CodeCarbon measure (an A100's power reading is instantaneous, so
sparse polling aliases). Always, in parallel: ``nvmlDeviceGetPowerUsage`` (milliwatts) every ``interval_s``
(GreenLLM samples every 200 ms); the samples' mean is used when the counter is not supported, did not move, or
went backwards (driver reload). NVML cannot measure a MIG slice's power: a profile of a MIG configuration
records the whole GPU's power and says so in its power source.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any


def load_nvml() -> Any:
    """The pynvml module, initialised (raises whatever pynvml raises when no driver is there)."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml


class NvmlPowerMeter:
    """Mean power of one GPU over windows; ``nvml`` is the pynvml module (or a stand-in with its calls)."""

    def __init__(self, nvml: Any, device_index: int = 0, interval_s: float = 0.2) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"interval_s: must be > 0, got {interval_s}")
        self.nvml = nvml
        self.handle = nvml.nvmlDeviceGetHandleByIndex(device_index)
        self.interval_s = interval_s
        self._samples_w: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._energy0_mj: int | None = None
        self._t0 = 0.0

    def _energy_mj(self) -> int | None:
        try:
            return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except self.nvml.NVMLError:
            return None

    def _sample(self) -> None:
        try:
            self._samples_w.append(self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0)
        except self.nvml.NVMLError:
            pass

    async def _poll(self) -> None:
        while True:
            await asyncio.to_thread(self._sample)
            await asyncio.sleep(self.interval_s)

    async def start(self) -> None:
        """Begin a window: read the energy counter and start sampling power."""
        self._samples_w = []
        self._energy0_mj = await asyncio.to_thread(self._energy_mj)
        self._t0 = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> tuple[float, str, int]:
        """End the window: (mean watts, source, power samples taken); NaN watts when nothing was readable."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        elapsed = time.monotonic() - self._t0
        energy1 = await asyncio.to_thread(self._energy_mj)
        if self._energy0_mj is not None and energy1 is not None and energy1 > self._energy0_mj and elapsed > 0:
            return (energy1 - self._energy0_mj) / 1000.0 / elapsed, "nvml_energy_counter", len(self._samples_w)
        if self._samples_w:
            return sum(self._samples_w) / len(self._samples_w), "nvml_power_samples", len(self._samples_w)
        return math.nan, "", 0
