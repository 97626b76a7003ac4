"""The gpu-partitioner's calls to its peers: the router's engine calls (``RouterEngines``, also the journaled
apply's ``RouterLink``) and the optimizer's fleet inventory (``OptimizerFleet``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import grpc

from greenserve.common.client import ChannelConfig, create_channel
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc, router_pb2, router_pb2_grpc

log = logging.getLogger("greenserve.gpu_partitioner.enforcer")


class RouterEngines:
    """The router calls of the gpu-partitioner: list, drain/undrain, register and deregister engines. It is the
    enforcer's router and the journaled apply's `RouterLink` (a drained engine is one whose state the router
    reports as DRAINED: draining and nothing in flight)."""

    def __init__(self, config: ChannelConfig) -> None:
        self.config = config
        self._channel: grpc.aio.Channel | None = None

    def _stub(self) -> router_pb2_grpc.RouterServiceStub:
        if self._channel is None:
            self._channel = create_channel(self.config)
        return router_pb2_grpc.RouterServiceStub(self._channel)

    async def engines_by_mig_uuid(self) -> dict[str, list[str]]:
        return {uuid: [engine_id for engine_id, _ in engines] for uuid, engines in (await self.mig_engines()).items()}

    async def mig_engines(self) -> dict[str, list[tuple[str, str]]]:
        """MIG UUID -> (id, URL) of each engine the router knows on it."""
        reply = await self._stub().ListEngines(router_pb2.ListEnginesRequest(), timeout=5.0)
        out: dict[str, list[tuple[str, str]]] = {}
        for status in reply.engines:
            if status.engine.mig_uuid:
                out.setdefault(status.engine.mig_uuid, []).append((status.engine.id, status.engine.url))
        return out

    async def undrained_engines(self, mig_uuids: Sequence[str]) -> list[tuple[str, str]]:
        """(engine id, MIG UUID) of the engines on these instances the router does not report DRAINED."""
        wanted = set(mig_uuids)
        reply = await self._stub().ListEngines(router_pb2.ListEnginesRequest(), timeout=5.0)
        return sorted((s.engine.id, s.engine.mig_uuid) for s in reply.engines
                      if s.engine.mig_uuid in wanted and s.engine.state != common_pb2.ENGINE_STATE_DRAINED)

    async def drain(self, engine_ids: Sequence[str], timeout_s: float) -> list[str]:
        reply = await self._stub().Drain(router_pb2.DrainRequest(engine_ids=list(engine_ids), wait=True,
                                                                 timeout_s=timeout_s), timeout=timeout_s + 5.0)
        return list(reply.busy_engine_ids)

    async def undrain(self, engine_ids: Sequence[str]) -> None:
        await self._stub().Undrain(router_pb2.UndrainRequest(engine_ids=list(engine_ids)), timeout=10.0)

    async def register(self, engine: common_pb2.Engine) -> None:
        await self._stub().RegisterEngine(router_pb2.RegisterEngineRequest(engine=engine), timeout=10.0)

    async def deregister(self, engine_id: str) -> None:
        """Removes the engine; an engine the router does not know is already gone."""
        try:
            await self._stub().DeregisterEngine(router_pb2.DeregisterEngineRequest(engine_id=engine_id), timeout=10.0)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()


class OptimizerFleet:
    """The fleet inventory (``GetFleet``) and its pools, the last good answer kept while the optimizer is down."""

    def __init__(self, channel: grpc.aio.Channel | None) -> None:
        self.stub = None if channel is None else optimizer_pb2_grpc.OptimizerServiceStub(channel)
        self.last: dict[str, common_pb2.Pool] | None = None
        self.fleet: common_pb2.FleetInventory | None = None

    async def inventory(self) -> common_pb2.FleetInventory | None:
        if self.stub is not None:
            try:
                reply = await self.stub.GetFleet(optimizer_pb2.GetFleetRequest(), timeout=5.0)
                self.fleet = reply.fleet
                self.last = {p.name: p for p in reply.fleet.pools}
            except grpc.aio.AioRpcError as exc:
                log.info("GetFleet failed (%s); using the last fleet seen", exc.code().name)
        return self.fleet

    async def pools(self) -> dict[str, common_pb2.Pool] | None:
        await self.inventory()
        return self.last


FleetPools = Callable[[], Awaitable[dict[str, common_pb2.Pool] | None]]
