"""Router replicas on one database: how fast a registration reaches every replica, and what four replicas
cost in prefix-cache hit rate against one.

Runs alone (``greenserve bench router-replicas``) or as a phase of ``greenserve bench router``
(``--replicas-phase``); prints progress to stderr and one JSON object on the last line.

Set-up: a throw-away PostgreSQL cluster (greenserve.bench.pg_server, as the tests start one; one fresh
database per run), or, without the PostgreSQL binaries, one SQLite file shared by the replicas (the JSON
says which). Each replica is a router process (``--workers 1``) with ``--db-url`` on that database and its
own ``--replica-id``; the engines are emulated (greenserve-engine-sim, real prefix cache), started fresh
for each run so that every run begins with empty caches. Engines are registered through replica 0 only.

Figures:

* ``replica_registration_propagation_ms``: RegisterEngine of a new engine (alone in a new pool) on one
  replica, then every replica is asked to route a request for that pool (``Route``, the routing
  decision without the engine's reply, every 20 ms) until it picks the new engine; the time until the
  last replica does, from just before RegisterEngine was sent. Then one ``Generate`` through every
  replica must be served by the new engine (counted in ``generate_checks_failed``). Repeated
  ``--trials`` times (origin replica rotating); the figure is the worst trial, the median is given
  too. Bound: 1,000 ms.
* ``replica_prefix_hit_rate_loss_pts``: prefix-cache hit rate (the engines' own
  vllm:prefix_cache_hits / queries, in tokens, summed over engines) with one replica minus with four,
  in percentage points, on the same requests (four replicas: request i goes to replica i mod 4,
  round robin). Goal: <= 2 points.

The trace: the Mooncake FAST'25 conversation trace (real prefix structure: each request's 512-token
blocks as hash ids) shipped with the package (simulator.workloads.trace_path); with ``--trace multiturn``
(or should an install lack the file), GreenCache-style multi-turn conversations
(simulator.workloads.multi_turn_workload, the conversations the evaluation replays). The Azure LLM
conversation trace has no prefix information (token counts only), so it cannot measure a hit rate.
Each request becomes a chat: the text of its first block is the system message, of its second block
the first user message, of the rest a second user message, each block id rendered as the same
``--block-tokens`` words everywhere (so equal ids are equal text: prefix-cache hits on the engines).
The first two blocks identify the conversation in both traces (Mooncake's first block is one system
prompt shared by every request). A request waits for the earlier request it shares the longest prefix
with (a conversation's previous turn) to finish, as a user waits for an answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from greenserve.common.cli_parser import Parser

MODEL = "bench-model"
PROPAGATION_BOUND_MS = 1000.0


def _log(msg: str) -> None:
    print(f"[bench router-replicas] {msg}", file=sys.stderr, flush=True)


# -- the trace -------------------------------------------------------------------------------------------


def load_trace(limit: int, source: str) -> tuple[str, list[tuple[int, ...]]]:
    """(description, block-id tuples of the first ``limit`` requests)."""
    from greenserve.simulator.workloads import multi_turn_workload, trace_path

    path = None
    if source in ("auto", "mooncake"):
        try:
            path = trace_path("mooncake")
        except FileNotFoundError as exc:
            if source == "mooncake":
                raise SystemExit(str(exc)) from None
    if path is not None:
        rows = []
        with open(path) as f:
            for line in f:
                rows.append(tuple(json.loads(line)["hash_ids"]))
                if len(rows) >= limit:
                    break
        return f"Mooncake FAST'25 conversation trace, first {len(rows)} requests", rows
    w = multi_turn_workload(max(4, limit // 4), 1.0, seed=0)
    rows = [tuple(h) for h in w.block_hashes[:limit]]
    return f"multi-turn conversations (simulator.workloads.multi_turn_workload, seed 0), {len(rows)} requests", rows


_WORDS = [a + b + c + d for a in "bdfklmnprst" for b in "aeiou" for c in "lmnrs" for d in "aeiou"][:2048]


def block_text(block_id: int, tokens: int) -> str:
    rng = random.Random(block_id * 7919 + 17)
    return "".join(" " + rng.choice(_WORDS) for _ in range(tokens))


def chat(blocks: tuple[int, ...], tokens: int) -> list[dict[str, str]]:
    """The chat of one request (module docstring)."""
    if not blocks:
        return [{"role": "user", "content": "hello"}]
    msgs = [{"role": "system", "content": block_text(blocks[0], tokens)}]
    if len(blocks) > 1:
        msgs.append({"role": "user", "content": block_text(blocks[1], tokens)})
    if len(blocks) > 2:
        msgs.append({"role": "user", "content": "".join(block_text(b, tokens) for b in blocks[2:])})
    return msgs


def dependencies(rows: list[tuple[int, ...]]) -> list[int | None]:
    """For each request, the earlier request it shares the longest prefix (of >= 2 blocks) with."""
    first_with: dict[tuple[int, ...], int] = {}
    out: list[int | None] = []
    for i, blocks in enumerate(rows):
        dep = None
        for k in range(len(blocks), 1, -1):
            j = first_with.get(blocks[:k])
            if j is not None:
                dep = j
                break
        out.append(dep)
        for k in range(2, len(blocks) + 1):
            first_with[blocks[:k]] = i  # the latest request with this prefix: the conversation's last turn
    return out


# -- processes -------------------------------------------------------------------------------------------


class Database:
    """PostgreSQL (fresh database per run) or, without it, a SQLite file per run."""

    def __init__(self, work: Path, want_postgres: bool) -> None:
        from greenserve.bench.pg_server import PostgresServer, pg_bindir

        self.work = work
        self.server: Any = None
        self.note = ""
        self._runs = 0
        bindir = pg_bindir() if want_postgres else None
        if bindir is not None:
            try:
                server = PostgresServer(bindir)
                server.start()
                self.server = server
            except Exception as exc:  # noqa: BLE001 - fall back to SQLite, and say so
                self.note = f"PostgreSQL did not start ({str(exc)[:200]}); SQLite used"
        elif want_postgres:
            self.note = "PostgreSQL binaries (initdb, pg_ctl) not found; SQLite used"
        else:
            self.note = "--sqlite given"

    @property
    def backend(self) -> str:
        return "postgresql" if self.server is not None else "sqlite"

    def fresh_url(self) -> str:
        self._runs += 1
        if self.server is not None:
            return self.server.url(self.server.create_database("bench"))
        path = self.work / f"run{self._runs}" / "router.db"
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


class Cluster:
    """``replicas`` router processes on one database and ``engines`` fresh emulated engines."""

    def __init__(self, work: Path, db_url: str, replicas: int, engines: int, args: argparse.Namespace,
                 router_flags: list[str]) -> None:
        from greenserve.bench import router_launch as rb

        self.rb = rb
        self.procs = rb.Procs()
        try:
            self._start(work, db_url, replicas, engines, args, router_flags)
        except BaseException:
            self.procs.stop()
            raise

    def _start(self, work: Path, db_url: str, replicas: int, engines: int, args: argparse.Namespace,
               router_flags: list[str]) -> None:
        import subprocess

        rb = self.rb
        self.engine_args = engine_args(args.time_scale)
        self.engines = [rb.start_engine(self.procs, self.engine_args, None) for _ in range(engines)]
        self.http: list[str] = []
        self.grpc: list[str] = []
        starting = []
        for k in range(replicas):
            grpc_port, http_port = rb.free_port(), rb.free_port()
            data_dir = work / f"replica{k}"
            data_dir.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "greenserve.router", "--host", "127.0.0.1", "--port", str(grpc_port),
                   "--http-port", str(http_port), "--data-dir", str(data_dir), "--db-url", db_url,
                   "--replica-id", f"r{k}", "--workers", "1", "--no-watch-plans", "--no-feeds",
                   "--log-level", "WARNING", "--max-in-flight", "100000", *router_flags]
            log = open(data_dir / "router.log", "wb")  # closed with the process
            proc = self.procs.add(rb.bench_popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=rb.env()))
            starting.append((f"http://127.0.0.1:{http_port}", proc))
            self.grpc.append(f"127.0.0.1:{grpc_port}")
        for url, proc in starting:
            rb.wait_http(url + "/metrics", 90, proc)  # /health is 503 until an engine is routable
            self.http.append(url)

    def start_engine(self) -> str:
        return self.rb.start_engine(self.procs, self.engine_args, None)

    def stop(self) -> None:
        self.procs.stop()


async def _stubs(addresses: list[str]) -> tuple[list[Any], list[Any]]:
    import grpc
    from greenserve.v1 import router_pb2_grpc

    channels = [grpc.aio.insecure_channel(a) for a in addresses]
    return channels, [router_pb2_grpc.RouterServiceStub(c) for c in channels]


async def _register_all(stubs: list[Any], engines: list[str], pool: str = "default") -> None:
    from greenserve.v1 import common_pb2, router_pb2

    for i, url in enumerate(engines):
        await stubs[0].RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
            id=f"e{i}", url=url, pool=pool, model=MODEL, kind=common_pb2.ENGINE_KIND_SIMULATED)))
    deadline = time.monotonic() + 30
    for stub in stubs:
        while len((await stub.ListEngines(router_pb2.ListEnginesRequest())).engines) < len(engines):
            if time.monotonic() > deadline:
                raise RuntimeError("a replica did not learn of the engines within 30 s")
            await asyncio.sleep(0.05)


def _engine_prefix_tokens(engines: list[str]) -> tuple[float, float]:
    """(hit tokens, queried tokens) summed over the engines, from their /metrics."""
    import urllib.request

    from greenserve.router.routing.scrape import parse_metrics

    hits = queries = 0.0
    for url in engines:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            m = parse_metrics(resp.read().decode())
        hits += m.prefix_hits_tokens or 0.0
        queries += m.prefix_queries_tokens or 0.0
    return hits, queries


async def _replay(routers: list[str], rows: list[tuple[int, ...]], block_tokens: int, concurrency: int
                  ) -> dict[str, Any]:
    """Sends every request (round robin over ``routers``), each after the one it depends on."""
    import aiohttp

    deps = dependencies(rows)
    done = [asyncio.Event() for _ in rows]
    sem = asyncio.Semaphore(concurrency)
    errors = 0

    async def one(i: int, session: aiohttp.ClientSession) -> None:
        nonlocal errors
        dep = deps[i]
        if dep is not None:
            await done[dep].wait()
        body = {"model": MODEL, "messages": chat(rows[i], block_tokens), "max_tokens": 2, "stream": False}
        try:
            async with sem, session.post(routers[i % len(routers)] + "/v1/chat/completions", json=body) as resp:
                data = await resp.read()
                if resp.status != 200 or "choices" not in json.loads(data):
                    errors += 1
        except (aiohttp.ClientError, ValueError):
            errors += 1
        finally:
            done[i].set()

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        await asyncio.gather(*(one(i, session) for i in range(len(rows))))
    return {"seconds": round(time.perf_counter() - t0, 2), "errors": errors}


async def hit_rate_run(work: Path, db: Database, replicas: int, rows: list[tuple[int, ...]],
                       args: argparse.Namespace, router_flags: list[str]) -> dict[str, Any]:
    url = db.fresh_url()
    cluster = Cluster(work / f"hit{replicas}-{db._runs}", url, replicas, args.engines, args, router_flags)
    try:
        channels, stubs = await _stubs(cluster.grpc)
        try:
            await _register_all(stubs, cluster.engines)
        finally:
            for c in channels:
                await c.close()
        h0, q0 = _engine_prefix_tokens(cluster.engines)
        res = await _replay(cluster.http, rows, args.block_tokens, args.concurrency)
        h1, q1 = _engine_prefix_tokens(cluster.engines)
    finally:
        cluster.stop()
    queried = q1 - q0
    res["hit_rate"] = round((h1 - h0) / queried, 4) if queried else None
    res["queried_tokens"] = int(queried)
    return res


async def propagation_run(work: Path, db: Database, replicas: int, trials: int,
                          args: argparse.Namespace) -> dict[str, Any]:
    import grpc
    from greenserve.v1 import common_pb2, router_pb2

    url = db.fresh_url()
    cluster = Cluster(work / "propagation", url, replicas, 1, args, [])
    fresh_url = cluster.engines[0]
    channels, stubs = await _stubs(cluster.grpc)
    descriptor = router_pb2.RequestDescriptor(pool="fresh", completion=router_pb2.CompletionInput(prompt="hi"))
    generate = router_pb2.GenerateRequest(request=descriptor, sampling=router_pb2.SamplingParams(max_tokens=1))

    async def routed_to(stub: Any) -> str:
        try:
            return (await stub.Route(router_pb2.RouteRequest(request=descriptor), timeout=5)).engine.id
        except grpc.aio.AioRpcError:
            return ""

    async def served_by(stub: Any) -> str:
        try:
            async for msg in stub.Generate(generate, timeout=10):
                if msg.engine_id:
                    return msg.engine_id
        except grpc.aio.AioRpcError:
            return ""
        return ""

    async def until_routed(stub: Any, engine_id: str, t0: float) -> float:
        while await routed_to(stub) != engine_id:
            if time.perf_counter() - t0 > 30:
                return float("inf")
            await asyncio.sleep(0.02)
        return (time.perf_counter() - t0) * 1000.0

    times: list[float] = []
    failed_checks = 0
    try:
        for k in range(trials):
            engine_id = f"fresh{k}"
            origin = stubs[k % replicas]
            t0 = time.perf_counter()
            await origin.RegisterEngine(router_pb2.RegisterEngineRequest(engine=common_pb2.Engine(
                id=engine_id, url=fresh_url, pool="fresh", model=MODEL, kind=common_pb2.ENGINE_KIND_SIMULATED)))
            per_replica = await asyncio.gather(*(until_routed(s, engine_id, t0) for s in stubs))
            times.append(max(per_replica))
            served = await asyncio.gather(*(served_by(s) for s in stubs))
            failed_checks += sum(1 for e in served if e != engine_id)
            _log(f"propagation trial {k}: {', '.join(f'{ms:.0f}' for ms in per_replica)} ms (origin r{k % replicas})")
            await origin.DeregisterEngine(router_pb2.DeregisterEngineRequest(engine_id=engine_id))
            for stub in stubs:  # every replica forgot it before the next trial
                while await routed_to(stub):
                    await asyncio.sleep(0.02)
    finally:
        for c in channels:
            await c.close()
        cluster.stop()
    return {"max_ms": round(max(times), 1), "median_ms": round(statistics.median(times), 1),
            "trials_ms": [round(t, 1) for t in times], "generate_checks_failed": failed_checks}


# -- main ------------------------------------------------------------------------------------------------


def _parser(prog: str) -> argparse.ArgumentParser:
    p = Parser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return p


_OPTIONS = ("replicas", "requests", "trace", "engines", "block_tokens", "concurrency", "trials", "time_scale",
            "sqlite", "no_baseline")


def add_arguments(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """The phase's options; ``prefix`` 'replicas-' when added to bench router's parser (its dests then start
    with 'replicas_'; ``phase_args`` takes them back out)."""
    d = prefix.replace("-", "_")
    p.add_argument(f"--{prefix}replicas", dest=f"{d}replicas", type=int, default=4, help="replicas (default 4)")
    p.add_argument(f"--{prefix}requests", dest=f"{d}requests", type=int, default=600,
                   help="trace requests replayed per run (default 600)")
    p.add_argument(f"--{prefix}trace", dest=f"{d}trace", choices=("auto", "mooncake", "multiturn"), default="auto",
                   help="conversation trace (default auto: the Mooncake trace shipped with the package; "
                   "multiturn: synthetic multi-turn conversations)")
    p.add_argument(f"--{prefix}engines", dest=f"{d}engines", type=int, default=4,
                   help="emulated engines (default 4)")
    p.add_argument(f"--{prefix}block-tokens", dest=f"{d}block_tokens", type=int, default=32,
                   help="words each trace block id stands for (default 32: the longest Mooncake prompt fits 8K tokens)")
    p.add_argument(f"--{prefix}concurrency", dest=f"{d}concurrency", type=int, default=32,
                   help="requests in flight at most (default 32)")
    p.add_argument(f"--{prefix}trials", dest=f"{d}trials", type=int, default=5,
                   help="propagation trials (default 5)")
    p.add_argument(f"--{prefix}time-scale", dest=f"{d}time_scale", type=float, default=20.0,
                   help="emulator speed-up (default 20)")
    p.add_argument(f"--{prefix}sqlite", dest=f"{d}sqlite", action="store_true",
                   help="one SQLite file instead of PostgreSQL")
    p.add_argument(f"--{prefix}no-baseline", dest=f"{d}no_baseline", action="store_true",
                   help="skip the runs without prefix affinity (--affinity-weight 0)")


def phase_args(args: argparse.Namespace, prefix: str = "replicas-") -> argparse.Namespace:
    d = prefix.replace("-", "_")
    return argparse.Namespace(**{name: getattr(args, d + name) for name in _OPTIONS})


def engine_args(time_scale: float) -> argparse.Namespace:
    """What ``bench_launch.start_engine`` reads to start one of the phase's engines: always the emulator, whose
    prefix cache (``vllm:prefix_cache_*``) the hit-rate figure is read from (the no-op engine has none)."""
    return argparse.Namespace(engine="emulator", time_scale=time_scale, max_num_seqs=256, model=MODEL)


def phase_result(args: argparse.Namespace) -> dict[str, Any]:
    """The phase as a part of ``greenserve bench router`` (``--replicas-phase``): its two figures at the top
    level of the JSON, everything else under ``replicas_phase``."""
    out = run(phase_args(args))
    return {"replica_registration_propagation_ms": out["replica_registration_propagation_ms"],
            "replica_prefix_hit_rate_loss_pts": out["replica_prefix_hit_rate_loss_pts"], "replicas_phase": out}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every run of the phase; the figures as a dict."""
    for name in ("replicas", "requests", "engines", "block_tokens", "concurrency", "trials"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    desc, rows = load_trace(args.requests, args.trace)
    _log(f"trace: {desc}")
    work = Path(tempfile.mkdtemp(prefix="greenserve-bench-replicas-"))
    db = Database(work, not args.sqlite)
    _log(f"database: {db.backend}{' (' + db.note + ')' if db.note else ''}")
    out: dict[str, Any] = {"database": db.backend, "database_note": db.note, "trace": desc,
                           "replicas": args.replicas, "engines": args.engines, "requests": len(rows)}
    try:
        prop = asyncio.run(propagation_run(work, db, args.replicas, args.trials, args))
        out["propagation"] = prop
        runs: dict[str, Any] = {}
        variants: list[tuple[str, list[str]]] = [("affinity", [])]
        if not args.no_baseline:
            variants.append(("no_affinity", ["--affinity-weight", "0"]))
        for label, flags in variants:
            for n in (1, args.replicas):
                _log(f"hit-rate run: {n} replica(s), {label} ...")
                res = asyncio.run(hit_rate_run(work, db, n, rows, args, flags))
                _log(f"  {res}")
                runs[f"{label}_{n}"] = res
        out["hit_rate_runs"] = runs
    finally:
        db.stop()
        shutil.rmtree(work, ignore_errors=True)
    one, many = runs["affinity_1"]["hit_rate"], runs[f"affinity_{args.replicas}"]["hit_rate"]
    out["replica_registration_propagation_ms"] = prop["max_ms"]
    out["replica_registration_propagation_median_ms"] = prop["median_ms"]
    out["replica_prefix_hit_rate_1"] = one
    out[f"replica_prefix_hit_rate_{args.replicas}"] = many
    out["replica_prefix_hit_rate_loss_pts"] = round((one - many) * 100, 2) if one is not None and many is not None \
        else None
    out["machine"] = {"cpu_count": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}
    return out


def main(argv: list[str], prog: str = "greenserve bench router-replicas") -> int:
    from greenserve.bench import router_launch as bench_launch

    args = _parser(prog).parse_args(argv)
    bench_launch.exit_on_sigterm()
    out = run(args)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
