"""The profiler's queue of sweeps waiting to run is bounded: past MAX_QUEUED_SWEEPS a StartSweep is
RESOURCE_EXHAUSTED and nothing is stored.

Every accepted sweep waits in an in-memory queue (and a PENDING row) until the one worker gets to it, and nothing
limited how many: a caller could queue sweeps without end, growing memory and the work queued behind them. Found
by an adversarial audit of StartSweep (failed before the fix: the sweep past the limit was accepted)."""

from __future__ import annotations

import grpc
import pytest

from greenserve.profiler import sweeps
from greenserve.v1 import profiler_pb2

from .conftest import config, sim_spec


async def test_start_sweep_past_the_queue_limit_is_resource_exhausted(profiler, monkeypatch) -> None:
    monkeypatch.setattr(sweeps, "MAX_QUEUED_SWEEPS", 2, raising=False)
    stub = await profiler(import_published=False)
    # long enough that the first one is still running while the others are submitted
    spec = sim_spec(rates=[0.5 * (i + 1) for i in range(10)], configs=[config(cache_dram_bytes=g << 30) for g in range(8)],
                    workload="poisson", point_duration_s=40.0)
    started = [(await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))).sweep.id for _ in range(3)]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value.details()
    listed = (await stub.ListSweeps(profiler_pb2.ListSweepsRequest())).sweeps
    assert sorted(s.id for s in listed) == sorted(started)
    # a cancelled waiting sweep gives its place back at once (the worker is still busy with the first)
    await stub.CancelSweep(profiler_pb2.CancelSweepRequest(sweep_id=started[2]))
    started.append((await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))).sweep.id)
    for sweep_id in (started[0], started[1], started[3]):
        await stub.CancelSweep(profiler_pb2.CancelSweepRequest(sweep_id=sweep_id))
