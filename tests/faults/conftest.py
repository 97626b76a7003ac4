"""Fixtures and helpers of the fault tests (issue 36): emulated engines and routers (the router tests' fixtures),
and waiting for a condition."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from tests.forecaster.process import start_forecaster
from tests.optimizer.conftest import ci_ref, ingest_daily, load_ref
from tests.process import start_service_process
from tests.router.conftest import emulators, router  # noqa: F401  (fixtures)


async def until(predicate: Callable[[], Awaitable[object] | object], timeout_s: float, what: str,
                every_s: float = 0.1) -> None:
    """Waits until ``predicate()`` (awaited when it answers an awaitable) is true; fails naming ``what`` after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(every_s)


async def seeded_forecaster(tmp_path: Path, fc_port: int) -> subprocess.Popen[bytes]:
    """A forecaster process (seasonal naive) with a FR CI history and a `chat` load history ingested."""
    forecaster = await asyncio.to_thread(start_forecaster, tmp_path / "forecaster", fc_port,
                                         GREENSERVE_FORECAST_MODEL="seasonal_naive")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{fc_port}") as fc:
            await ingest_daily(fc, ci_ref("FR"), 60.0, 25.0)
            await ingest_daily(fc, load_ref("chat"), 1.0, 0.5)
    except BaseException:
        forecaster.kill()
        forecaster.wait()
        raise
    return forecaster


async def start_optimizer(tmp_path: Path, port: int, fc_port: int, *extra_args: str) -> subprocess.Popen[bytes]:
    """An optimizer process on ``port`` planning from the forecaster on ``fc_port`` (only the routing knob solved,
    no scheduled plans, profiler and cache-manager unreachable)."""
    return await asyncio.to_thread(
        start_service_process, "greenserve.optimizer", "greenserve.v1.OptimizerService", tmp_path / "opt", port,
        env={}, log_name="optimizer.log",
        extra_args=[*extra_args, f"--forecaster-addr=127.0.0.1:{fc_port}", "--profiler-addr=127.0.0.1:9",
                    "--cache-manager-addr=127.0.0.1:9", "--no-schedule-plans", "--cache-solver=keep",
                    "--mig-solver=keep", "--modes-solver=keep", "--log-level=WARNING"])
