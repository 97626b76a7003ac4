"""The optimizer reads every stored profile from a profiler that answers ListProfiles a page at a time.

ListProfiles answers at most a page (page_size 0: 50) with a next_page_token; fetch_profiles read only the first
reply, so past a page the optimizer planned without the rest of the profiles (failed before it followed tokens)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from greenserve.optimizer.inputs import fetch_profiles
from greenserve.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc

PROFILES = [common_pb2.Profile(config_key=f"m{i}@A100-80GB", version=1) for i in range(5)]


class PagedProfiler(profiler_pb2_grpc.ProfilerServiceServicer):
    """ListProfiles in pages of two (a profiler from before paging: everything, no token)."""

    def __init__(self, paged: bool) -> None:
        self.paged = paged
        self.requests: list[profiler_pb2.ListProfilesRequest] = []

    async def ListProfiles(self, request: profiler_pb2.ListProfilesRequest, context: Any) -> Any:
        self.requests.append(request)
        if not self.paged:
            return profiler_pb2.ListProfilesResponse(profiles=PROFILES)
        start = int(request.page_token or 0)
        token = str(start + 2) if start + 2 < len(PROFILES) else ""
        return profiler_pb2.ListProfilesResponse(profiles=PROFILES[start:start + 2], next_page_token=token)


@pytest.fixture
async def serve() -> AsyncIterator[Any]:
    servers: list[grpc.aio.Server] = []
    channels: list[grpc.aio.Channel] = []

    async def start(servicer: PagedProfiler) -> grpc.aio.Channel:
        server = grpc.aio.server()
        profiler_pb2_grpc.add_ProfilerServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
        return channels[-1]

    yield start
    for channel in channels:
        await channel.close()
    for server in servers:
        await server.stop(0)


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "before-paging"])
async def test_every_page_of_profiles_is_read(serve, paged: bool) -> None:
    profiler = PagedProfiler(paged)
    notes: list[str] = []
    profiles = await fetch_profiles(await serve(profiler), notes)
    assert [p.config_key for p in profiles] == [p.config_key for p in PROFILES] and not notes
    assert all(r.latest_only for r in profiler.requests)
    assert [r.page_token for r in profiler.requests] == (["", "2", "4"] if paged else [""])


async def test_a_page_too_large_for_the_channel_is_asked_again_smaller() -> None:
    """Profiles of many points: a page of 1000 can pass the channel's message limit (RESOURCE_EXHAUSTED); the page
    is asked again at half the size until it fits, and every profile is still read."""
    big = [common_pb2.Profile(config_key=f"m{i}@A100-80GB", version=1,
                              points=[common_pb2.ProfilePoint(request_rate_per_s=r + 1.0) for r in range(3000)])
           for i in range(6)]

    class BigProfiler(profiler_pb2_grpc.ProfilerServiceServicer):
        def __init__(self) -> None:
            self.sizes: list[int] = []

        async def ListProfiles(self, request: profiler_pb2.ListProfilesRequest, context: Any) -> Any:
            self.sizes.append(request.page_size)
            start = int(request.page_token or 0)
            end = start + request.page_size
            return profiler_pb2.ListProfilesResponse(profiles=big[start:end],
                                                     next_page_token=str(end) if end < len(big) else "")

    profiler = BigProfiler()
    server = grpc.aio.server()
    profiler_pb2_grpc.add_ProfilerServiceServicer_to_server(profiler, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    # a profile of 3000 points is about 30 KB: a 64 KiB limit takes pages of 2 at most
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 64 * 1024)])
    notes: list[str] = []
    try:
        got = await fetch_profiles(channel, notes, timeout_s=10.0)
    finally:
        await channel.close()
        await server.stop(0)
    assert [p.config_key for p in got] == [p.config_key for p in big] and not notes
    assert profiler.sizes[0] == 1000 and min(profiler.sizes) <= 2
