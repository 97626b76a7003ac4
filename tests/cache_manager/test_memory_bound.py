"""Resident memory of the cache-manager under a sustained ReportAccesses stream levels off (issue 21).

Every stream stores 500 new entries in one pool, 12 streams (6,000 entries; at most STREAM_S seconds).
With `--index-max-entries` and `--ttl-history-per-pool` small, the index reaches its cap within the first
streams; from then on the index forgets its lowest-LCS entries and RSS must stay flat, under the bound
docs/cache_manager.md states: RSS at start + pools x (index_max_entries x 360 B + ttl_history_per_pool x
200 B) + 64 MiB.
"""
from __future__ import annotations

import signal
import time

import grpc
import pytest

from greenserve.v1 import cache_manager_pb2 as pb
from greenserve.v1 import cache_manager_pb2_grpc as pbg
from tests.cache_manager.process import start_cache_manager
from tests.conftest import free_port
from tests.process import rss_bytes

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
CAP = 1000
STREAM_S = 90.0  # safety bound on a loaded machine; about 5 s on an idle one
STREAMS = 12
PER_STREAM = 500
MIB = 1024 * 1024


async def test_sustained_access_stream_levels_off(tmp_path) -> None:
    port = free_port()
    proc = start_cache_manager(tmp_path, port, index_max_entries=CAP, ttl_history_per_pool=CAP,
                               snapshot_interval_s=1)
    start_rss = rss_bytes(proc.pid)
    samples: list[tuple[int, int]] = []  # (events sent, RSS)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pbg.CacheManagerServiceStub(channel)
            sent = 0
            t0 = time.monotonic()
            while len(samples) < STREAMS and time.monotonic() - t0 < STREAM_S:
                base = sent

                async def events(base=base):
                    for i in range(PER_STREAM):
                        yield pb.ReportAccessesRequest(pool="p1", entry_key=f"{base + i:016x}",
                                                       kind=pb.ACCESS_KIND_STORE, tokens=256, size_bytes=1 << 20,
                                                       conversation_id=f"c{(base + i) % 50}")
                assert (await stub.ReportAccesses(events(), timeout=60)).accepted_events == PER_STREAM
                sent += PER_STREAM
                samples.append((sent, rss_bytes(proc.pid)))
            listed = (await stub.ListEvictionCandidates(pb.ListEvictionCandidatesRequest(pool="p1",
                                                                                         limit=10000))).entries
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert len(listed) == CAP  # the cap holds
    at_cap = [rss for n, rss in samples if n >= 2 * CAP]
    assert len(at_cap) >= 4, f"too few samples past the cap: {samples}"
    half = len(at_cap) // 2
    growth = max(at_cap[half:]) - max(at_cap[:half])
    assert growth <= 8 * MIB, f"RSS still growing past the cap: {[(n, r // MIB) for n, r in samples]}"
    bound = start_rss + CAP * 360 + CAP * 200 + 64 * MIB
    assert max(rss for _, rss in samples) <= bound, [(n, r // MIB) for n, r in samples]
