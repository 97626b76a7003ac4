"""The load generator of ``greenserve bench router`` (bench.py), run in processes of its own (``loadgen_entry``,
started by bench_measure.run_loads): closed-loop streams over HTTP or gRPC, desynchronised as bench.py's
docstring describes; it returns the raw samples (TTFT, E2E, errors, CPU) that bench_measure summarises."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def token_counts(seed: int, stream: int, lo: int, hi: int) -> Iterator[int]:
    """max_tokens of one stream's successive requests, uniform in [lo, hi]: seeded by (seed, stream),
    so every target of a run gets the same sequence."""
    rng = random.Random(seed * 1_000_003 + stream)
    while True:
        yield rng.randint(lo, hi)


async def loadgen(cfg: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    concurrency = cfg["concurrency"]
    total = cfg["requests"]
    ttfts: list[float] = []
    e2es: list[float] = []
    ends: list[float] = []
    errors = 0
    counter = {"next": 0}
    prompt_base = cfg["prompt"]
    body_tpl = {"model": cfg["model"], "stream": True}
    # Desynchronised streams (see the module docstring): each stream's first request waits a random
    # fraction of ``stagger_s``, every request asks for a random number of tokens in max_tokens x
    # (1 +/- spread), and requests sent before ``stagger_s`` has passed are the ramp, not measured.
    stagger_s = float(cfg.get("stagger_s", 0.0))
    spread = float(cfg.get("max_tokens_spread", 0.0))
    lo_tokens = max(1, round(cfg["max_tokens"] * (1.0 - spread)))
    hi_tokens = max(lo_tokens, round(cfg["max_tokens"] * (1.0 + spread)))
    seed = int(cfg.get("seed", 0))

    # Time-bounded runs (``duration_s``): no new request starts after the deadline; every process of a
    # run starts at the same wall-clock instant (``start_at``) so that their loads overlap.
    duration_s = cfg.get("duration_s")
    start_at = cfg.get("start_at")
    if start_at:
        await asyncio.sleep(max(0.0, start_at - time.time()))
    begin = time.perf_counter()
    measure_from = begin + stagger_s
    stop_at = measure_from + duration_s if duration_s else None
    last_start = {"t": begin}
    cpu0 = time.process_time()
    offset = cfg.get("index_offset", 0)

    def next_index() -> int | None:
        i = counter["next"]
        if i >= total or (stop_at is not None and time.perf_counter() >= stop_at):
            return None
        counter["next"] = i + 1
        last_start["t"] = time.perf_counter()
        return i + offset

    def record(t0: float, first: float | None) -> None:
        """One finished request: a stream that never produced a first chunk counts as an error;
        requests of the ramp (sent before ``measure_from``) are not measured."""
        nonlocal errors
        if first is None:
            errors += 1
            return
        if t0 < measure_from:
            return
        now = time.perf_counter()
        ttfts.append(first - t0)
        e2es.append(now - t0)
        ends.append(now)

    def stream_tokens(w: int) -> Iterator[int]:
        return token_counts(seed, offset + w, lo_tokens, hi_tokens)

    async def run_workers(worker: Any) -> float:
        async def delayed(w: int) -> None:
            if stagger_s > 0:
                await asyncio.sleep(random.Random(seed * 7919 + offset + w).uniform(0.0, stagger_s))
            await worker(w)

        await asyncio.gather(*(delayed(w) for w in range(concurrency)))
        # steady-state throughput: requests completed between the end of the ramp and the last
        # request sent (after it, streams only drain)
        done = [t for t in ends if t <= last_start["t"]]
        window = last_start["t"] - measure_from
        if len(done) >= 10 and window > 0:
            return window * len(ttfts) / len(done)
        return max(1e-9, (max(ends) if ends else time.perf_counter()) - measure_from)

    grpc_messages: list[int] = []  # messages per measured gRPC request
    if cfg["protocol"] == "grpc":
        import grpc
        from greenserve.v1 import router_pb2, router_pb2_grpc

        channels = [grpc.aio.insecure_channel(cfg["targets"][0], options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(max(1, min(8, concurrency // 64)))]
        stubs = [router_pb2_grpc.RouterServiceStub(c) for c in channels]

        async def worker(w: int) -> None:
            nonlocal errors
            stub = stubs[w % len(stubs)]
            tokens = stream_tokens(w)
            while (i := next_index()) is not None:
                req = router_pb2.GenerateRequest(
                    request=router_pb2.RequestDescriptor(model=cfg["model"], completion=router_pb2.CompletionInput(
                        prompt=f"{prompt_base} #{i}")),
                    sampling=router_pb2.SamplingParams(max_tokens=next(tokens)))
                t0 = time.perf_counter()
                first = None
                n = 0
                try:
                    async for msg in stub.Generate(req):
                        n += 1
                        if first is None and msg.text_delta:
                            first = time.perf_counter()
                except grpc.aio.AioRpcError:
                    errors += 1
                    continue
                record(t0, first)
                if first is not None and t0 >= measure_from:
                    grpc_messages.append(n)  # a message carries one or more tokens (the router's interval)

        elapsed = await run_workers(worker)
        for c in channels:
            await c.close()
    else:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
            targets = cfg["targets"]

            async def worker(w: int) -> None:
                nonlocal errors
                tokens = stream_tokens(w)
                while (i := next_index()) is not None:
                    url = targets[i % len(targets)] + "/v1/completions"
                    body = dict(body_tpl, prompt=f"{prompt_base} #{i}", max_tokens=next(tokens))
                    t0 = time.perf_counter()
                    first = None
                    try:
                        async with session.post(url, json=body) as resp:
                            if resp.status != 200:
                                await resp.read()
                                errors += 1
                                continue
                            async for chunk in resp.content.iter_any():
                                if first is None and chunk:
                                    first = time.perf_counter()
                    except (TimeoutError, aiohttp.ClientError, OSError):
                        errors += 1
                        continue
                    record(t0, first)

            elapsed = await run_workers(worker)
    return {"ttfts": ttfts, "e2es": e2es, "errors": errors, "elapsed_s": elapsed, "cpu_s": time.process_time() - cpu0,
            "wall_s": time.perf_counter() - begin, "grpc_messages": grpc_messages}


def loadgen_entry() -> None:
    """Entry of the load-generator process: config JSON in the file named by argv[1] (or on stdin);
    the result JSON goes to the file the config names."""
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    cfg = json.loads(Path(sys.argv[1]).read_text() if len(sys.argv) > 1 else sys.stdin.read())
    result = asyncio.run(loadgen(cfg))
    with open(cfg["out"], "w") as fh:  # a file, not a pipe: thousands of samples make a large object
        json.dump(result, fh)
