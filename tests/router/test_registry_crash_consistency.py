"""The router's engine registry under 16 concurrent writers, then SIGKILL and a restart (issue 21).

16 clients register, re-register (new facts), drain, undrain and deregister engines at once for a few
seconds against a router process; while they are still writing it is killed with SIGKILL and started
again on the same database. Before the kill no call may fail; after the restart the router lists exactly
the acknowledged writes: each engine with the facts and drain state of its last acknowledged write,
no engine an acknowledged deregister removed, nothing never sent, and a write that was in flight at the
kill either fully applied or not at all.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from greenserve.v1 import common_pb2, router_pb2, router_pb2_grpc
from tests.conftest import free_port
from tests.process import sigkill_while_writing, start_service_process

pytestmark = pytest.mark.timeout(180)
CLIENTS = 16
ENGINES_PER_CLIENT = 3
WRITE_S = 2.5
# (mig_uuid, gpu_uuid, kind, idle_power_w, busy_power_w, drained) of an engine; None: not registered
Facts = tuple[str, str, int, float, float, bool] | None


def start_router(data_dir: Path, port: int) -> subprocess.Popen:
    """`python -m greenserve.router` on `port` (no HTTP front, no peers), SERVING; log in `<data_dir>/router.log`."""
    env = {"GREENSERVE_WATCH_PLANS": "false", "GREENSERVE_FEEDS": "false", "GREENSERVE_HTTP_PORT": "-1",
           "GREENSERVE_HEALTH_INTERVAL_S": "5", "GREENSERVE_SCRAPE_INTERVAL_S": "5", "GREENSERVE_STALE_AFTER_S": "10",
           "GREENSERVE_LOG_LEVEL": "WARNING", "GREENSERVE_WORKERS": "1"}  # the SIGKILL hits the router itself
    return start_service_process("greenserve.router", "greenserve.v1.RouterService", data_dir, port, env=env,
                                 log_name="router.log")


@dataclass
class Client:
    c: int
    acked: dict[str, Facts] = field(default_factory=dict)  # engine id -> state after its last acknowledged write
    in_flight: tuple[str, Facts] | None = None  # (engine id, state if applied) of the write the kill cut
    writes: int = 0
    errors: list[str] = field(default_factory=list)


def _engine(c: int, j: int, facts: Facts) -> common_pb2.Engine:
    assert facts is not None
    mig, gpu, kind, idle, busy, _ = facts
    # closed local ports: the monitor's probes fail fast
    return common_pb2.Engine(id=f"c{c:02d}-e{j}", url=f"http://127.0.0.1:{1 + c * ENGINES_PER_CLIENT + j}",
                             pool=f"p{c % 4}", model="m", kind=kind, gpu_uuid=gpu, mig_uuid=mig,
                             idle_power_w=idle, busy_power_w=busy)


async def _run_client(cl: Client, address: str, killed: asyncio.Event) -> None:
    rng = random.Random(cl.c)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = router_pb2_grpc.RouterServiceStub(channel)
        while not killed.is_set():
            j = rng.randrange(ENGINES_PER_CLIENT)
            engine_id = f"c{cl.c:02d}-e{j}"
            now = cl.acked.get(engine_id)
            op = rng.choice(["register", "register", "drain", "undrain", "deregister"]) if now else "register"
            if op == "register":
                n = cl.writes
                drained = now[5] if now else False  # a re-registration keeps the drain
                after: Facts = (f"MIG-{cl.c:02d}{j}-{n}", f"GPU-{cl.c:02d}-{n % 3}", 1 + n % 2, 50.0 + n % 7,
                                200.0 + n % 11, drained)
                call = stub.RegisterEngine(router_pb2.RegisterEngineRequest(engine=_engine(cl.c, j, after)))
            elif op == "deregister":
                after = None
                call = stub.DeregisterEngine(router_pb2.DeregisterEngineRequest(engine_id=engine_id))
            else:
                assert now is not None
                after = (*now[:5], op == "drain")
                call = (stub.Drain(router_pb2.DrainRequest(engine_ids=[engine_id])) if op == "drain"
                        else stub.Undrain(router_pb2.UndrainRequest(engine_ids=[engine_id])))
            cl.in_flight = (engine_id, after)
            try:
                await call
            except grpc.aio.AioRpcError as exc:
                if killed.is_set() and exc.code() == grpc.StatusCode.UNAVAILABLE:
                    return  # cut by the kill: in_flight stays ambiguous
                cl.errors.append(f"{op} {engine_id}: {exc.code().name} {exc.details()}")
                cl.in_flight = None
                continue
            cl.in_flight = None
            cl.acked[engine_id] = after
            cl.writes += 1


def _listed(address: str) -> dict[str, Facts]:
    with grpc.insecure_channel(address) as channel:
        reply = router_pb2_grpc.RouterServiceStub(channel).ListEngines(router_pb2.ListEnginesRequest(), timeout=10)
    out: dict[str, Facts] = {}
    for s in reply.engines:
        e = s.engine
        drained = e.state in (common_pb2.ENGINE_STATE_DRAINED, common_pb2.ENGINE_STATE_DRAINING)
        out[e.id] = (e.mig_uuid, e.gpu_uuid, e.kind, e.idle_power_w, e.busy_power_w, drained)
    return out


async def test_registry_holds_exactly_the_acknowledged_writes_after_sigkill(tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    proc = start_router(tmp_path, port)
    clients = [Client(c) for c in range(CLIENTS)]
    killed = asyncio.Event()
    tasks = [asyncio.create_task(_run_client(cl, address, killed)) for cl in clients]
    await sigkill_while_writing(proc, tasks, killed, WRITE_S)
    errors = [e for cl in clients for e in cl.errors]
    assert not errors, errors[:10]
    writes = sum(cl.writes for cl in clients)
    assert writes >= CLIENTS * 5, f"only {writes} acknowledged writes in {WRITE_S} s"

    proc = start_router(tmp_path, port)
    try:
        listed = _listed(address)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    for cl in clients:
        for j in range(ENGINES_PER_CLIENT):
            engine_id = f"c{cl.c:02d}-e{j}"
            allowed = [cl.acked.get(engine_id)]
            if cl.in_flight is not None and cl.in_flight[0] == engine_id:
                allowed.append(cl.in_flight[1])
            assert listed.get(engine_id) in allowed, (engine_id, listed.get(engine_id), allowed)
    assert set(listed) <= {f"c{c:02d}-e{j}" for c in range(CLIENTS) for j in range(ENGINES_PER_CLIENT)}
