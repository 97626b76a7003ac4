"""``greenserve-engine-sim``: an emulated vLLM engine speaking the OpenAI-compatible HTTP API.

In-process use (router tests, benchmarks)::

    from greenserve.simulator.emulator import EmulatorConfig, EngineEmulator
    emu = EngineEmulator(EmulatorConfig(host="127.0.0.1", port=0, time_scale=10.0))
    await emu.start()            # emu.port, emu.url set
    emu.set_faults(hang=True)    # crash / hang / slow_factor / error_rate / seed / fail_after_tokens
    await emu.stop()

The names are imported lazily so that importing this package costs nothing until they are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from greenserve.simulator.emulator.config import EmulatorConfig
    from greenserve.simulator.emulator.server import EngineEmulator

__all__ = ["EmulatorConfig", "EngineEmulator"]


def __getattr__(name: str) -> Any:
    if name == "EmulatorConfig":
        from greenserve.simulator.emulator.config import EmulatorConfig

        return EmulatorConfig
    if name == "EngineEmulator":
        from greenserve.simulator.emulator.server import EngineEmulator

        return EngineEmulator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
