"""Fault 6 of issue 36: the SQLite database locked by another writer.

Real processes: the forecaster and the optimizer each in their own process on their SQLite database; this process
opens the same file with sqlite3 and takes its write lock (``BEGIN IMMEDIATE``), as another writer would.

What must hold: reads go on (WAL: readers are not blocked); a write waiting for the lock goes through once the
other writer lets go within the busy timeout (15 s); a write that cannot get the lock within it fails cleanly,
UNAVAILABLE saying the database is locked (before: INTERNAL), and nothing of it is stored; once the lock is
released writes go through again and everything acknowledged is there.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.common.db_engine import DEFAULT_SQLITE_BUSY_TIMEOUT_MS
from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc, optimizer_pb2, optimizer_pb2_grpc

from tests.conftest import free_port
from tests.faults.conftest import seeded_forecaster, start_optimizer
from tests.forecaster.process import start_forecaster
from tests.optimizer.conftest import engine, pool

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BUSY_S = DEFAULT_SQLITE_BUSY_TIMEOUT_MS / 1000.0
DAY0_S = 1_704_067_200
CI_FR = common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key="FR",
                             carbon_signal=common_pb2.CARBON_SIGNAL_DIRECT)


class WriteLock:
    """Another writer: holds the write lock of a SQLite file from a thread until ``release``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.taken = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            self.taken.set()
            self.release.wait(120)
            db.execute("ROLLBACK")
        finally:
            db.close()

    def __enter__(self) -> WriteLock:
        self.thread.start()
        assert self.taken.wait(30), "could not take the write lock"
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.thread.join(30)


def points(first_hour: int, n: int) -> forecaster_pb2.IngestPointsRequest:
    return forecaster_pb2.IngestPointsRequest(series=CI_FR, resolution_s=3600, points=[
        common_pb2.TimeSeriesPoint(time=Timestamp(seconds=DAY0_S + (first_hour + i) * 3600), value=100.0 + i)
        for i in range(n)])


async def stored(stub) -> int:
    return len((await stub.GetPoints(forecaster_pb2.GetPointsRequest(series=CI_FR), timeout=10)).points)


async def test_forecaster_writes_wait_then_fail_unavailable_under_another_writer(tmp_path) -> None:
    port = free_port()
    proc = await asyncio.to_thread(start_forecaster, tmp_path, port, GREENSERVE_FORECAST_MODEL="seasonal_naive")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
            await stub.IngestPoints(points(0, 48))
            db = tmp_path / "forecaster.db"
            # a lock held for 2 s: the write waits for it and goes through
            with WriteLock(db):
                write = asyncio.ensure_future(stub.IngestPoints(points(48, 24), timeout=60))
                assert await stored(stub) == 48  # reads go on meanwhile
                await asyncio.sleep(2.0)
                assert not write.done()
            assert (await write).inserted_points == 24
            # a lock held past the busy timeout: UNAVAILABLE, nothing stored
            with WriteLock(db):
                t0 = time.monotonic()
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.IngestPoints(points(72, 24), timeout=BUSY_S + 30)
                took = time.monotonic() - t0
                assert await stored(stub) == 72
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value
            assert "locked" in err.value.details()
            assert took < BUSY_S + 10, took
            # released: the same write goes through, everything acknowledged is there
            assert (await stub.IngestPoints(points(72, 24), timeout=30)).inserted_points == 24
            assert await stored(stub) == 96
    finally:
        proc.kill()
        proc.wait()


async def test_optimizer_writes_under_another_writer_fail_unavailable_and_change_nothing(tmp_path) -> None:
    fc_port, port = free_port(), free_port()
    forecaster = await seeded_forecaster(tmp_path, fc_port)
    optimizer = None
    try:
        optimizer = await start_optimizer(tmp_path, port, fc_port)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = optimizer_pb2_grpc.OptimizerServiceStub(channel)
            fleet = common_pb2.FleetInventory(pools=[pool("chat", [engine("e1")])])
            await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=fleet))
            first = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2))).plan
            bigger = common_pb2.FleetInventory(pools=[pool("chat", [engine("e1"), engine("e2")])])
            with WriteLock(tmp_path / "opt" / "optimizer.db"):
                results = await asyncio.gather(
                    stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=bigger), timeout=BUSY_S + 30),
                    stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2), timeout=BUSY_S + 30),
                    return_exceptions=True)
                for result in results:
                    assert isinstance(result, grpc.aio.AioRpcError), result
                    assert result.code() == grpc.StatusCode.UNAVAILABLE and "locked" in result.details(), result
                # reads go on, and nothing of the refused writes shows
                assert (await stub.GetFleet(optimizer_pb2.GetFleetRequest())).fleet == fleet
                assert (await stub.GetPlan(optimizer_pb2.GetPlanRequest())).plan.version == first.version
            assert (await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=bigger))).fleet.pools[0].engines[1].id == "e2"
            again = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2))).plan
            assert again.version == first.version + 1  # no version taken by the refused computation
    finally:
        for proc in (optimizer, forecaster):
            if proc is not None:
                proc.kill()
                proc.wait()
