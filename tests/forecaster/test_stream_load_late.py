"""Issue 22 follow-up: StreamLoad takes late samples of the hour just completed within a grace period
(``--stream-load-late-s``). Several router workers and replicas report the same pools: once one of them has
opened hour H+1, another's last samples of H (a delayed RPC, another flush phase) still count in H, which is
stored only once its grace has passed. Older samples are refused naming ``samples[i].time``; a pool keeps at most
two open hours, and both survive a restart."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.common.errors import error_detail_from_rpc_error
from greenserve.forecaster.service import build
from greenserve.forecaster.settings import ForecasterSettings
from greenserve.forecaster.stream_load import LoadAccumulator, Sample
from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc

from .conftest import DAY0_S

SETTINGS = {"forecast_model": "seasonal_naive", "fit_history_hours": 120}
HOUR9_S, HOUR10_S, HOUR11_S = (DAY0_S + h * 3600 for h in (9, 10, 11))
#: The service clock: 10:30 on DAY0, standing (almost) still (samples must be within 300 s ahead of it).
AT_1030 = {"clock_start": str(HOUR10_S + 1800), "clock_speed": 1e-6}


def sample(pool: str, end_s: int, requests: int = 60, window_s: float = 60.0) -> forecaster_pb2.StreamLoadRequest:
    return forecaster_pb2.StreamLoadRequest(pool=pool, time=Timestamp(seconds=end_s), window_s=window_s,
                                            requests=requests)


def minutes(pool: str, hour_s: int, mins) -> list[forecaster_pb2.StreamLoadRequest]:
    """One reporter's 60 s samples of the given minutes of an hour, 1 request per second."""
    return [sample(pool, hour_s + (m + 1) * 60) for m in mins]


async def stream(stub, items) -> int:
    async def gen():
        for item in items:
            yield item
    return (await stub.StreamLoad(gen())).accepted_samples


async def rates(stub, pool: str) -> list[tuple[int, float]]:
    ref = common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_LOAD, key=pool, unit=common_pb2.UNIT_REQUESTS_PER_S)
    try:
        reply = await stub.GetPoints(forecaster_pb2.GetPointsRequest(series=ref))
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.NOT_FOUND
        return []
    return [(p.time.seconds, p.value) for p in reply.points]


async def test_late_samples_of_two_reporters_count_in_the_hour_within_its_grace(start_inprocess) -> None:
    svc = await start_inprocess(ForecasterSettings, build, **SETTINGS, **AT_1030)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        # reporters A and B, 1 request/s each over 09:00-10:00; B's last ten minutes are held back (a delayed RPC)
        assert await stream(stub, [*minutes("p", HOUR9_S, range(60)), *minutes("p", HOUR9_S, range(50))]) == 110
        assert await stream(stub, minutes("p", HOUR10_S, [0])) == 1  # A opens hour 10 at 10:01
        assert await rates(stub, "p") == []  # hour 9 is still in its grace
        # B's late batch, hour 9's last ten minutes and its first sample of hour 10: all taken
        assert await stream(stub, [*minutes("p", HOUR9_S, range(50, 60)), *minutes("p", HOUR10_S, [1])]) == 11
        assert await rates(stub, "p") == []
        # a sample ending 10:06, past the 300 s grace, stores hour 9 with B's late samples: 2 per second
        assert await stream(stub, minutes("p", HOUR10_S, [5])) == 1
        assert await rates(stub, "p") == [(HOUR9_S, pytest.approx(2.0))]  # without them: 6600 / 3600 = 1.83
        # hour 9 is closed now: a later sample of it is refused naming it, and the whole call with it
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stream(stub, [*minutes("q", HOUR10_S, [6]), *minutes("p", HOUR9_S, [59])])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_detail_from_rpc_error(err.value).field == "samples[1].time"
        assert "300 s after it ends" in err.value.details()
        # a pool whose first sample of hour 9 comes after one of hour 10, within the grace, still gets hour 9
        assert await stream(stub, [*minutes("late", HOUR10_S, [0]), *minutes("late", HOUR9_S, [59])]) == 2
        assert await stream(stub, minutes("late", HOUR10_S, [9])) == 1
        assert await rates(stub, "late") == [(HOUR9_S, pytest.approx(1.0))]
        # hour 8 is older than the hour before the newest one: refused
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stream(stub, minutes("late", HOUR9_S - 3600, [30]))
        assert error_detail_from_rpc_error(err.value).field == "samples[0].time"


async def test_late_grace_is_a_setting(start_inprocess) -> None:
    svc = await start_inprocess(ForecasterSettings, build, **SETTINGS, **AT_1030, stream_load_late_s=0.0)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        # no grace: the first sample of hour 10 stores hour 9, and a late one is refused (the old behaviour)
        assert await stream(stub, [*minutes("p", HOUR9_S, range(30)), *minutes("p", HOUR10_S, [0])]) == 31
        assert await rates(stub, "p") == [(HOUR9_S, pytest.approx(1.0))]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stream(stub, minutes("p", HOUR9_S, [59]))
        assert error_detail_from_rpc_error(err.value).field == "samples[0].time"


async def test_two_open_hours_survive_a_restart(start_inprocess, tmp_path) -> None:
    data_dir = tmp_path / "fc"
    svc = await start_inprocess(ForecasterSettings, build, **SETTINGS, **AT_1030, data_dir=data_dir)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        # hour 9: 09:00-09:30 at 1 per second; hour 10 opened at 10:01 with 120 requests in 60 s
        assert await stream(stub, [*minutes("r", HOUR9_S, range(30)), sample("r", HOUR10_S + 60, 120)]) == 31
    await svc.server.stop(0)

    # an hour later by the service clock (11:30), on the same database
    again = await start_inprocess(ForecasterSettings, build, **SETTINGS, data_dir=data_dir,
                                  clock_start=str(HOUR11_S + 1800), clock_speed=1e-6)
    async with grpc.aio.insecure_channel(again.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        # hour 9 is still open (its grace has not passed by the samples seen): a late sample of it is taken
        assert await stream(stub, [sample("r", HOUR9_S + 31 * 60, 180)]) == 1
        # a sample of 11:10 closes both: hour 9 (two hours later) and hour 10 (past its grace)
        assert await stream(stub, [sample("r", HOUR11_S + 600)]) == 1
        # hour 9: (1800 + 180) requests over 31 min; hour 10: 120 in 60 s, both as stored before the restart
        assert await rates(stub, "r") == [(HOUR9_S, pytest.approx(1980 / 1860)), (HOUR10_S, pytest.approx(2.0))]


def hour_sample(index: int, hour_s: int, end_in_hour_s: float, pool: str = "p") -> Sample:
    return Sample(index, pool, hour_s, 60.0, end_in_hour_s, 60, 0, 0)


def test_at_most_two_open_hours_and_a_sample_two_hours_later_closes_the_oldest() -> None:
    acc = LoadAccumulator(late_s=300.0)
    plan = acc.plan([hour_sample(0, HOUR9_S, 600.0), hour_sample(1, HOUR10_S, 60.0)])
    assert [b.hour_s for b in plan.buckets["p"]] == [HOUR9_S, HOUR10_S] and plan.emitted == []
    acc.commit(plan)
    # a sample of hour 11 inside hour 10's grace: hour 9 is emitted (two hours later), hours 10 and 11 stay open
    plan = acc.plan([hour_sample(0, HOUR11_S, 60.0)])
    assert [times.tolist() for _, times, _, _ in plan.emitted] == [[HOUR9_S]] * 3  # three series of hour 9
    assert [b.hour_s for b in plan.buckets["p"]] == [HOUR10_S, HOUR11_S]
    assert [b.hour_s for b in acc.buckets["p"]] == [HOUR9_S, HOUR10_S]  # plan changes nothing until commit
