"""Load benchmark of one ``greenserve-engine-sim`` process: how many concurrent streams and tokens/s it sustains.

Starts the emulator as a subprocess (so the load generator does not share its event loop), opens
``--streams`` concurrent streaming completions of ``--max-tokens`` tokens each, and reports what the
clients received and how closely the emulator kept to its modelled pace:

* ``tokens_per_second``: SSE token chunks received by all clients per wall second;
* ``max_concurrent_streams``: streams open at the same time (client side), and the largest
  ``vllm:num_requests_running`` scraped during the run;
* ``pace_ratio``: the requests' modelled end-to-end seconds (``vllm:e2e_request_latency_seconds``)
  / time_scale, over what the clients measured; 1.0 means the emulator kept its modelled pace,
  below 1.0 means the host (CPU, HTTP) added time the modelled engine would not have;
* ``server_cpu_seconds``: CPU time the emulator process used (user + system).

Last line of stdout is one JSON object (``greenserve bench`` convention).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from greenserve.common.cli_parser import Parser

PREFIX = "greenserve-engine-sim listening on "


def _cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process (Linux /proc); 0.0 where /proc is unavailable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


async def _scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples if "le" not in s.labels}


async def _run_load(url: str, model: str, streams: int, max_tokens: int, prompt_words: int) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    open_now = 0
    max_open = 0
    tokens = 0
    errors = 0
    ttfts: list[float] = []
    e2es: list[float] = []
    max_running = 0.0
    done = asyncio.Event()

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        before = await _scrape(session, url)

        async def one(i: int) -> None:
            nonlocal open_now, max_open, tokens, errors
            prompt = f"request {i}: " + " ".join(f"w{(i * 7 + j) % 500}" for j in range(prompt_words))
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
            t0 = time.perf_counter()
            first = True
            try:
                async with session.post(url + "/v1/completions", json=body) as resp:
                    if resp.status != 200:
                        errors += 1
                        return
                    open_now += 1
                    max_open = max(max_open, open_now)
                    try:
                        # count events per received chunk (cheap client: the emulator is what is measured)
                        async for data in resp.content.iter_any():
                            n = data.count(b"data: {")
                            if n:
                                if first:
                                    ttfts.append(time.perf_counter() - t0)
                                    first = False
                                tokens += n
                    finally:
                        open_now -= 1
                e2es.append(time.perf_counter() - t0)
            except aiohttp.ClientError:
                errors += 1

        async def watch() -> None:
            nonlocal max_running
            while not done.is_set():
                m = await _scrape(session, url)
                max_running = max(max_running, m.get("vllm:num_requests_running", 0.0))
                await asyncio.sleep(0.25)

        watcher = asyncio.create_task(watch())
        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(streams)))
        wall = time.perf_counter() - start
        done.set()
        await watcher
        after = await _scrape(session, url)
    ttfts.sort()
    return {
        "wall_seconds": wall,
        "tokens": tokens,
        "errors": errors,
        "max_open": max_open,
        "max_running": max_running,
        "ttft_p50_s": ttfts[len(ttfts) // 2] if ttfts else None,
        "ttft_p99_s": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))] if ttfts else None,
        "engine_generated": after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"],
        "client_e2e_sum_s": sum(e2es),
        "engine_e2e_sum_s": after["vllm:e2e_request_latency_seconds_sum"] - before["vllm:e2e_request_latency_seconds_sum"],
    }


def main(argv: list[str], prog: str = "greenserve bench engine-sim") -> int:
    """Run the load benchmark; prints progress to stderr and one JSON object last on stdout."""
    p = Parser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=1000, help="concurrent streaming requests (default 1000)")
    p.add_argument("--max-tokens", type=int, default=200, help="tokens per request (default 200)")
    p.add_argument("--prompt-words", type=int, default=100, help="prompt length in words (default 100)")
    p.add_argument("--time-scale", type=float, default=1.0, help="emulator --time-scale (default 1: real time)")
    p.add_argument("--profile", default=None, help="emulator --profile")
    p.add_argument("--json", action="store_true", help="accepted for symmetry; the last line is always JSON")
    args = p.parse_args(argv)
    if args.streams < 1 or args.max_tokens < 1 or args.time_scale <= 0:
        p.error("--streams and --max-tokens must be >= 1, --time-scale > 0")
    cmd = [sys.executable, "-m", "greenserve.simulator.emulator", "--port", "0", "--model", "bench",
           "--time-scale", str(args.time_scale), "--max-num-seqs", str(max(args.streams, 1))]
    if args.profile:
        cmd += ["--profile", args.profile]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith(PREFIX):
            print(f"{prog}: emulator did not start: {line!r}", file=sys.stderr)
            return 1
        url = line[len(PREFIX):]
        print(f"{prog}: emulator at {url}; {args.streams} streams x {args.max_tokens} tokens", file=sys.stderr)
        cpu0 = _cpu_seconds(proc.pid)
        res = asyncio.run(_run_load(url, "bench", args.streams, args.max_tokens, args.prompt_words))
        cpu = _cpu_seconds(proc.pid) - cpu0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    wall = res["wall_seconds"]
    out = {
        "streams": args.streams,
        "max_tokens": args.max_tokens,
        "time_scale": args.time_scale,
        "wall_seconds": round(wall, 3),
        "tokens": res["tokens"],
        "errors": res["errors"],
        "tokens_per_second": round(res["tokens"] / wall, 1),
        "max_concurrent_streams": res["max_open"],
        "max_num_requests_running": res["max_running"],
        "ttft_p50_s": res["ttft_p50_s"],
        "ttft_p99_s": res["ttft_p99_s"],
        "engine_generated_tokens": res["engine_generated"],
        "pace_ratio": round(res["engine_e2e_sum_s"] / args.time_scale / max(res["client_e2e_sum_s"], 1e-9), 3),
        "server_cpu_seconds": round(cpu, 2),
    }
    print(json.dumps(out))
    return 0 if res["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
