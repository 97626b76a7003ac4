"""16 clients store profiles at once, SIGKILL while they write, restart: no error before the kill, and every
acknowledged (config key, version) is there with its points; versions per key have no gap or repeat."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import grpc
import pytest
from greenserve.v1 import profiler_pb2, profiler_pb2_grpc

from tests.conftest import free_port
from tests.process import sigkill_while_writing, start_service_process
from tests.profiler.test_store import measured


def _start(tmp_path, port: int):
    return start_service_process("greenserve.profiler", "greenserve.v1.ProfilerService", tmp_path / "pr", port, env={},
                                 log_name="profiler.log", extra_args=["--no-import-published", "--log-level=WARNING"])


@pytest.mark.slow
async def test_sixteen_writers_sigkill_restart_keeps_exactly_the_acknowledged(tmp_path) -> None:
    port = free_port()
    proc = await asyncio.to_thread(_start, tmp_path, port)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = profiler_pb2_grpc.ProfilerServiceStub(channel)
    acked: dict[tuple[str, int], int] = {}
    errors: list[str] = []
    killed = asyncio.Event()

    async def writer(i: int) -> None:
        n = 0
        while not killed.is_set():
            n += 1
            rates = tuple(float(r) for r in range(1, 2 + (i + n) % 4))
            try:
                stored = (await stub.PutProfile(profiler_pb2.PutProfileRequest(
                    profile=measured(rates, cache_dram_bytes=(i % 4) << 30)), timeout=30)).profile
                acked[(stored.config_key, stored.version)] = len(rates)
            except grpc.aio.AioRpcError as exc:
                if not killed.is_set():
                    errors.append(f"{exc.code().name}: {exc.details()}")
                return

    tasks = [asyncio.create_task(writer(i)) for i in range(16)]
    await sigkill_while_writing(proc, tasks, killed, write_s=3.0)
    assert not errors, errors[:5]
    assert len(acked) > 16
    proc = await asyncio.to_thread(_start, tmp_path, port)
    try:
        for (key, version), points in acked.items():
            got = (await stub.GetProfile(profiler_pb2.GetProfileRequest(config_key=key, version=version))).profile
            assert len(got.points) == points
        versions: dict[str, list[int]] = defaultdict(list)
        for p in (await stub.ListProfiles(profiler_pb2.ListProfilesRequest())).profiles:
            versions[p.config_key].append(p.version)
        for key, vs in versions.items():
            assert sorted(vs) == list(range(1, len(vs) + 1)), key
    finally:
        proc.kill()
        proc.wait(10)
        await channel.close()
