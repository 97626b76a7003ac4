"""Issue 36: a forecaster stopped with SIGTERM while its workers fit is gone, workers included, within
``--shutdown-grace-s`` (plus the second the workers get to end); an interrupted fit is not stored.

Before the fix it ran on for as long as the fits took (a backtest of a month: minutes) with both worker processes
alive: ``ProcessPoolExecutor.shutdown(wait=False)`` let running work finish, and the interpreter's exit joined
the executor's manager thread, which waited for it."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc
from tests.conftest import free_port
from tests.up_process import descendants_of, pids_alive, wait_until_gone

from .process import start_forecaster

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

DAY0_S = 1_704_067_200
GRACE_S = 2.0
#: What SIGTERM may take beyond the grace: the workers' second to end (FitPool.shutdown) and the interpreter's exit.
SLACK_S = 4.0
CI_FR = common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key="FR",
                             carbon_signal=common_pb2.CARBON_SIGNAL_DIRECT)


def points(hours: int) -> list[common_pb2.TimeSeriesPoint]:
    rng = np.random.default_rng(0)
    values = 200 + 60 * np.sin(2 * np.pi * np.arange(hours) / 24) + rng.normal(0, 10, hours)
    return [common_pb2.TimeSeriesPoint(time=Timestamp(seconds=DAY0_S + i * 3600), value=float(v))
            for i, v in enumerate(values)]


def fit_workers(pid: int) -> list[int]:
    """The forecaster's spawned pool workers (not multiprocessing's resource tracker)."""
    out = []
    for child in descendants_of(pid):
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(child)
        except OSError:
            continue
    return out


def fitted_rows(data_dir: Path) -> int:
    with sqlite3.connect(data_dir / "forecaster.db") as db:
        return db.execute("SELECT count(*) FROM fitted_models").fetchone()[0]


async def test_sigterm_during_fits_stops_the_service_and_its_workers_within_the_grace(tmp_path) -> None:
    port = free_port()
    env = {"GREENSERVE_FIT_WORKERS": "2", "GREENSERVE_SHUTDOWN_GRACE_S": str(GRACE_S),
           "GREENSERVE_FORECAST_MODEL": "auto", "GREENSERVE_FIT_HISTORY_HOURS": "720"}
    proc = start_forecaster(tmp_path, port, **env)
    family: list[int] = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
            # two month-long backtests (30 fits of `auto` on 720 h each: minutes) hold both workers ...
            month = forecaster_pb2.InlineSeries(points=points(24 * 60))
            backtests = [asyncio.ensure_future(stub.Backtest(forecaster_pb2.BacktestRequest(
                inline=month, history_hours=720, days=30, model="auto"))) for _ in range(2)]
            # ... and a stored series' first fit waits behind them
            await stub.IngestPoints(forecaster_pb2.IngestPointsRequest(series=CI_FR, resolution_s=3600,
                                                                       points=points(24 * 40)))
            deadline = time.monotonic() + 60
            while len(fit_workers(proc.pid)) < 2:
                assert time.monotonic() < deadline, "the two fit workers never started"
                assert not any(b.done() for b in backtests), [b.exception() for b in backtests if b.done()]
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)  # the workers are mid-fit (a backtest's first fit takes over a second)
            assert not any(b.done() for b in backtests)
            family = descendants_of(proc.pid)

            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            while proc.poll() is None and time.monotonic() - t0 < GRACE_S + SLACK_S + 30:
                await asyncio.sleep(0.05)
            took = time.monotonic() - t0
            assert proc.poll() == 0, f"SIGTERM: still running {took:.1f} s later"
            assert took <= GRACE_S + SLACK_S, f"SIGTERM took {took:.1f} s (grace {GRACE_S} s)"
            # the resource tracker ends once it reads the end of its pipe, a moment after its parent's exit
            left = wait_until_gone(family, max(0.0, t0 + GRACE_S + SLACK_S - time.monotonic()))
            assert not left, f"outlived their forecaster's SIGTERM by more than the slack: {left}"
            # the backtests in flight end with an error, none with a result computed after the stop
            for backtest in backtests:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await asyncio.wait_for(backtest, 10)
                assert err.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
        assert fitted_rows(tmp_path) == 0  # the interrupted fit of FR was not stored

        # the same database serves again: the series is there, forecast (seasonal naive until its fit is done)
        proc = start_forecaster(tmp_path, port, **{**env, "GREENSERVE_FORECAST_MODEL": "seasonal_naive"})
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
            reply = await stub.GetForecast(forecaster_pb2.GetForecastRequest(series=CI_FR), timeout=30)
            assert len(reply.forecast.points) == 24
    finally:
        for pid in pids_alive(family):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
