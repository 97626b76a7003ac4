"""The cache-manager process under 16 concurrent writers, then SIGKILL and a restart (issue 21).

16 clients write at once (access streams that store new entries and evict some of their earlier ones,
server registrations, deregistrations) with checkpoints every 0.7 s or 1,000 events; while they are still
writing the process is killed with SIGKILL and started again. Before the kill no call may fail; after the
restart the service holds exactly the acknowledged writes: every acknowledged store is there unless an
acknowledged evict removed it, nothing that was never sent is there, and each stream that was in flight at
the kill was applied whole or not at all.
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, field

import grpc
import pytest

from greenserve.v1 import cache_manager_pb2 as pb
from greenserve.v1 import cache_manager_pb2_grpc as pbg
from tests.cache_manager.process import start_cache_manager
from tests.conftest import free_port
from tests.process import sigkill_while_writing

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]
CLIENTS = 16
WRITE_S = 2.0


@dataclass
class Client:
    c: int
    acked_stores: set[str] = field(default_factory=set)
    acked_evicts: set[str] = field(default_factory=set)
    acked_servers: set[str] = field(default_factory=set)
    acked_deregistered: set[str] = field(default_factory=set)
    in_flight: list[tuple[str, object]] = field(default_factory=list)  # (kind, payload) when the kill came
    errors: list[str] = field(default_factory=list)

    @property
    def pool(self) -> str:
        return f"p{self.c:02d}"


async def _run_client(cl: Client, address: str, killed: asyncio.Event) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pbg.CacheManagerServiceStub(channel)
        n = 0
        while True:
            n += 1
            stores = [f"{cl.c:02x}{n:04x}{j:02x}" for j in range(20)]
            evicts = sorted(cl.acked_stores - cl.acked_evicts)[:2]
            events = [pb.ReportAccessesRequest(pool=cl.pool, entry_key=k, kind=pb.ACCESS_KIND_STORE, tokens=16,
                                               size_bytes=4096, conversation_id=f"c{n % 3}") for k in stores]
            events += [pb.ReportAccessesRequest(pool=cl.pool, entry_key=k, kind=pb.ACCESS_KIND_EVICT) for k in evicts]
            ops: list[tuple[str, object]] = [("stream", (stores, evicts, events))]
            if n % 4 == 0:
                ops.append(("register", f"s{cl.c:02d}-{n:04d}"))
            if n % 8 == 0 and cl.acked_servers - cl.acked_deregistered:
                ops.append(("deregister", sorted(cl.acked_servers - cl.acked_deregistered)[0]))
            for kind, payload in ops:
                try:
                    if kind == "stream":
                        st, ev, msgs = payload  # type: ignore[misc]

                        async def gen(msgs=msgs):
                            for m in msgs:
                                yield m
                        await stub.ReportAccesses(gen(), timeout=30)
                        cl.acked_stores.update(st)
                        cl.acked_evicts.update(ev)
                    elif kind == "register":
                        await stub.RegisterCacheServer(pb.RegisterCacheServerRequest(server=pb.CacheServer(
                            id=payload, pool=cl.pool, url=f"http://127.0.0.1:9/{payload}")), timeout=30)
                        cl.acked_servers.add(payload)  # type: ignore[arg-type]
                    else:
                        await stub.DeregisterCacheServer(pb.DeregisterCacheServerRequest(server_id=payload),
                                                         timeout=30)
                        cl.acked_deregistered.add(payload)  # type: ignore[arg-type]
                except grpc.aio.AioRpcError as exc:
                    if killed.is_set():
                        cl.in_flight.append((kind, payload))
                        return
                    cl.errors.append(f"{kind}: {exc.code().name}: {exc.details()}")
            if killed.is_set():
                return


async def _restored(address: str, pool: str) -> tuple[set[str], set[str]]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pbg.CacheManagerServiceStub(channel)
        try:
            entries = (await stub.ListEvictionCandidates(
                pb.ListEvictionCandidatesRequest(pool=pool, limit=10000))).entries
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND
            entries = []
        servers = (await stub.ListCacheServers(pb.ListCacheServersRequest(pool=pool))).servers
        return {e.entry_key for e in entries}, {s.id for s in servers}


async def test_sixteen_writers_sigkill_restart_holds_exactly_the_acknowledged_writes(tmp_path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    flags = dict(snapshot_interval_s=0.7, snapshot_every_events=1000)
    proc = start_cache_manager(tmp_path, port, **flags)
    killed = asyncio.Event()
    clients = [Client(c) for c in range(CLIENTS)]
    tasks = [asyncio.create_task(_run_client(cl, address, killed)) for cl in clients]
    await sigkill_while_writing(proc, tasks, killed, WRITE_S)
    errors = [e for cl in clients for e in cl.errors]
    assert errors == [], errors[:5]
    assert sum(len(cl.acked_stores) for cl in clients) >= CLIENTS * 20, "too few writes to mean anything"

    proc = start_cache_manager(tmp_path, port, **flags)
    try:
        for cl in clients:
            keys, servers = await _restored(address, cl.pool)
            expected = cl.acked_stores - cl.acked_evicts
            streams = [p for kind, p in cl.in_flight if kind == "stream"]
            maybe_stored = {k for st, _, _ in streams for k in st}
            maybe_evicted = {k for _, ev, _ in streams for k in ev}
            assert expected - maybe_evicted <= keys, f"{cl.pool}: acknowledged entries lost"
            assert keys <= expected | maybe_stored, f"{cl.pool}: entries nobody acknowledged or sent"
            for st, ev, _ in streams:  # all or nothing
                applied = [k in keys for k in st]
                assert all(applied) or not any(applied), f"{cl.pool}: a stream was applied in part"
                if all(applied):
                    assert not set(ev) & keys
            expected_servers = cl.acked_servers - cl.acked_deregistered
            maybe_servers = {p for kind, p in cl.in_flight if kind == "register"}
            maybe_gone = {p for kind, p in cl.in_flight if kind == "deregister"}
            assert expected_servers - maybe_gone <= servers <= expected_servers | maybe_servers, cl.pool
        # And it keeps serving writes after the restart.
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pbg.CacheManagerServiceStub(channel)

            async def one():
                yield pb.ReportAccessesRequest(pool="after", entry_key="ab", kind=pb.ACCESS_KIND_STORE, tokens=1,
                                               size_bytes=1)
            assert (await stub.ReportAccesses(one())).accepted_events == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, (tmp_path / "service.log").read_text()[-2000:]


async def test_sigkill_before_any_checkpoint_replays_the_journal(tmp_path) -> None:
    """Acknowledged events that no checkpoint holds yet come back from the journal after a SIGKILL."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    proc = start_cache_manager(tmp_path, port, snapshot_interval_s=3600)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pbg.CacheManagerServiceStub(channel)

            async def events():
                for i in range(50):
                    yield pb.ReportAccessesRequest(pool="p1", entry_key=f"{i:04x}", kind=pb.ACCESS_KIND_STORE,
                                                   tokens=16, size_bytes=4096)
                for i in range(10):
                    yield pb.ReportAccessesRequest(pool="p1", entry_key=f"{i:04x}", kind=pb.ACCESS_KIND_HIT,
                                                   hit_tokens=16)
                yield pb.ReportAccessesRequest(pool="p1", entry_key=f"{49:04x}", kind=pb.ACCESS_KIND_EVICT)
            assert (await stub.ReportAccesses(events())).accepted_events == 61
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert not list((tmp_path / "cache_index").glob("*.npz")) if (tmp_path / "cache_index").exists() else True
    proc = start_cache_manager(tmp_path, port)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pbg.CacheManagerServiceStub(channel)
            entries = (await stub.ListEvictionCandidates(
                pb.ListEvictionCandidatesRequest(pool="p1", limit=100))).entries
        assert {e.entry_key for e in entries} == {f"{i:04x}" for i in range(49)}
        assert {e.entry_key for e in entries if e.hits == 1} == {f"{i:04x}" for i in range(10)}
        assert "61 journaled events replayed" in (tmp_path / "service.log").read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
