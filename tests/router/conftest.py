"""Fixtures of the router tests: emulated engines (the simulator's emulator, in-process) and a router."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from greenserve.router.core import RouterCore
from greenserve.router.front.service import RouterServicer, RouterSettings, build
from greenserve.simulator.emulator import EmulatorConfig, EngineEmulator
from greenserve.v1 import router_pb2_grpc


@pytest.fixture
async def emulators() -> AsyncIterator[Callable[..., Any]]:
    """`await emulators(n, **config)`: n started EngineEmulators (stopped after the test)."""
    started: list[EngineEmulator] = []

    async def start(n: int, **config: Any) -> list[EngineEmulator]:
        config = {"time_scale": 20.0, **config}
        out = []
        for _ in range(n):
            emu = EngineEmulator(EmulatorConfig(host="127.0.0.1", port=0, **config))
            await emu.start()
            started.append(emu)
            out.append(emu)
        return out

    yield start
    for emu in started:
        try:
            emu.set_faults(crash=False, hang=False, error_rate=0.0)
        except Exception:  # noqa: BLE001
            pass
        await emu.stop()


@dataclass
class RouterHandle:
    running: Any
    servicer: RouterServicer
    channel: grpc.aio.Channel
    stub: router_pb2_grpc.RouterServiceStub

    @property
    def core(self) -> RouterCore:
        return self.servicer.core

    @property
    def http(self) -> str:
        assert self.servicer.http is not None
        return f"http://127.0.0.1:{self.servicer.http.port}"


@pytest.fixture
async def router(start_inprocess: Callable[..., Any]) -> AsyncIterator[Callable[..., Any]]:
    """`await router(engines=[urls], **settings)`: a router in this event loop with its HTTP front."""
    channels: list[grpc.aio.Channel] = []

    async def start(engines: list[str] | None = None, **settings: Any) -> RouterHandle:
        values = {"http_port": 0, "watch_plans": False, "feeds": False, "scrape_interval_s": 0.1,
                  "stale_after_s": 1.0, "health_interval_s": 0.2, "probe_timeout_s": 0.5,
                  "engines": ",".join(engines or []), "log_level": "WARNING", **settings}
        running = await start_inprocess(RouterSettings, build, **values)
        servicer = running.server.registrations[0].servicer
        channel = grpc.aio.insecure_channel(running.address)
        channels.append(channel)
        return RouterHandle(running, servicer, channel, router_pb2_grpc.RouterServiceStub(channel))

    yield start
    for channel in channels:
        await channel.close()


from tests.optimizer.conftest import forecaster, optimizer  # noqa: E402,F401  (tests of the router with the optimizer)
