"""SLO attainment per pool over a recent window, from the receipts, reported to the optimizer (``ReportAttainment``)
so that a breach triggers a new plan (the plans issue's SLO-breach event).

The request path only increments two counters of the current bucket (O(1)); buckets of ``bucket_s`` seconds of the
shared clock are kept for ``window_s`` (memory bounded by pools x window / bucket). A background task sends the
window's figures every ``interval_s``; while the optimizer is down the report is dropped (the next one is fresh).
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from collections import deque

import grpc
from greenserve.common.clock import clock, now_s
from greenserve.common.tasks import cancel_and_wait
from greenserve.v1 import optimizer_pb2, optimizer_pb2_grpc

log = logging.getLogger("greenserve.router.accounting.attainment")
MAX_POOLS = 1024


class AttainmentWindow:
    def __init__(self, window_s: float = 300.0, bucket_s: float = 10.0) -> None:
        self.window_s = window_s
        self.bucket_s = bucket_s
        self.pools: dict[str, deque[list[float]]] = {}  # pool -> [bucket start, requests, met]

    def record(self, pool: str, met: bool, at_s: float | None = None) -> None:
        t = now_s() if at_s is None else at_s
        start = math.floor(t / self.bucket_s) * self.bucket_s
        buckets = self.pools.get(pool)
        if buckets is None:
            if len(self.pools) >= MAX_POOLS:
                return
            buckets = self.pools[pool] = deque(maxlen=int(self.window_s / self.bucket_s) + 1)
        if not buckets or buckets[-1][0] != start:
            buckets.append([start, 0.0, 0.0])
        last = buckets[-1]
        last[1] += 1
        last[2] += 1 if met else 0

    def snapshot(self, at_s: float | None = None) -> list[optimizer_pb2.PoolAttainment]:
        t = now_s() if at_s is None else at_s
        out = []
        for pool, buckets in self.pools.items():
            recent = [b for b in buckets if b[0] > t - self.window_s]
            requests = sum(b[1] for b in recent)
            if requests:
                out.append(optimizer_pb2.PoolAttainment(pool=pool, window_s=self.window_s, requests=int(requests),
                                                        attainment_fraction=sum(b[2] for b in recent) / requests))
        return out


class AttainmentReporter:
    def __init__(self, window: AttainmentWindow, channel: grpc.aio.Channel, interval_s: float = 60.0,
                 instance: str | None = None) -> None:
        self.window = window
        self.stub = optimizer_pb2_grpc.OptimizerServiceStub(channel)
        self.interval_s = interval_s
        self.instance = instance or socket.gethostname()
        self.sent = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="attainment-reporter")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def report_once(self) -> bool:
        pools = self.window.snapshot()
        if not pools:
            return False
        reply = await self.stub.ReportAttainment(
            optimizer_pb2.ReportAttainmentRequest(instance=self.instance, pools=pools), timeout=5.0)
        self.sent += 1
        return reply.replan_triggered

    async def _run(self) -> None:
        while True:
            await clock().sleep(self.interval_s)
            try:
                if await self.report_once():
                    log.info("SLO attainment below target reported; the optimizer re-plans")
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                log.debug("attainment report not delivered: %s", exc.code().name)
