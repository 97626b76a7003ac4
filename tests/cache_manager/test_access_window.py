"""GetAccessWindow: the bounded access history the planner replays (access_history.py). Accesses reported by
ReportAccesses are recorded per pool and hour up to the cap, survive checkpoints (which prune the journal),
come back in the window in order, old hours are pruned, and bad window arguments are refused naming the field."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.cache_manager import access_history, journal
from greenserve.cache_manager.service import build
from greenserve.cache_manager.settings import CacheManagerSettings
from greenserve.common.persistence import Database
from greenserve.v1 import cache_manager_pb2 as pb
from greenserve.v1 import cache_manager_pb2_grpc as pbg

pytestmark = pytest.mark.timeout(60)
HOUR = 3600


def _ts(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def _stream(items):
    async def gen():
        for item in items:
            yield item
    return gen()


def _request(pool: str, i: int, at: float, conv: str = "c1") -> list[pb.ReportAccessesRequest]:
    """One request as the router reports it: a hit of the previous prompt, then a store of the new one."""
    out = []
    if i:
        out.append(pb.ReportAccessesRequest(pool=pool, entry_key=f"{i - 1:016x}", kind=pb.ACCESS_KIND_HIT,
                                            tokens=100 * i, size_bytes=1024 * i, hit_tokens=100 * i,
                                            conversation_id=conv, time=_ts(at)))
    out.append(pb.ReportAccessesRequest(pool=pool, entry_key=f"{i:016x}", kind=pb.ACCESS_KIND_STORE,
                                        tokens=100 * (i + 1), size_bytes=1024 * (i + 1), conversation_id=conv,
                                        time=_ts(at)))
    return out


async def _start(start_inprocess, tmp_path, **kw):
    svc = await start_inprocess(CacheManagerSettings, build, data_dir=tmp_path / "cm", follow_plans=False, **kw)
    channel = grpc.aio.insecure_channel(svc.address)
    return svc, channel, pbg.CacheManagerServiceStub(channel)


async def test_window_returns_recorded_accesses_across_checkpoints(start_inprocess, tmp_path) -> None:
    # Checkpoints every 0.1 s: they prune the journal, not the access history.
    _svc, channel, stub = await _start(start_inprocess, tmp_path, access_history_per_hour=5, snapshot_interval_s=0.1)
    try:
        hour = (int(time.time()) // HOUR - 2) * HOUR  # two hours ago
        events = [e for i in range(4) for e in _request("p1", i, hour + 10.0 * i)]  # 7 events
        events += _request("p2", 0, hour + 5.0)
        await stub.ReportAccesses(_stream(events))
        await asyncio.sleep(0.5)
        reply = await stub.GetAccessWindow(pb.GetAccessWindowRequest(pool="p1", start=_ts(hour),
                                                                     end=_ts(hour + HOUR)))
        # The cap (5 per pool and hour) keeps the hour's first five accesses, in order; p2 is not mixed in.
        kinds = [a.kind for a in reply.accesses]
        assert kinds == [pb.ACCESS_KIND_STORE, pb.ACCESS_KIND_HIT, pb.ACCESS_KIND_STORE, pb.ACCESS_KIND_HIT,
                         pb.ACCESS_KIND_STORE]
        assert [a.entry_key for a in reply.accesses][:3] == [f"{0:016x}", f"{0:016x}", f"{1:016x}"]
        assert reply.accesses[1].hit_tokens == 100 and reply.accesses[2].tokens == 200
        assert reply.accesses[2].conversation_id == "c1"
        assert reply.accesses[2].time.ToSeconds() == hour + 10
        assert reply.capped_hours == 1 and not reply.truncated
        assert reply.latest_time.ToSeconds() == hour + 20  # the newest recorded (capped ones are not)
        limited = await stub.GetAccessWindow(pb.GetAccessWindowRequest(pool="p1", start=_ts(hour),
                                                                       end=_ts(hour + HOUR), limit=2))
        assert len(limited.accesses) == 2 and limited.truncated
        other = await stub.GetAccessWindow(pb.GetAccessWindowRequest(pool="p1", start=_ts(hour - 86400),
                                                                     end=_ts(hour - 86400 + HOUR)))
        assert len(other.accesses) == 0 and other.latest_time.ToSeconds() == hour + 20
        unknown = await stub.GetAccessWindow(pb.GetAccessWindowRequest(pool="nope", start=_ts(hour),
                                                                       end=_ts(hour + HOUR)))
        assert len(unknown.accesses) == 0 and not unknown.HasField("latest_time")
    finally:
        await channel.close()


async def test_old_hours_are_pruned(tmp_path) -> None:
    db = Database.open(f"sqlite:///{tmp_path / 'cm.db'}", "cache_manager")
    try:
        hist = access_history.AccessHistory(db, per_hour=10, days=1.0)
        now = 10 * 86400.0
        old = journal.Event("p", "aa", pb.ACCESS_KIND_STORE, tokens=5, size_bytes=5, time_s=now - 2 * 86400)
        new = journal.Event("p", "bb", pb.ACCESS_KIND_STORE, tokens=5, size_bytes=5, time_s=now - 600)
        evict = journal.Event("p", "cc", pb.ACCESS_KIND_EVICT, time_s=now - 600)
        assert hist.record([old, new, evict]) == 2  # evictions are not recorded
        assert hist.prune(now) == 1
        q = access_history.WindowQuery("p", now - 3 * 86400, now - 2 * 86400 + 1, 100)
        assert len(hist.window(q).accesses) == 0
        q = access_history.WindowQuery("p", now - 3600, now, 100)
        assert [a.entry_key for a in hist.window(q).accesses] == ["bb"]
    finally:
        db.close()


@pytest.mark.parametrize(("kw", "field"), [
    ({"pool": ""}, "pool"),
    ({"start": None}, "start"),
    ({"end": None}, "end"),
    ({"end": 1000.0}, "end"),  # before start
    ({"end": 1e6 + 86401}, "end"),  # longer than a day
    ({"start": -5.0}, "start"),
    ({"limit": 20_001}, "limit"),
])
async def test_bad_window_arguments_are_refused_naming_the_field(start_inprocess, tmp_path, kw, field) -> None:
    _svc, channel, stub = await _start(start_inprocess, tmp_path)
    try:
        args = {"pool": "p1", "start": 1e6, "end": 1e6 + HOUR, "limit": 0, **kw}
        request = pb.GetAccessWindowRequest(pool=args["pool"], limit=args["limit"])
        if args["start"] is not None:
            request.start.CopyFrom(_ts(args["start"]) if args["start"] >= 0 else Timestamp(seconds=-5))
        if args["end"] is not None:
            request.end.CopyFrom(_ts(args["end"]))
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.GetAccessWindow(request)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.value.details()
        assert field in exc.value.details()
    finally:
        await channel.close()
