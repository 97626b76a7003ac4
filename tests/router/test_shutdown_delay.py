"""`--shutdown-delay-s`: on SIGTERM the router reports that it stops (gRPC health NOT_SERVING, HTTP /health 503
"stopping") and keeps serving for the delay, so that a gateway or load balancer that health-checks it stops sending
before it refuses anything; then it drains within `--shutdown-grace-s` and exits 0. Without the delay, gRPC Python
answers CANCELLED to a call that arrives once the stop has begun. One process, and two workers (the supervisor
forwards the signal and waits for the delay too)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from greenserve.v1 import router_pb2, router_pb2_grpc
from tests.conftest import free_port

DELAY_S = 8.0  # long enough for the checks below on a loaded machine
GRACE_S = 2.0
READY_WITHIN_S = 120.0  # the router imports grpc, SQLAlchemy, OTel...: slow on a loaded 2-core machine


def _log(tmp_path: Path) -> str:
    return (tmp_path / "router.log").read_text(errors="replace")[-3000:]


async def _http_health(http: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s, \
            s.get(http + "/health") as resp:
        return resp.status, await resp.json()


async def _http_completion(http: str, model: str) -> int:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s, \
            s.post(http + "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2}) as resp:
        await resp.read()
        return resp.status


async def _grpc_generate(port: int, model: str) -> router_pb2.GenerateReply:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        request = router_pb2.GenerateRequest(
            request=router_pb2.RequestDescriptor(model=model, completion=router_pb2.CompletionInput(prompt="hi")),
            sampling=router_pb2.SamplingParams(max_tokens=2))
        replies = [m async for m in router_pb2_grpc.RouterServiceStub(channel).Generate(request, timeout=10)]
    return replies[-1]


async def _grpc_health(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
async def test_the_router_reports_stopping_and_keeps_serving_for_the_delay(tmp_path: Path, emulators,
                                                                           workers: int) -> None:
    (emu,) = await emulators(1, time_scale=1.0)
    port, http_port = free_port(), free_port()
    http = f"http://127.0.0.1:{http_port}"
    argv = [sys.executable, "-m", "greenserve.router", "--host", "127.0.0.1", "--port", str(port),
            "--http-port", str(http_port), "--data-dir", str(tmp_path / "data"), "--workers", str(workers),
            "--no-watch-plans", "--no-feeds", "--health-interval-s", "0.5", "--engines", emu.url,
            "--shutdown-delay-s", str(DELAY_S), "--shutdown-grace-s", str(GRACE_S)]
    with open(tmp_path / "router.log", "ab") as out:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=out)
    try:
        deadline = time.monotonic() + READY_WITHIN_S
        while True:
            assert proc.poll() is None, f"router exited {proc.returncode}: {_log(tmp_path)}"
            assert time.monotonic() < deadline, f"router not serving: {_log(tmp_path)}"
            try:
                if (await _http_health(http))[0] == 200:
                    break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
        assert await _grpc_health(port) == health_pb2.HealthCheckResponse.SERVING

        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        await asyncio.sleep(0.5)  # the signal reached the process (and, with workers, was forwarded)
        # within the delay: every surface says it stops, and every call is still served
        assert await _grpc_health(port) == health_pb2.HealthCheckResponse.NOT_SERVING
        for _ in range(2 * workers):  # a new connection each time: with workers, the kernel spreads them
            status, body = await _http_health(http)
            assert (status, body["status"]) == (503, "stopping"), body
            assert await _http_completion(http, emu.model) == 200
            last = await _grpc_generate(port, emu.model)
            assert last.finish_reason and last.HasField("receipt")
        assert time.monotonic() - signalled < DELAY_S, "the checks above outlasted the delay: nothing was shown"

        exit_code = await asyncio.to_thread(proc.wait, 60)
        stopped_after_s = time.monotonic() - signalled
        assert exit_code == 0, _log(tmp_path)
        assert stopped_after_s >= DELAY_S, f"stopped {stopped_after_s:.1f} s after SIGTERM, before the delay"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
