"""The forecaster under 16 concurrent writers, then SIGKILL and a restart (issue 21).

8 clients append hourly points to their own CI series with IngestPoints (4 points a call), 8 stream load
samples of their own pool with StreamLoad (each call opens the next hour and so completes the one before),
all at once for a few seconds against a forecaster process; while they are still writing it is killed with
SIGKILL and started again on the same database. No call may fail before the kill; after the restart each
series holds exactly the acknowledged writes (a call in flight at the kill whole or not at all), and the open
hour of each pool, acknowledged but not yet complete, is still there: one more sample completes it with the
rate of the samples sent before the kill.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc
from tests.conftest import free_port
from tests.process import sigkill_while_writing

from .process import start_forecaster

pytestmark = pytest.mark.timeout(180)
CLIENTS = 16
WRITE_S = 2.5
POINTS_PER_CALL = 4
HOUR_S = 3600
#: StreamLoad hours start 6 days back (samples must be within 7 days of now) and stop an hour before now.
LOAD_HOURS = 6 * 24 - 1


def ci_series(c: int) -> common_pb2.SeriesRef:
    return common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key=f"Z{c:02d}",
                                carbon_signal=common_pb2.CARBON_SIGNAL_DIRECT)


def load_series(c: int) -> common_pb2.SeriesRef:
    return common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_LOAD, key=f"pool-{c:02d}",
                                unit=common_pb2.UNIT_REQUESTS_PER_S)


def load_sample(c: int, base_s: int, k: int) -> forecaster_pb2.StreamLoadRequest:
    """The k-th call's sample: 60 s in hour k with k + 1 requests, ending 10 min into the hour (past the
    default 300 s grace of hour k - 1, so the call completes it)."""
    return forecaster_pb2.StreamLoadRequest(pool=f"pool-{c:02d}", time=Timestamp(seconds=base_s + k * HOUR_S + 600),
                                            window_s=60.0, requests=k + 1)


@dataclass
class Client:
    c: int
    acked: int = 0  # calls acknowledged (each call is the next one in the client's sequence)
    in_flight: bool = False  # a call was cut by the kill: applied whole or not at all
    errors: list[str] = field(default_factory=list)

    @property
    def ingests(self) -> bool:
        return self.c % 2 == 0


async def _run_client(cl: Client, address: str, base_s: int, killed: asyncio.Event) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        while not killed.is_set() and cl.acked < LOAD_HOURS:
            k = cl.acked
            if cl.ingests:
                steps = range(k * POINTS_PER_CALL, (k + 1) * POINTS_PER_CALL)
                points = [common_pb2.TimeSeriesPoint(time=Timestamp(seconds=base_s + i * HOUR_S),
                                                     value=100.0 + c_value(cl.c, i)) for i in steps]
                call = stub.IngestPoints(forecaster_pb2.IngestPointsRequest(
                    series=ci_series(cl.c), resolution_s=HOUR_S, points=points))
            else:
                sample = load_sample(cl.c, base_s, k)

                async def one(sample=sample):
                    yield sample

                call = stub.StreamLoad(one())
            cl.in_flight = True
            try:
                await call
            except grpc.aio.AioRpcError as exc:
                if killed.is_set() and exc.code() == grpc.StatusCode.UNAVAILABLE:
                    return  # cut by the kill: in_flight stays ambiguous
                cl.errors.append(f"call {k}: {exc.code().name} {exc.details()}")
                cl.in_flight = False
                return
            cl.in_flight = False
            cl.acked += 1


def c_value(c: int, i: int) -> float:
    return float((c * 7 + i * 3) % 50)


def _stored(address: str, series: common_pb2.SeriesRef) -> list[tuple[int, float]]:
    with grpc.insecure_channel(address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        try:
            reply = stub.GetPoints(forecaster_pb2.GetPointsRequest(series=series), timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
            return []
    return [(p.time.seconds, round(p.value, 9)) for p in reply.points]


def _expected(cl: Client, base_s: int, calls: int) -> list[tuple[int, float]]:
    if cl.ingests:
        return [(base_s + i * HOUR_S, 100.0 + c_value(cl.c, i)) for i in range(calls * POINTS_PER_CALL)]
    # call k completes hour k - 1 (k requests in 60 s)
    return [(base_s + (k - 1) * HOUR_S, round(k / 60.0, 9)) for k in range(1, calls)]


async def test_writes_hold_exactly_the_acknowledged_ones_after_sigkill(tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    # seasonal naive: fits are cheap, the test is about the writes
    settings = {"GREENSERVE_FORECAST_MODEL": "seasonal_naive"}
    base_s = int(time.time()) // HOUR_S * HOUR_S - 6 * 24 * HOUR_S
    proc = start_forecaster(tmp_path, port, **settings)
    clients = [Client(c) for c in range(CLIENTS)]
    killed = asyncio.Event()
    tasks = [asyncio.create_task(_run_client(cl, address, base_s, killed)) for cl in clients]
    await sigkill_while_writing(proc, tasks, killed, WRITE_S)
    errors = [e for cl in clients for e in cl.errors]
    assert not errors, errors[:10]
    writes = sum(cl.acked for cl in clients)
    assert writes >= CLIENTS * 3, f"only {writes} acknowledged writes in {WRITE_S} s"

    proc = start_forecaster(tmp_path, port, **settings)
    try:
        for cl in clients:
            series = ci_series(cl.c) if cl.ingests else load_series(cl.c)
            allowed = [_expected(cl, base_s, cl.acked)]
            if cl.in_flight:
                allowed.append(_expected(cl, base_s, cl.acked + 1))
            assert _stored(address, series) in allowed, (cl.c, cl.acked, cl.in_flight)
        # the open hour of each pool survived: one more call completes it with the samples sent before the kill
        with grpc.insecure_channel(address) as channel:
            stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
            for cl in clients:
                if cl.ingests or cl.acked == 0:
                    continue
                stored = _stored(address, load_series(cl.c))
                calls = cl.acked + (1 if len(stored) == cl.acked else 0)  # the in-flight call was applied
                stub.StreamLoad(iter([load_sample(cl.c, base_s, calls)]), timeout=10)
                assert _stored(address, load_series(cl.c)) == _expected(cl, base_s, calls + 1)
    finally:
        proc.kill()  # its shutdown is not under test
        proc.wait(30)
