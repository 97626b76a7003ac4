"""Fuzz every RPC of every greenserve.v1 service (issue 21).

The RPCs are discovered from the generated descriptors, so a new RPC is fuzzed without editing this file; a new
*service* needs one line in SERVICES (how to start it). Each RPC gets GREENSERVE_FUZZ_N cases (default 200) from
tests/fuzz/messages.py, sent as raw bytes to an in-process server on a SQLite file. Every reply must be

- OK (and then decode as the declared response type), or one of the clean client codes in CLEAN_CODES;
- UNIMPLEMENTED only for an RPC that answers UNIMPLEMENTED to a well-formed empty request (honestly not built);
- UNAVAILABLE only with the ErrorDetail reason DEPENDENCY_UNAVAILABLE (the fuzzed service runs alone: the
  services it calls are a closed port), never a bare UNAVAILABLE;
- for server streams, DEADLINE_EXCEEDED when the (short) deadline ends an open stream;

never INTERNAL or UNKNOWN. Every service requires a token; 5 % of the cases carry none or a wrong one and must
get UNAUTHENTICATED (or RESOURCE_EXHAUSTED for an oversized message, which the gRPC core refuses first).

A refused call must leave the state as it was: the service's database (every table but the few written by
background work, VOLATILE_TABLES; re-read only when SQLite's data_version moved) and the replies of up to
MAX_PROBES state probes (its List*/Get* RPCs with an empty request and with a plausible one they answer OK) are
compared before and after. When they differ, the state is read again after QUIET_S: what still moves is work an
earlier accepted call started (a sweep, a refit) and is left out from then on; what stays changed is reported.
The service must still answer its health check (without a token) every HEALTH_EVERY cases and at the end.

Reproduce a failure with the seed, RPC and case index it names: GREENSERVE_FUZZ_SEED=... GREENSERVE_FUZZ_N=...
.venv/bin/python -m pytest tests/fuzz/test_grpc_fuzz.py -k Service.Rpc. tests/fuzz/test_harness_self_check.py
shows the harness reporting planted defects.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import pkgutil
import random
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import greenserve.v1
import grpc
import pytest
import pytest_asyncio
from greenserve.common.app import start_service
from greenserve.common.server import ServiceServer
from greenserve.common.telemetry import setup_telemetry
from greenserve.v1 import common_pb2, router_pb2, router_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.conftest import free_port
from tests.fuzz.conftest import fuzz_cases, fuzz_seed
from tests.fuzz.messages import Corpus, MessageFuzzer

pytestmark = pytest.mark.asyncio(loop_scope="module")

CLEAN_CODES = {
    grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
}
# grpcio's asyncio client reports this INTERNAL when the server refused a client stream (its status is on the
# wire) while the client was still writing: grpc/grpc#36066 (fix proposed in grpc/grpc#43486). Accepted only when
# the server's own metrics show no INTERNAL for the method.
CLIENT_WRITE_ARTIFACT = "Internal error from Core"
UNARY_TIMEOUT_S = 20.0  # generous for a loaded 2-core box: a call that takes this long is a hang
STREAM_TIMEOUT_S = 0.5  # server streams stay open; the deadline ends them
STREAM_READS = 3
QUIET_S = 0.3  # pause before re-reading the state when a refused call seems to have changed it
STREAM_BATCH = 25  # server-stream cases run this many at once (each waits for its deadline)
HEALTH_EVERY = 50
TOKEN = "fuzz-token"  # every fuzzed service requires it; a few cases come without it (or with a wrong one)
AUTH = (("authorization", f"Bearer {TOKEN}"),)
STRANGERS = [(), (("authorization", "Bearer wrong"),), (("authorization", TOKEN),),
             (("authorization", f"Basic {TOKEN}"),), (("authorization", f"Bearer {TOKEN}x"),)]
STRANGER_SHARE = 0.05
PROBES_PER_READ = 1  # plausible requests of each List*/Get* RPC kept as state probes (besides the empty one)
MAX_PROBES = 4  # state probes asked after every case (each costs a call: the bulk of the CPU time)

# How to start each service in-process: module, settings class, settings for a fast, standalone instance.
SERVICES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "greenserve.v1.ForecasterService": ("greenserve.forecaster.service", "ForecasterSettings",
                                        {"forecast_model": "seasonal_naive"}),
    "greenserve.v1.ProfilerService": ("greenserve.profiler.service", "ProfilerSettings", {}),
    "greenserve.v1.OptimizerService": ("greenserve.optimizer.service", "OptimizerSettings", {}),
    "greenserve.v1.CacheManagerService": ("greenserve.cache_manager.service", "CacheManagerSettings",
                                          {"lmcache_timeout_s": 0.5}),
    "greenserve.v1.GpuPartitionerService": ("greenserve.gpu_partitioner.service", "GpuPartitionerSettings",
                                            {"backend": "simulated", "sim_gpus": "A100-40GB,H100-80GB",
                                             "energy_sample_interval_s": 0}),
    "greenserve.v1.RouterService": ("greenserve.router.front.service", "RouterSettings",
                                    {"http_port": -1, "watch_plans": False, "feeds": False,
                                     "probe_timeout_s": 0.3, "first_token_timeout_s": 2.0}),
}
# Services given a stand-in for one dependency instead of the closed port (address setting -> factory).
COMPANIONS: dict[str, dict[str, str]] = {
    # Without a router every inventory read waits for the router link's timeout; the stand-in has no engines.
    "greenserve.v1.GpuPartitionerService": {"router_addr": "empty_router"},
}


class EmptyRouter(router_pb2_grpc.RouterServiceServicer):
    """A RouterService with no engines: ListEngines is empty, Drain/Undrain of anything succeed."""

    async def ListEngines(self, request: Any, context: Any) -> router_pb2.ListEnginesResponse:
        return router_pb2.ListEnginesResponse()

    async def Drain(self, request: Any, context: Any) -> router_pb2.DrainResponse:
        return router_pb2.DrainResponse(idle_engine_ids=list(request.engine_ids))

    async def Undrain(self, request: Any, context: Any) -> router_pb2.UndrainResponse:
        return router_pb2.UndrainResponse()


async def start_empty_router() -> tuple[str, grpc.aio.Server]:
    server = grpc.aio.server()
    router_pb2_grpc.add_RouterServiceServicer_to_server(EmptyRouter(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return f"127.0.0.1:{port}", server


# Tables written by background work (not by the fuzzed call): left out of the before/after comparison.
VOLATILE_TABLES: dict[str, set[str]] = {
    "greenserve.v1.ForecasterService": {"fitted_models"},  # refits run after an ingest, in the background
    "greenserve.v1.GpuPartitionerService": {"energy_accounts"},  # energy sampled on reads and applies
    # each replica's heartbeat (router/routing/shared_state.py); the health verdicts of its background probes (an engine
    # a fuzzed RegisterEngine added at an unserved URL is ejected a few probes later, whatever call is in flight
    # then) and the change counter they bump; registrations themselves stay compared (the engines table)
    "greenserve.v1.RouterService": {"router_replicas", "engine_health", "state_version"},
}
# Reads whose reply changes by itself (live measurements): not part of the state compared.
VOLATILE_READS: set[str] = {
    "/greenserve.v1.GpuPartitionerService/GetEnergy",  # energy counters move with time
    "/greenserve.v1.RouterService/ListEngines",  # live health/load of registered engines, probed in the background
    "/greenserve.v1.CacheManagerService/ListCacheServers",  # asks each LMCache server for its live status
}
# RPCs with a known defect in code being rewritten by another engineer right now: xfail (not strict), with why.
KNOWN_DEFECTS: dict[str, str] = {}


@dataclass(frozen=True)
class Rpc:
    service: str
    name: str
    path: str
    input_cls: type
    output_cls: type
    client_streaming: bool
    server_streaming: bool


def _message_class(descriptor: Any) -> type:
    module = importlib.import_module(f"greenserve.v1.{Path(descriptor.file.name).stem}_pb2")
    return getattr(module, descriptor.name)


def discover_rpcs() -> Iterator[Rpc]:
    """Every method of every service in the generated greenserve.v1 modules, in proto order."""
    for info in sorted(pkgutil.iter_modules(greenserve.v1.__path__), key=lambda m: m.name):
        if not info.name.endswith("_pb2"):
            continue
        module = importlib.import_module(f"greenserve.v1.{info.name}")
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                yield Rpc(service.full_name, method.name, f"/{service.full_name}/{method.name}",
                          _message_class(method.input_type), _message_class(method.output_type),
                          method.client_streaming, method.server_streaming)


RPCS = list(discover_rpcs())


def _params() -> list[Any]:
    out = []
    for rpc in RPCS:
        marks = [pytest.mark.xfail(reason=KNOWN_DEFECTS[rpc.path], strict=False)] if rpc.path in KNOWN_DEFECTS else []
        out.append(pytest.param(rpc, id=f"{rpc.service.rsplit('.', 1)[-1]}.{rpc.name}", marks=marks))
    return out


@dataclass
class Target:
    """One running service, its raw channel and what the fuzz learned about it."""

    rpc_service: str
    server: ServiceServer
    telemetry: Any
    channel: grpc.aio.Channel
    db_path: Path | None
    corpus: Corpus = field(default_factory=Corpus)
    probes: list[tuple[str, bytes]] = field(default_factory=list)
    moving: set[str] = field(default_factory=set)  # probes/tables seen changing with no call in flight
    metrics: InMemoryMetricReader | None = None
    _conn: sqlite3.Connection | None = None
    _db_version: int | None = None
    _db_cache: dict[str, str] | None = None

    def server_count(self, path: str, code: str) -> int:
        """RPCs of `path` the server itself answered with `code` (its greenserve.rpc.server.requests metric)."""
        data = self.metrics.get_metrics_data() if self.metrics is not None else None
        return sum(
            int(point.value)
            for rm in (data.resource_metrics if data is not None else []) for sm in rm.scope_metrics
            for metric in sm.metrics if metric.name == "greenserve.rpc.server.requests"
            for point in metric.data.data_points
            if point.attributes.get("rpc.method") == path and point.attributes.get("rpc.grpc.status_code") == code
        )

    def reads(self) -> list[Rpc]:
        return [rpc for rpc in RPCS if rpc.service == self.rpc_service and not rpc.client_streaming
                and not rpc.server_streaming and rpc.name.startswith(("List", "Get"))
                and rpc.path not in VOLATILE_READS]

    async def find_probes(self, rng: random.Random) -> None:
        """State probes: each List*/Get* RPC with an empty request, and with up to PROBES_PER_READ plausible
        requests it answers OK (names from the corpus, so they see what the fuzz stored), kept only when two
        calls in a row agree (a reply that moves by itself is no state)."""
        fuzzer = MessageFuzzer(rng, self.corpus)
        probes: list[tuple[str, bytes]] = []
        for rpc in self.reads():
            found = [b""]
            for _ in range(12):
                if len(found) > PROBES_PER_READ:
                    break
                payload = fuzzer.plausible_message(rpc.input_cls).SerializeToString()
                code, _, _ = await self.unary(rpc.path, payload)
                if code == grpc.StatusCode.OK and payload not in found:
                    found.append(payload)
            for payload in found:
                first, second = await self.unary(rpc.path, payload), await self.unary(rpc.path, payload)
                if first[:2] == second[:2]:
                    probes.append((rpc.path, payload))
        # Collections first (List*), then empty requests: they see the most state per call.
        probes.sort(key=lambda p: (not p[0].rsplit("/", 1)[1].startswith("List"), p[1] != b""))
        self.probes = probes[:MAX_PROBES]

    async def state(self) -> dict[str, Any]:
        """Database rows (minus volatile tables) and the replies of the state probes (asked at once)."""
        replies = await asyncio.gather(*(self.unary(path, payload) for path, payload in self.probes))
        snapshot: dict[str, Any] = {
            f"{path.rsplit('/', 1)[1]}({payload.hex()[:16]})": (code.name, reply)
            for (path, payload), (code, reply, _) in zip(self.probes, replies)
        }
        snapshot["db"] = await self._db_digest()
        return snapshot

    async def _db_digest(self) -> dict[str, str]:
        """A digest per table; recomputed only when SQLite's data_version says another connection committed."""
        if self.db_path is None or not self.db_path.exists():
            return {}
        if self._conn is None:
            self._conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=10, check_same_thread=False)
        version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._db_version or self._db_cache is None:
            self._db_cache = await asyncio.to_thread(self._db_rows)
            self._db_version = version
        return self._db_cache

    def _db_rows(self) -> dict[str, str]:
        assert self._conn is not None
        skip = VOLATILE_TABLES.get(self.rpc_service, set()) | {"alembic_version"}
        out: dict[str, str] = {}
        conn = self._conn
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in sorted(t for t in tables if t not in skip and not t.startswith("sqlite_")):
            digest = hashlib.sha256()
            for row in sorted(repr(r) for r in conn.execute(f'SELECT * FROM "{table}"')):
                digest.update(row.encode())
            out[table] = digest.hexdigest()
        return out

    async def unary(self, path: str, payload: bytes, metadata: Any = AUTH) -> tuple[grpc.StatusCode, bytes | None, Any]:
        call = self.channel.unary_unary(path, request_serializer=None, response_deserializer=None)
        try:
            return grpc.StatusCode.OK, await call(payload, timeout=UNARY_TIMEOUT_S, metadata=metadata), None
        except grpc.aio.AioRpcError as exc:
            return exc.code(), None, exc

    async def client_stream(self, path: str, payloads: list[bytes],
                            metadata: Any = AUTH) -> tuple[grpc.StatusCode, bytes | None, Any]:
        call = self.channel.stream_unary(path, request_serializer=None, response_deserializer=None)
        try:
            return grpc.StatusCode.OK, await call(iter(payloads), timeout=UNARY_TIMEOUT_S, metadata=metadata), None
        except grpc.aio.AioRpcError as exc:
            return exc.code(), None, exc

    async def server_stream(self, path: str, payload: bytes,
                            metadata: Any = AUTH) -> tuple[grpc.StatusCode, list[bytes], Any]:
        call = self.channel.unary_stream(path, request_serializer=None, response_deserializer=None)(
            payload, timeout=STREAM_TIMEOUT_S, metadata=metadata)
        replies: list[bytes] = []
        try:
            async for reply in call:
                replies.append(reply)
                if len(replies) >= STREAM_READS:
                    call.cancel()
                    return grpc.StatusCode.OK, replies, None
            return grpc.StatusCode.OK, replies, None
        except grpc.aio.AioRpcError as exc:
            return exc.code(), replies, exc
        except asyncio.CancelledError:
            return grpc.StatusCode.OK, replies, None

    async def healthy(self) -> bool:
        """Both health entries SERVING, asked without a token (probes need none)."""
        stub = health_pb2_grpc.HealthStub(self.channel)
        for name in ("", self.rpc_service):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=UNARY_TIMEOUT_S)
            if reply.status != health_pb2.HealthCheckResponse.SERVING:
                return False
        return True


class Fleet:
    """Starts the service under test on first use (one at a time: the previous one is stopped)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.current: Target | None = None
        self.companions: list[grpc.aio.Server] = []

    async def get(self, rpc_service: str, build: Any = None) -> Target:
        """The running service (started now if needed); `build` replaces the service's own (harness self-test)."""
        if self.current is not None and self.current.rpc_service == rpc_service and build is None:
            return self.current
        await self.stop()
        if rpc_service not in SERVICES:
            pytest.fail(f"{rpc_service} is in greenserve.v1 but not in tests/fuzz SERVICES: say how to start it")
        module_name, settings_name, overrides = SERVICES[rpc_service]
        module = importlib.import_module(module_name)
        settings_cls = getattr(module, settings_name)
        build = build or module.build
        dead = f"127.0.0.1:{free_port()}"  # the services it calls: nothing listens there
        deps = {name: dead for name in ("forecaster_addr", "profiler_addr", "optimizer_addr", "cache_manager_addr",
                                        "gpu_partitioner_addr", "router_addr") if name in settings_cls.model_fields}
        for setting, companion in COMPANIONS.get(rpc_service, {}).items():
            assert companion == "empty_router"
            deps[setting], server = await start_empty_router()
            self.companions.append(server)
        data_dir = self.root / settings_cls.service_name
        values = {"host": "127.0.0.1", "port": 0, "data_dir": data_dir, "log_level": "WARNING", "auth_token": TOKEN,
                  "max_message_bytes": 1024 * 1024, **deps, **overrides}
        settings = settings_cls.model_validate(values)
        metrics = InMemoryMetricReader()
        telemetry = setup_telemetry(settings.service_name, span_exporter=InMemorySpanExporter(),
                                    metric_reader=metrics, install_global=False)
        server = await start_service(settings, build, telemetry=telemetry)
        url = settings.database_url
        db_path = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024), ("grpc.max_send_message_length", 64 * 1024 * 1024)])
        self.current = Target(rpc_service, server, telemetry, channel, db_path, metrics=metrics)
        return self.current

    async def stop(self) -> None:
        if self.current is not None:
            await self.current.channel.close()
            if self.current._conn is not None:
                self.current._conn.close()
            await self.current.server.stop(0)
            self.current.telemetry.shutdown()
            self.current = None
        for companion in self.companions:
            await companion.stop(0)
        self.companions.clear()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory):
    running = Fleet(tmp_path_factory.mktemp("fuzz-grpc"))
    yield running
    await running.stop()


def _dependency_unavailable(error: Any) -> bool:
    status = rpc_status.from_call(error) if error is not None else None
    for detail in status.details if status is not None else []:
        if detail.Is(common_pb2.ErrorDetail.DESCRIPTOR):
            unpacked = common_pb2.ErrorDetail()
            detail.Unpack(unpacked)
            return unpacked.reason == common_pb2.ERROR_REASON_DEPENDENCY_UNAVAILABLE
    return False


def _changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Names of the probes and tables (db.<table>) that differ."""
    out = [k for k in set(before) | set(after) if k != "db" and before.get(k) != after.get(k)]
    db_before, db_after = before.get("db", {}), after.get("db", {})
    out += [f"db.{t}" for t in set(db_before) | set(db_after) if db_before.get(t) != db_after.get(t)]
    return sorted(out)


async def _probe_unimplemented(target: Target, rpc: Rpc) -> bool:
    """Does the RPC answer UNIMPLEMENTED to a well-formed empty request (not built yet)?"""
    if rpc.server_streaming:
        code, _, _ = await target.server_stream(rpc.path, b"")
    elif rpc.client_streaming:
        code, _, _ = await target.client_stream(rpc.path, [])
    else:
        code, _, _ = await target.unary(rpc.path, b"")
    return code == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize("rpc", _params())
async def test_fuzz_rpc(fleet: Fleet, rpc: Rpc) -> None:
    target = await fleet.get(rpc.service)
    n = fuzz_cases()
    failures, seen, unimplemented = await fuzz_rpc(target, rpc, n, fuzz_seed())
    print(f"{rpc.path}: {n} cases{' (UNIMPLEMENTED)' if unimplemented else ''}: {dict(sorted(seen.items()))}")
    assert await target.healthy(), f"{rpc.service} no longer SERVING after fuzzing {rpc.name}"
    assert not failures, "\n".join(failures)


async def fuzz_rpc(target: Target, rpc: Rpc, n: int, seed: int) -> tuple[list[str], dict[str, int], bool]:
    """Send `n` cases to `rpc`; returns the failures found (at most 8), the codes seen, and whether the RPC is
    (honestly) unimplemented."""
    rng = random.Random(f"{seed}:{rpc.path}")
    fuzzer = MessageFuzzer(rng, target.corpus)
    unimplemented = await _probe_unimplemented(target, rpc)
    await target.find_probes(random.Random(f"{seed}:probes:{rpc.path}"))
    failures: list[str] = []
    seen: dict[str, int] = {}
    before = await target.state()
    pending: list[tuple[str, Any, tuple[grpc.StatusCode, list[bytes], Any]]] = []
    for index in range(n):
        stranger = rng.random() < STRANGER_SHARE
        metadata = rng.choice(STRANGERS) if stranger else AUTH
        if rpc.server_streaming:
            if not pending:  # server streams wait for their deadline: run a batch at once, check one by one
                batch = [(*fuzzer.case(rpc.input_cls), metadata) for _ in range(min(STREAM_BATCH, n - index))]
                results = await asyncio.gather(*(target.server_stream(rpc.path, p, m) for _, p, m in batch))
                pending = [(k, m, r) for (k, _, m), r in zip(batch, results)]
            kind, metadata, (code, replies, error) = pending.pop(0)
            stranger = metadata is not AUTH
        elif rpc.client_streaming:
            kind, payloads = fuzzer.stream(rpc.input_cls)
            code, reply, error = await target.client_stream(rpc.path, payloads, metadata)
            replies = [] if reply is None else [reply]
        else:
            kind, payload = fuzzer.case(rpc.input_cls)
            code, reply, error = await target.unary(rpc.path, payload, metadata)
            replies = [] if reply is None else [reply]
        seen[code.name] = seen.get(code.name, 0) + 1
        where = f"case {index} ({kind}{', no valid token' if stranger else ''}) of {rpc.path}, GREENSERVE_FUZZ_SEED={seed}"
        details = (error.details() or "")[:200] if error is not None else ""
        # Without a valid token: UNAUTHENTICATED; a message over the size limit is refused by the gRPC core
        # (RESOURCE_EXHAUSTED) before any interceptor sees the call.
        expected = {grpc.StatusCode.UNAUTHENTICATED} | ({grpc.StatusCode.RESOURCE_EXHAUSTED} if "oversized" in kind else set())
        if rpc.server_streaming:  # a slow 1 MiB send may outlast the stream's short deadline
            expected.add(grpc.StatusCode.DEADLINE_EXCEEDED)
        if stranger and code not in expected:
            failures.append(f"{where}: a call without a valid token got {code.name} {details!r}")
        artifact = rpc.client_streaming and code == grpc.StatusCode.INTERNAL and details == CLIENT_WRITE_ARTIFACT
        if artifact:
            # the server counts an RPC in its interceptor's finally, after the status went out: a moment for a
            # server-side INTERNAL to show in the count before this one is taken for the client's artifact
            await asyncio.sleep(0.1)
            artifact = target.server_count(rpc.path, "INTERNAL") == 0
        ok_code = (
            code in CLEAN_CODES
            or artifact
            or (code == grpc.StatusCode.UNIMPLEMENTED and unimplemented)
            or (code == grpc.StatusCode.UNAVAILABLE and _dependency_unavailable(error))
            or (code == grpc.StatusCode.DEADLINE_EXCEEDED and rpc.server_streaming)
        )
        if not ok_code:
            failures.append(f"{where}: {code.name} {details!r}")
        for raw in replies:
            try:
                target.corpus.harvest(rpc.output_cls.FromString(raw))
            except Exception as exc:  # noqa: BLE001 - a reply that does not decode is a defect
                failures.append(f"{where}: reply does not decode as {rpc.output_cls.__name__}: {exc}")
        after = await target.state()
        if code != grpc.StatusCode.OK and not (rpc.server_streaming and code == grpc.StatusCode.DEADLINE_EXCEEDED):
            changed = set(_changed(before, after)) - target.moving
            if changed:
                # Work an earlier accepted call started (a sweep, a refit) may still be writing: if the state
                # moves by itself, what moved is left out from now on; what stays still was this call's doing.
                await asyncio.sleep(QUIET_S)
                settled = await target.state()
                moving = set(_changed(after, settled))
                target.moving |= moving
                after = settled
                if changed - moving:
                    failures.append(f"{where}: refused with {code.name} {details!r} but changed {sorted(changed)}")
        before = after
        if index % HEALTH_EVERY == HEALTH_EVERY - 1 and not await target.healthy():
            failures.append(f"{where}: health check not SERVING")
        if len(failures) >= 8:
            break
    return failures, seen, unimplemented
