"""Fixtures of the profiler tests: a profiler served in-process and small sweep specs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from greenserve.profiler.service import ProfilerSettings, build
from greenserve.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc

SLO = common_pb2.Slo(ttft_s=1.0, tpot_s=0.1, attainment_fraction=0.9)


def config(**kw: Any) -> common_pb2.ProfileConfig:
    return common_pb2.ProfileConfig(**({"model": "llama3-8b", "hardware": "H100-80GB"} | kw))


def sim_spec(rates=(1.0, 2.0, 4.0, 8.0, 16.0), configs=None, **kw: Any) -> profiler_pb2.SweepSpec:
    values: dict[str, Any] = {
        "backend": profiler_pb2.SWEEP_BACKEND_SIMULATOR, "workload": "zipf-docs", "slo": SLO,
        "request_rates_per_s": list(rates), "point_duration_s": 60.0,
        "configs": configs if configs is not None else [config()],
    }
    return profiler_pb2.SweepSpec(**(values | kw))


@pytest.fixture
async def profiler(start_inprocess) -> AsyncIterator[Callable[..., Any]]:
    """`stub = await profiler(**settings)`: a ProfilerService stub on a fresh in-process profiler."""
    channels: list[grpc.aio.Channel] = []

    async def start(**settings: Any) -> profiler_pb2_grpc.ProfilerServiceStub:
        svc = await start_inprocess(ProfilerSettings, build, **({"log_json": False} | settings))
        channel = grpc.aio.insecure_channel(svc.address)
        channels.append(channel)
        return profiler_pb2_grpc.ProfilerServiceStub(channel)

    yield start
    for channel in channels:
        await channel.close()


async def wait_state(stub, sweep_id: str, states: set[int], timeout_s: float = 60.0) -> profiler_pb2.Sweep:
    import asyncio
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sweep = (await stub.GetSweep(profiler_pb2.GetSweepRequest(sweep_id=sweep_id))).sweep
        if sweep.state in states:
            return sweep
        await asyncio.sleep(0.05)
    raise AssertionError(f"sweep {sweep_id} not in {states} within {timeout_s} s")
