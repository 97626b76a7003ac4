"""``python -m greenserve.bench.router_bookkeeping``: CPU per request of the router's bookkeeping, outside
the forwarding path: prefix hashing, the routing policy's choice, the prefix index
insert, the engine's energy accounting at start and end, ``RouterCore.finish`` (receipt, SLO attainment,
prometheus metrics) with the receipt's JSON form, and the OTel receipt metrics' flush.

It drives a real ``RouterCore`` (no database, no peers, no engines reached: no I/O) in one thread and
times each stage with ``time.thread_time``, so other jobs on the machine change the figures much less than
they change a whole-router benchmark's (where this work is 5-15 % of a request's CPU). Run it under
``PROMETHEUS_MULTIPROC_DIR=<empty dir>`` to measure the prometheus values as the router's workers update
them (file-backed).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

from greenserve.common.cli_parser import Parser

STAGES = ("hash", "choose", "insert", "start", "end", "finish", "flush")


async def measure(requests: int, prompt_chars: int, engines: int, metric_reader: bool, seed: int = 1
                  ) -> dict[str, Any]:
    """Microseconds of thread CPU per request for each stage, and the router's request count as /metrics
    would report it (a check that every request was counted)."""
    from greenserve.common.telemetry import setup_telemetry
    from greenserve.router.core import CoreConfig, RouterCore
    from greenserve.router.routing.engines import EngineState
    from greenserve.router.routing.prefix_index import chain_hashes
    from greenserve.router.upstream.dispatcher import Call
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    if requests < 1 or prompt_chars < 1 or engines < 1:
        raise ValueError("requests, prompt_chars and engines must be >= 1")
    telemetry = setup_telemetry("bench-bookkeeping", install_global=False,
                                metric_reader=InMemoryMetricReader() if metric_reader else None)
    core = RouterCore(CoreConfig(watch_plans=False, feeds=False), None, telemetry.meter)
    for i in range(engines):
        core.add_engine(EngineState(id=f"e{i}", url=f"http://127.0.0.1:{9000 + i}", pool="default", model="m",
                                    source="flag"), persist=False)
    rnd = random.Random(seed)
    prompts = ["".join(rnd.choice("abcdefgh ") for _ in range(prompt_chars)) for _ in range(64)]
    spent = dict.fromkeys(STAGES, 0.0)
    clock = time.thread_time
    block_chars = core.config.prefix_block_chars
    for i in range(requests):
        prompt = prompts[i % len(prompts)]
        if not core.admit():
            raise RuntimeError("in-flight limit reached")
        t0 = clock()
        hashes = chain_hashes(prompt, block_chars)
        t1 = clock()
        decision = core.policy.choose("", "m", hashes, "", set())
        t2 = clock()
        core.index.insert(decision.engine.id, hashes)
        t3 = clock()
        now = time.monotonic()
        acc = decision.engine.start_request(now, core.saturation_requests)
        t4 = clock()
        call = Call(decision=decision, engine=decision.engine, response=None, t0=now - 0.01,  # type: ignore[arg-type]
                    t_first=now - 0.009, acc_start=acc, usage={"prompt_tokens": prompt_chars // 4,
                                                               "completion_tokens": 8}, events=8, hashes=hashes)
        t5 = clock()
        end = decision.engine.end_request(time.monotonic(), core.saturation_requests)
        t6 = clock()
        core.finish(call, "http", end, len(prompt)).to_json()
        core.release()
        t7 = clock()
        spent["hash"] += t1 - t0
        spent["choose"] += t2 - t1
        spent["insert"] += t3 - t2
        spent["start"] += t4 - t3
        spent["end"] += t6 - t5
        spent["finish"] += t7 - t6
        if i % 1000 == 999 or i == requests - 1:  # the receipt metrics' background flush, once a second live
            t8 = clock()
            core.receipt_metrics.flush()
            spent["flush"] += clock() - t8
            await asyncio.sleep(0)
    counted = 0.0
    for family in text_string_to_metric_families(generate_latest(core.prom).decode()):
        if family.name == "greenserve_router_requests":
            counted = sum(s.value for s in family.samples if s.name.endswith("_total"))
    us = {stage: round(1e6 * value / requests, 2) for stage, value in spent.items()}
    return {"us_per_request": us, "total_us_per_request": round(sum(us.values()), 2), "requests": requests,
            "requests_counted": counted, "prompt_chars": prompt_chars, "engines": engines,
            "metric_reader": metric_reader}


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m greenserve.bench.router_bookkeeping",
                    description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000, help="requests per run")
    parser.add_argument("--prompt-chars", type=int, default=1024, help="prompt length (the router bench's default)")
    parser.add_argument("--engines", type=int, default=2, help="engines in the pool")
    parser.add_argument("--metric-reader", action="store_true",
                        help="an OTel metric reader is set (as with an OTLP endpoint): the receipt metrics are kept")
    parser.add_argument("--runs", type=int, default=1, help="runs, one JSON line each")
    args = parser.parse_args(argv)
    for _ in range(args.runs):
        try:
            result = asyncio.run(measure(args.requests, args.prompt_chars, args.engines, args.metric_reader))
        except ValueError as exc:
            parser.error(str(exc))
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
