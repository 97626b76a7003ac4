"""Fixtures of the gpu-partitioner tests: databases, the two backends, an in-test router."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from greenserve.common.persistence import Database
from greenserve.gpu_partitioner.backend_nvml import NvmlBackend
from greenserve.gpu_partitioner.backend_sim import SimulatedBackend
from greenserve.v1 import router_pb2, router_pb2_grpc

from tests.gpu_partitioner.fake_pynvml import FakeNvml


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database.open(f"sqlite:///{tmp_path / 'gpu_partitioner.db'}", "gpu_partitioner")
    yield database
    database.close()


@dataclass
class Harness:
    """A backend plus the test-only controls of the device behind it (what a workload or operator does)."""

    kind: str
    backend: Any
    device: Any  # SimulatedBackend or FakeNvml

    def start_process(self, gpu_uuid: str, mig_uuid: str) -> None:
        if self.kind == "simulated":
            self.device.start_process(gpu_uuid, mig_uuid)
        else:
            self.device.start_process(mig_uuid)

    def reset(self, gpu_uuid: str) -> None:
        if self.kind == "simulated":
            self.device.reset_gpu(gpu_uuid)
        else:
            index = next(i for i, d in enumerate(self.device.devices) if d.uuid == gpu_uuid)
            self.device.reset(index)


def make_harness(kind: str, db: Database, gpus: list[tuple[str, bool]]) -> Harness:
    if kind == "simulated":
        sim = SimulatedBackend(db, gpus)
        return Harness(kind, sim, sim)
    fake = FakeNvml(gpus)
    return Harness(kind, NvmlBackend(fake), fake)


@pytest.fixture(params=["simulated", "nvml"])
def harness(request: pytest.FixtureRequest, db: Database) -> Harness:
    """The same contract suite runs on the simulated backend and on the NVML backend (over FakeNvml)."""
    return make_harness(request.param, db, [("A100-40GB", True), ("H100-80GB", False), ("A100-40GB", False)])


@dataclass
class FakeRouterState:
    engines: dict[str, str] = field(default_factory=dict)  # engine id -> MIG uuid
    urls: dict[str, str] = field(default_factory=dict)  # engine id -> URL (none: the engine has no URL)
    busy: set[str] = field(default_factory=set)
    drained: set[str] = field(default_factory=set)
    calls: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)


class InTestRouter(router_pb2_grpc.RouterServiceServicer):
    """RouterService with ListEngines, Drain and Undrain only, standing in for the router being written."""

    def __init__(self, state: FakeRouterState) -> None:
        self.state = state

    async def ListEngines(self, request: Any, context: Any) -> router_pb2.ListEnginesResponse:
        from greenserve.v1 import common_pb2

        def state(eid: str) -> int:  # as the router reports it: DRAINED once drained and idle
            if eid in self.state.drained:
                return common_pb2.ENGINE_STATE_DRAINING if eid in self.state.busy else common_pb2.ENGINE_STATE_DRAINED
            return common_pb2.ENGINE_STATE_HEALTHY

        return router_pb2.ListEnginesResponse(engines=[
            router_pb2.EngineStatus(engine=common_pb2.Engine(id=eid, mig_uuid=mig, state=state(eid),
                                                             url=self.state.urls.get(eid, "")))
            for eid, mig in sorted(self.state.engines.items())
        ])

    async def Drain(self, request: Any, context: Any) -> router_pb2.DrainResponse:
        ids = tuple(request.engine_ids)
        self.state.calls.append(("drain", ids))
        self.state.drained.update(ids)
        busy = [e for e in ids if e in self.state.busy]
        return router_pb2.DrainResponse(idle_engine_ids=[e for e in ids if e not in busy], busy_engine_ids=busy)

    async def Undrain(self, request: Any, context: Any) -> router_pb2.UndrainResponse:
        ids = tuple(request.engine_ids)
        self.state.calls.append(("undrain", ids))
        self.state.drained.difference_update(ids)
        return router_pb2.UndrainResponse()


@dataclass
class RunningRouter:
    address: str
    state: FakeRouterState


@pytest.fixture
async def router() -> AsyncIterator[RunningRouter]:
    state = FakeRouterState()
    server = grpc.aio.server()
    router_pb2_grpc.add_RouterServiceServicer_to_server(InTestRouter(state), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield RunningRouter(f"127.0.0.1:{port}", state)
    await server.stop(0)
