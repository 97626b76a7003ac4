"""The fuzz harness finds what it is meant to find: a service that writes and then refuses, one that answers
INTERNAL, and one that answers UNKNOWN on undecodable bytes are each reported; a clean RPC is not."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest
import pytest_asyncio
from sqlalchemy import text

from greenserve.common.errors import InvalidArgument
from greenserve.common.server import registration
from greenserve.v1 import profiler_pb2, profiler_pb2_grpc
from tests.fuzz.test_grpc_fuzz import RPCS, Fleet, fuzz_rpc

pytestmark = pytest.mark.asyncio(loop_scope="module")
PROFILER = "greenserve.v1.ProfilerService"
CASES = 40


class FaultyProfiler(profiler_pb2_grpc.ProfilerServiceServicer):
    """Three planted defects and one clean RPC."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx

    async def PutProfile(self, request, context):  # writes, then refuses
        with self.ctx.db.engine.begin() as conn:
            conn.execute(text("CREATE TABLE IF NOT EXISTS planted (n INTEGER)"))
            conn.execute(text("INSERT INTO planted VALUES (1)"))
        raise InvalidArgument("profile", "refused after writing")

    async def GetProfile(self, request, context):  # an unhandled error: INTERNAL
        raise RuntimeError("planted")

    async def ListSweeps(self, request, context):  # clean
        if request.page_size > 1000:
            raise InvalidArgument("page_size", "must be at most 1000")
        return profiler_pb2.ListSweepsResponse()


def faulty_build(ctx):
    return [registration(profiler_pb2, profiler_pb2_grpc, "ProfilerService", FaultyProfiler(ctx))]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def faulty(tmp_path_factory: pytest.TempPathFactory):
    fleet = Fleet(tmp_path_factory.mktemp("fuzz-self-check"))
    target = await fleet.get(PROFILER, build=faulty_build)
    yield target
    await fleet.stop()


def rpc(name: str):
    return next(r for r in RPCS if r.path == f"/{PROFILER}/{name}")


async def test_a_refusal_that_wrote_is_reported(faulty) -> None:
    failures, seen, _ = await fuzz_rpc(faulty, rpc("PutProfile"), CASES, seed=1)
    assert any("refused with INVALID_ARGUMENT" in f and "db.planted" in f for f in failures), failures


async def test_internal_is_reported(faulty) -> None:
    failures, seen, _ = await fuzz_rpc(faulty, rpc("GetProfile"), CASES, seed=1)
    assert seen.get("INTERNAL", 0) > 0 and any(": INTERNAL " in f for f in failures), failures


async def test_unknown_on_undecodable_bytes_would_be_reported(faulty, monkeypatch) -> None:
    from greenserve.common import server

    monkeypatch.setattr(server, "_tolerant", lambda deserializer: deserializer)  # the runtime before issue 21
    # The interceptor caches each method's wrapped handler: give this test empty caches (restored after it,
    # so the handlers wrapped without _tolerant here do not outlive it).
    for interceptor in [o for o in gc.get_objects() if isinstance(o, server.ServerInterceptor)]:
        monkeypatch.setattr(interceptor, "_wrapped", {})
    failures, seen, _ = await fuzz_rpc(faulty, rpc("ListSweeps"), CASES, seed=1)
    assert seen.get("UNKNOWN", 0) > 0 and any(": UNKNOWN " in f for f in failures), failures


async def test_a_clean_rpc_passes_and_a_stranger_is_refused(faulty) -> None:
    failures, seen, _ = await fuzz_rpc(faulty, rpc("ListSweeps"), CASES, seed=1)
    assert not failures
    assert seen.get("UNAUTHENTICATED", 0) > 0 and seen.get("INVALID_ARGUMENT", 0) > 0 and seen.get("OK", 0) > 0
    # The unimplemented RPCs of this servicer answer UNIMPLEMENTED to every well-formed request: accepted.
    failures, seen, unimplemented = await fuzz_rpc(faulty, rpc("ListProfiles"), CASES, seed=1)
    assert unimplemented and not failures and seen.get("UNIMPLEMENTED", 0) > 0


async def test_server_metrics_tell_a_server_internal_from_the_client_write_artifact(faulty) -> None:
    path = rpc("GetProfile").path
    before = faulty.server_count(path, "INTERNAL")
    code, _, _ = await faulty.unary(path, b"")
    assert code.name == "INTERNAL"
    # the server counts the RPC in the interceptor's finally, after its status went out: the client can see the
    # status first (found in a CI run on a loaded 2-core host), so give the count a moment to follow
    deadline = time.monotonic() + 5.0
    while faulty.server_count(path, "INTERNAL") == before and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert faulty.server_count(path, "INTERNAL") == before + 1
