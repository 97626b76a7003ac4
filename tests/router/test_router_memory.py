"""The router process's resident memory under a sustained stream of requests levels off under a stated
bound (issue 21; the bound and the flags that set it are in docs/router.md, "Limits and memory").

A router process routes, for a bounded time, a stream of requests with ever new prompts and session keys
(the structures that grow with traffic: the prefix index, the session table) to emulated engines, over
HTTP (streamed and not, chat and completions) and gRPC, plus refused requests (over the body limit, bad
JSON, deeply nested JSON, no such route). Its caps are set small so that they are reached within
the test: from then on memory must stop growing.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import grpc
import pytest

from greenserve.v1 import router_pb2, router_pb2_grpc
from tests.conftest import free_port
from tests.process import rss_bytes

pytestmark = pytest.mark.timeout(180)
WORKERS = 12
WARMUP_S = 2.0
LOAD_S = float(os.environ.get("GREENSERVE_MEMORY_TEST_S", "6"))
RSS_BOUND_MIB = 400
"""The stated bound (docs/router.md): a router with these caps stays under it (measured: see the docs)."""
GROWTH_LIMIT_MIB = 12
"""Largest rise allowed between the first and the last third of the measured window (levelled off)."""


async def _worker(w: int, http: str, grpc_address: str, model: str, stop: asyncio.Event,
                  counts: dict[str, int]) -> None:
    rng = random.Random(w)
    async with aiohttp.ClientSession() as s, grpc.aio.insecure_channel(grpc_address) as channel:
        stub = router_pb2_grpc.RouterServiceStub(channel)
        n = 0
        while not stop.is_set():
            n += 1
            prompt = f"worker {w} request {n} " + "".join(rng.choice("abcdefgh ") for _ in range(1500))
            session = {"x-greenserve-session": f"s-{w}-{n}"}
            kind = n % 8
            if kind == 0:  # gRPC Generate
                request = router_pb2.GenerateRequest(request=router_pb2.RequestDescriptor(
                    model=model, session_key=f"g-{w}-{n}", completion=router_pb2.CompletionInput(prompt=prompt)),
                    sampling=router_pb2.SamplingParams(max_tokens=4))
                async for _ in stub.Generate(request):
                    pass
                counts["ok"] += 1
                continue
            if kind == 1:  # refused before the body is read, or as malformed
                bad = [b"[" * 5000 + b"]" * 5000, b"{not json",
                       b'{"model":"m","prompt":' + b"[" * 70 + b"]" * 70 + b"}"]
                async with s.post(http + "/v1/completions", data=bad[n % 3],
                                  headers={"Content-Type": "application/json"}) as resp:
                    assert resp.status == 400, await resp.text()
                async with s.post(http + "/v1/completions", data=b"x" * 70_000) as resp:
                    assert resp.status == 413
                counts["refused"] += 2
                continue
            chat = kind % 2 == 0
            body: dict = {"model": model, "max_tokens": 4, "stream": kind in (2, 3, 4)}
            if chat:
                body["messages"] = [{"role": "user", "content": prompt}]
            else:
                body["prompt"] = prompt
            path = "/v1/chat/completions" if chat else "/v1/completions"
            async with s.post(http + path, data=json.dumps(body), headers=session) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
            counts["ok"] += 1


async def test_router_memory_levels_off_under_a_sustained_stream(tmp_path: Path, emulators) -> None:
    emus = await emulators(2, time_scale=200.0)
    port, http_port = free_port(), free_port()
    env = {**os.environ, "GREENSERVE_WATCH_PLANS": "false", "GREENSERVE_FEEDS": "false",
           "GREENSERVE_LOG_LEVEL": "WARNING"}
    argv = [sys.executable, "-m", "greenserve.router", "--host", "127.0.0.1", "--port", str(port),
            "--http-port", str(http_port), "--data-dir", str(tmp_path), "--engines", ",".join(e.url for e in emus),
            "--prefix-index-max-bytes", str(256 * 1024), "--max-sessions", "2000",
            "--http-max-body-bytes", str(64 * 1024), "--workers", "1"]  # one process: its RSS is the router's
    with open(tmp_path / "router.log", "ab") as log:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log)
    http = f"http://127.0.0.1:{http_port}"
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(600):
                assert proc.poll() is None, (tmp_path / "router.log").read_text()[-2000:]
                try:
                    async with s.get(http + "/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        stop = asyncio.Event()
        counts = {"ok": 0, "refused": 0}
        workers = [asyncio.create_task(_worker(w, http, f"127.0.0.1:{port}", emus[0].model, stop, counts))
                   for w in range(WORKERS)]
        await asyncio.sleep(WARMUP_S)
        samples: list[float] = []
        started = time.monotonic()
        while time.monotonic() - started < LOAD_S:
            samples.append(rss_bytes(proc.pid) / 2**20)
            if any(t.done() for t in workers):
                break
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*workers)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    third = max(1, len(samples) // 3)
    first, last = max(samples[:third]), max(samples[-third:])
    print(f"router RSS MiB: start {samples[0]:.1f}, max {max(samples):.1f}, first third max {first:.1f}, "
          f"last third max {last:.1f}; requests ok {counts['ok']}, refused {counts['refused']}; every 5 s: "
          f"{[round(x, 1) for x in samples[::25]]}")
    assert counts["ok"] >= 200, counts
    assert max(samples) < RSS_BOUND_MIB, samples
    assert last - first < GROWTH_LIMIT_MIB, samples
