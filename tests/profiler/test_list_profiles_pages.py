"""ListProfiles answers a page at a time: page_size (0: 50, at most 1000), page_token, next_page_token.

It answered every stored profile, points included, in one message: no bound on the reply. A client from before
paging (no page_size) now gets the first 50 and a next_page_token; `greenserve profile list` and the optimizer
follow the tokens. The token is a position in the (config_key, version) order, so profiles stored between two
pages neither repeat nor hide others."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import grpc
import pytest

from greenserve.profiler.service import ProfilerSettings, build
from greenserve.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc

from .conftest import SLO, config

PUBLISHED = 22  # the built-in published profiles a profiler imports on its first start


def _measured(workload: str, rate: float = 1.0, **cfg: Any) -> common_pb2.Profile:
    profile = common_pb2.Profile(config=config(workload=workload, **cfg), slo=SLO,
                                 source=common_pb2.PROFILE_SOURCE_MEASURED, note="engine http://10.0.0.7:8000")
    profile.points.add(request_rate_per_s=rate, ttft_p50_s=0.1, slo_attainment_fraction=0.95, requests=100)
    return profile


async def _put(stub: profiler_pb2_grpc.ProfilerServiceStub, *profiles: common_pb2.Profile) -> None:
    for profile in profiles:
        await stub.PutProfile(profiler_pb2.PutProfileRequest(profile=profile))


async def _pages(stub: profiler_pb2_grpc.ProfilerServiceStub,
                 request: profiler_pb2.ListProfilesRequest) -> list[list[tuple[str, int]]]:
    pages = []
    while True:
        reply = await stub.ListProfiles(request)
        pages.append([(p.config_key, p.version) for p in reply.profiles])
        if not reply.next_page_token:
            return pages
        request.page_token = reply.next_page_token


async def test_pages_return_every_profile_exactly_once(profiler) -> None:
    stub = await profiler()
    await _put(stub, *(_measured(f"w{i:02d}") for i in range(30)), _measured("w00", 2.0), _measured("w00", 3.0))
    stored = PUBLISHED + 32
    everything = await _pages(stub, profiler_pb2.ListProfilesRequest(page_size=1000))
    assert len(everything) == 1 and len(everything[0]) == stored == len(set(everything[0]))
    assert everything[0] == sorted(everything[0])

    pages = await _pages(stub, profiler_pb2.ListProfilesRequest(page_size=7))
    assert [len(p) for p in pages] == [7] * 7 + [5]
    assert [key for page in pages for key in page] == everything[0]

    # A client that predates paging (no page_size) gets a bounded first page and the token of the rest.
    old = await stub.ListProfiles(profiler_pb2.ListProfilesRequest())
    assert len(old.profiles) == 50 and old.next_page_token

    # Filters hold across pages; latest_only keeps one version of w00.
    mine = await _pages(stub, profiler_pb2.ListProfilesRequest(page_size=4, latest_only=True,
                                                               source=common_pb2.PROFILE_SOURCE_MEASURED))
    flat = [key for page in mine for key in page]
    assert len(flat) == 30 == len({k for k, _ in flat}) and ("llama3-8b@H100-80GB|workload=w00", 3) in flat

    # Profiles stored between two pages shift nothing: the next page starts after the last profile returned.
    first = await stub.ListProfiles(profiler_pb2.ListProfilesRequest(page_size=10))
    await _put(stub, _measured("w00", model="aaa"), _measured("w00", 4.0))  # a key before the cursor, one after
    rest = await _pages(stub, profiler_pb2.ListProfilesRequest(page_size=10, page_token=first.next_page_token))
    seen = [(p.config_key, p.version) for p in first.profiles] + [key for page in rest for key in page]
    assert len(seen) == len(set(seen)) == stored + 1 and set(everything[0]) <= set(seen)
    assert ("llama3-8b@H100-80GB|workload=w00", 4) in seen and "aaa@H100-80GB|workload=w00" not in dict(seen)


BAD_TOKENS = [
    "nope!",  # not base64url
    "QUFB" * 1024,  # base64, but longer than any token
    base64.urlsafe_b64encode(b"\xff\xfe:key").decode(),  # not UTF-8
    base64.urlsafe_b64encode(b"0:llama3-8b@H100-80GB").decode(),  # versions start at 1
    base64.urlsafe_b64encode(b"99999999999999999999:k").decode(),  # past the version column
    base64.urlsafe_b64encode(b"\xd9\xa3:k").decode(),  # a non-ASCII digit
    base64.urlsafe_b64encode(b"3:").decode(),  # no key
    base64.urlsafe_b64encode(b"3:" + b"k" * 256).decode(),  # longer than any key
]


async def test_a_key_of_the_longest_kind_pages_on(profiler) -> None:
    # 255 characters of 4 UTF-8 bytes each: its token is the longest ListProfiles returns.
    stub = await profiler(import_published=False)
    await _put(stub, *(_measured(f"w{i}", model="\U0001F600" * (255 - len("@H100-80GB|workload=w0")))
                       for i in range(3)))
    pages = await _pages(stub, profiler_pb2.ListProfilesRequest(page_size=1))
    assert [len(p) for p in pages] == [1, 1, 1]


@pytest.mark.parametrize("token", BAD_TOKENS)
async def test_a_token_listprofiles_did_not_return_is_invalid_argument(profiler, token: str) -> None:
    stub = await profiler(import_published=False)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListProfiles(profiler_pb2.ListProfilesRequest(page_token=token))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("page_token: ")


async def test_a_page_size_past_the_largest_is_invalid_argument(profiler) -> None:
    stub = await profiler(import_published=False)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListProfiles(profiler_pb2.ListProfilesRequest(page_size=1001))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith("page_size: ")


async def test_profile_list_cli_follows_the_pages(start_inprocess: Any, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from greenserve_client.commands import profile as profile_cli

    svc = await start_inprocess(ProfilerSettings, build, log_json=False)
    channel = grpc.aio.insecure_channel(svc.address)
    try:
        stub = profiler_pb2_grpc.ProfilerServiceStub(channel)
        await _put(stub, *(_measured(f"w{i:02d}") for i in range(30)))  # 52 in all: past the default page of 50
        expected = [key for page in await _pages(stub, profiler_pb2.ListProfilesRequest(page_size=1000))
                    for key in page]
    finally:
        await channel.close()
    for page_size in (1000, 20):  # one page; three
        monkeypatch.setattr(profile_cli, "LIST_PAGE_SIZE", page_size, raising=False)
        capsys.readouterr()
        code = await asyncio.to_thread(profile_cli.main, ["list", "--json", "--profiler-addr", svc.address])
        out = capsys.readouterr().out
        assert code == 0
        listed = [(p["config_key"], p.get("version", 0)) for p in json.loads(out.splitlines()[-1])["profiles"]]
        assert listed == expected and len(listed) == PUBLISHED + 30


async def test_profile_sweeps_cli_follows_the_pages(start_inprocess: Any, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`greenserve profile sweeps` lists every sweep, not only ListSweeps' first page."""
    from greenserve_client.commands import profile as profile_cli

    from .conftest import sim_spec

    svc = await start_inprocess(ProfilerSettings, build, log_json=False)
    channel = grpc.aio.insecure_channel(svc.address)
    try:
        stub = profiler_pb2_grpc.ProfilerServiceStub(channel)
        ids = {(await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=sim_spec(seed=i)))).sweep.id
               for i in range(3)}
    finally:
        await channel.close()
    runner = svc.server.registrations[0].servicer.runner
    asked: list[int] = []
    listed = runner.list

    async def spy(page_size: int, page_token: str) -> Any:
        asked.append(page_size)
        return await listed(page_size, page_token)

    monkeypatch.setattr(runner, "list", spy)
    monkeypatch.setattr(profile_cli, "LIST_PAGE_SIZE", 2)  # three sweeps: two pages (the old CLI asked one of 1000)
    capsys.readouterr()
    code = await asyncio.to_thread(profile_cli.main, ["sweeps", "--json", "--profiler-addr", svc.address])
    out = capsys.readouterr().out
    assert code == 0
    assert {s["id"] for s in json.loads(out.splitlines()[-1])["sweeps"]} == ids
    assert asked == [2, 2]
