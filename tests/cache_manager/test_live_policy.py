"""The adaptive policy in the cache-manager (adaptive.LivePolicy): fed by the pool's accesses, it makes the pool's
index evict in the leader's order; memory bounded by sampling; the choice visible in the metrics and the order of
ListEvictionCandidates; the old policies still selectable (--eviction-policy lcs / lru)."""

from __future__ import annotations

import json
import time

import grpc
import numpy as np
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.cache_manager import adaptive
from greenserve.common.cache_index.index import CacheIndex
from greenserve.cache_manager.service import build
from greenserve.cache_manager.settings import CacheManagerSettings
from greenserve.cache_manager.shrink_order import lru_victims_to_fit
from greenserve.v1 import cache_manager_pb2 as pb
from greenserve.v1 import cache_manager_pb2_grpc as pbg

SIZE = 100


def _store(key: str, t: float) -> adaptive.Access:
    return adaptive.Access("store", key, t, tokens=256, size_bytes=SIZE)


def _hit(key: str, t: float) -> adaptive.Access:
    return adaptive.Access("hit", key, t, tokens=256, hit_tokens=256)


def hot_and_scans(t0: float = 0.0) -> list[adaptive.Access]:
    """Four hot entries read 3 times each after every scan of 4 one-off entries: a cache of 6 keeps them through
    the scans by LCS (their hits); LRU lets the scans push two of them out every round."""
    out, t = [], t0
    for h in range(4):
        out.append(_store(f"hot{h}", t))
        t += 1
    for round_ in range(30):
        for s in range(4):
            out.append(_store(f"scan{round_}_{s}", t))
            t += 1
        for h in range(4):
            for _ in range(3):
                out.append(_hit(f"hot{h}", t))
                t += 0.01
    return out


def stale_hot(t0: float = 0.0) -> list[adaptive.Access]:
    """Entries hit 40 times and never again, four one-off entries, then a working set of 6 cycled: LRU keeps the
    working set, LCS keeps the stale entries for a while and misses it."""
    out, t = [], t0
    for h in range(4):
        out.append(_store(f"old{h}", t))
        for _ in range(40):
            t += 0.1
            out.append(_hit(f"old{h}", t))
    for s in range(4):
        t += 1
        out.append(_store(f"once{s}", t))
    for s in range(6):
        t += 1
        out.append(_store(f"ws{s}", t))
    for _ in range(20):
        for s in range(6):
            t += 1
            out.append(_hit(f"ws{s}", t))
    return out


def _feed(policy: adaptive.LivePolicy, accesses: list[adaptive.Access]) -> int:
    return sum(policy.observe(a) for a in accesses)


def test_leader_lcs_where_reuse_is_skewed_lru_where_hits_are_stale() -> None:
    skewed = adaptive.LivePolicy("adaptive", 6 * SIZE)
    assert skewed.leader == "LRU"  # before any evidence: the burden of proof is on LCS
    assert _feed(skewed, hot_and_scans()) == 1
    assert skewed.leader == "LCS" and skewed.order == "lcs"
    won = skewed.status()["window_disagreement_tokens"]
    assert won["LCS"] > 1.5 * won["LRU"] and "eviction order LCS" in skewed.text()
    stale = adaptive.LivePolicy("adaptive", 6 * SIZE)
    _feed(stale, stale_hot())
    assert stale.leader == "LRU" and stale.duel.won[adaptive.LRU] > 0
    # The real cache served only the HIT events' tokens: the status's "real" sum counts them.
    assert stale.status()["window_hit_tokens"]["real"] > 0


def test_shadows_hold_the_capacity_and_follow_it() -> None:
    p = adaptive.LivePolicy("adaptive", 6 * SIZE)
    _feed(p, hot_and_scans())
    assert p.status()["shadow_entries"] == [6, 6]
    p.set_capacity(3 * SIZE)
    assert p.status()["shadow_entries"] == [3, 3] and p.capacity_bytes == 3 * SIZE


def test_memory_bounded_by_sampling() -> None:
    p = adaptive.LivePolicy("adaptive", 10**12, max_entries=64)
    for i in range(5000):
        p.observe(_store(f"k{i}", float(i)))
        assert max(p.status()["shadow_entries"]) <= 64 and len(p._sizes) <= 128
    assert p.sample_shift >= 6 and p.sample_rate == 1 / (1 << p.sample_shift)
    # The kept keys are exactly the sampled ones, in both shadows.
    kept = set(p._lru.keys)
    assert kept and all(p._sampled(h) for h in kept)
    lcs_hashes = {int(p._lcs.index.key_hash[s]) for s in np.flatnonzero(p._lcs.index.live)}
    assert lcs_hashes == kept


def test_a_sampled_duel_still_finds_the_leader() -> None:
    """400 hot entries read 3 times after every scan of 400 one-offs, a cache of 600: LCS wins; with shadows of at
    most 64 keys (1 key in 16 simulated, in shadows of 1/16 of the size) the duel still sees it."""
    out, t = [], 0.0
    for h in range(400):
        out.append(_store(f"hot{h}", t))
    for r in range(30):
        for s in range(400):
            t += 0.01
            out.append(_store(f"scan{r}_{s}", t))
        for h in range(400):
            for _ in range(3):
                t += 0.001
                out.append(_hit(f"hot{h}", t))
    full = adaptive.LivePolicy("adaptive", 600 * SIZE, max_entries=100_000)
    small = adaptive.LivePolicy("adaptive", 600 * SIZE, max_entries=64)
    _feed(full, out)
    _feed(small, out)
    assert full.leader == small.leader == "LCS" and full.sample_shift == 0
    assert small.sample_shift >= 3 and max(small.status()["shadow_entries"]) <= 64
    # Scaled by 2^k, the sample's window sums estimate the whole stream's.
    for cache in ("LRU", "LCS", "real"):
        ratio = small.status()["window_hit_tokens"][cache] / full.status()["window_hit_tokens"][cache]
        assert 0.5 < ratio < 2.0, (cache, ratio)


def test_no_capacity_or_fixed_policy_runs_no_shadows() -> None:
    unknown = adaptive.LivePolicy("adaptive", 0)
    assert _feed(unknown, hot_and_scans()) == 0 and unknown.leader == "LRU"
    assert unknown.status()["shadow_entries"] == [0, 0]
    for mode in ("lcs", "lru"):
        fixed = adaptive.LivePolicy(mode, 6 * SIZE)
        _feed(fixed, hot_and_scans())
        assert fixed.leader == mode.upper() and fixed.status()["shadow_entries"] == [0, 0]
    with pytest.raises(ValueError):
        adaptive.LivePolicy("mru")


def _index_of(accesses: list[adaptive.Access]) -> CacheIndex:
    ix = CacheIndex()
    for a in accesses:
        if a.kind == "store":
            ix.store(a.key, tokens=a.tokens, size_bytes=a.size_bytes, now_s=a.time_s)
        else:
            ix.hit(a.key, hit_tokens=a.hit_tokens, now_s=a.time_s)
    return ix


def test_index_order_lru_evicts_least_recent_first_lcs_lowest_score() -> None:
    accesses = stale_hot()
    ix = _index_of(accesses)
    now = accesses[-1].time_s + 1
    lcs_first = [ix.key_of(int(s)) for s in ix.choose_victims(4, now)]
    assert lcs_first == [f"once{s}" for s in range(4)]  # one hit each: below the stale entries' 41
    ix.set_order("lru")
    lru_first = [ix.key_of(int(s)) for s in ix.choose_victims(4, now)]
    assert lru_first == [f"old{h}" for h in range(4)]  # the least recently accessed
    assert lru_first == lru_victims_to_fit(ix, ix.bytes_in_use - 4 * SIZE)
    views = ix.lowest(4, now)
    assert [v.entry_key for v in views] == lru_first
    ix.set_order("lcs")  # the views' scores are LCS scores whatever the order
    assert [v.score for v in views] == pytest.approx(list(ix.scores(now, np.array([ix.slot(k) for k in lru_first]))))
    with pytest.raises(ValueError):
        ix.set_order("fifo")


# ----- in the service --------------------------------------------------------------------------------
def _requests(pool: str, accesses: list[adaptive.Access], t0: float) -> list[pb.ReportAccessesRequest]:
    out = []
    for a in accesses:
        ts = Timestamp()
        ts.FromNanoseconds(int((t0 + a.time_s) * 1e9))
        kind = pb.ACCESS_KIND_STORE if a.kind == "store" else pb.ACCESS_KIND_HIT
        out.append(pb.ReportAccessesRequest(pool=pool, entry_key=a.key, kind=kind, tokens=a.tokens,
                                            size_bytes=a.size_bytes or SIZE, hit_tokens=a.hit_tokens, time=ts))
    return out


async def _report(stub, messages) -> None:
    async def gen():
        for m in messages:
            yield m
    await stub.ReportAccesses(gen())


def _gauge(reader, name: str) -> dict[str, tuple[float, dict]]:
    out = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    for dp in m.data.data_points:
                        key = dp.attributes["pool"] + ("/" + dp.attributes["cache"] if "cache" in dp.attributes else "")
                        out[key] = (dp.value, dict(dp.attributes))
    return out


@pytest.mark.timeout(60)
async def test_service_evicts_in_the_leaders_order_and_shows_it(start_inprocess, tmp_path) -> None:
    svc = await start_inprocess(CacheManagerSettings, build, data_dir=tmp_path / "cm", follow_plans=False,
                                policy_capacity_bytes=6 * SIZE)
    channel = grpc.aio.insecure_channel(svc.address)
    stub = pbg.CacheManagerServiceStub(channel)
    try:
        t0 = time.time() - 600
        await _report(stub, _requests("stale", stale_hot(), t0))
        await _report(stub, _requests("skewed", hot_and_scans(), t0))
        leads = _gauge(svc.metrics, "greenserve.cache_manager.eviction_policy.lcs_leads")
        assert leads["stale"] == (0, {"pool": "stale", "policy": "LRU", "mode": "adaptive"})
        assert leads["skewed"][0] == 1 and leads["skewed"][1]["policy"] == "LCS"
        assert _gauge(svc.metrics, "greenserve.cache_manager.eviction_policy.switches")["skewed"][0] == 1
        window = _gauge(svc.metrics, "greenserve.cache_manager.eviction_policy.window_hit_tokens")
        assert window["skewed/LCS"][0] > window["skewed/LRU"][0] > 0 and "skewed/real" in window
        # LRU leads the stale pool: its index lists the least recently accessed first, though the one-off
        # entries score lower by LCS.
        listed = (await stub.ListEvictionCandidates(pb.ListEvictionCandidatesRequest(pool="stale", limit=4))).entries
        assert [e.entry_key for e in listed] == [f"old{h}" for h in range(4)]
        assert all(e.hits == 40 and e.lcs_score > 0 for e in listed)
    finally:
        await channel.close()


@pytest.mark.timeout(60)
async def test_service_old_policy_still_selectable(start_inprocess, tmp_path) -> None:
    svc = await start_inprocess(CacheManagerSettings, build, data_dir=tmp_path / "cm", follow_plans=False,
                                policy_capacity_bytes=6 * SIZE, eviction_policy="lcs")
    channel = grpc.aio.insecure_channel(svc.address)
    stub = pbg.CacheManagerServiceStub(channel)
    try:
        await _report(stub, _requests("stale", stale_hot(), time.time() - 600))
        assert _gauge(svc.metrics, "greenserve.cache_manager.eviction_policy.lcs_leads")["stale"] == \
            (1, {"pool": "stale", "policy": "LCS", "mode": "lcs"})
        listed = (await stub.ListEvictionCandidates(pb.ListEvictionCandidatesRequest(pool="stale", limit=4))).entries
        assert [e.entry_key for e in listed] == [f"once{s}" for s in range(4)]
    finally:
        await channel.close()
    with pytest.raises(ValueError):
        CacheManagerSettings.model_validate({"eviction_policy": "mru"})


@pytest.mark.parametrize("mode", ["adaptive", "lcs", "lru"])
async def test_disk_shrink_order_follows_the_policy_setting(tmp_path, mode: str) -> None:
    from greenserve.cache_manager.service import CacheManagerServicer
    from greenserve.common.app import ServiceContext
    from greenserve.common.persistence import Database

    settings = CacheManagerSettings.model_validate({"data_dir": tmp_path, "follow_plans": False,
                                                    "eviction_policy": mode})
    db = Database.open(f"sqlite:///{tmp_path / 'cm.db'}", "cache_manager")
    try:
        servicer = CacheManagerServicer(ServiceContext(settings=settings, db=db, telemetry=None))  # type: ignore[arg-type]
        choose = servicer._shrink_order("chat")
        if mode == "lcs":
            assert choose is None  # disk_tier's default: lowest LCS first
            return
        leader = await choose(6 * SIZE)
        # No journaled evidence: the adaptive replay keeps LRU; the fixed LRU order says where it comes from.
        assert leader.policy == "LRU"
        assert ("--eviction-policy lru" in leader.text()) == (mode == "lru")
    finally:
        db.close()


@pytest.mark.timeout(60)
async def test_the_leader_survives_a_restart_with_its_checkpoint(start_inprocess, tmp_path) -> None:
    data = tmp_path / "cm"
    svc = await start_inprocess(CacheManagerSettings, build, data_dir=data, follow_plans=False,
                                policy_capacity_bytes=6 * SIZE)
    channel = grpc.aio.insecure_channel(svc.address)
    try:
        await _report(pbg.CacheManagerServiceStub(channel), _requests("skewed", hot_and_scans(), time.time() - 600))
    finally:
        await channel.close()
    await svc.server.stop(0)  # checkpoints every pool, the policy's state with it
    saved = data / "cache_index" / "policy" / "skewed.json"
    assert saved.exists()
    again = await start_inprocess(CacheManagerSettings, build, data_dir=data, follow_plans=False,
                                  policy_capacity_bytes=6 * SIZE)
    assert _gauge(again.metrics, "greenserve.cache_manager.eviction_policy.lcs_leads")["skewed"][0] == 1
    await again.server.stop(0)
    # A state saved with another checkpoint than the one loaded is not taken: the pool starts from LRU.
    state = json.loads(saved.read_text())
    saved.write_text(json.dumps({**state, "journal_id": state["journal_id"] - 1}))
    third = await start_inprocess(CacheManagerSettings, build, data_dir=data, follow_plans=False,
                                  policy_capacity_bytes=6 * SIZE)
    assert _gauge(third.metrics, "greenserve.cache_manager.eviction_policy.lcs_leads")["skewed"][0] == 0
    await third.server.stop(0)
    for garbage in ("not json", "[1, 2]", json.dumps({**state, "leader": 7})):  # unreadable: LRU, and it starts
        saved.write_text(garbage)
        svc = await start_inprocess(CacheManagerSettings, build, data_dir=data, follow_plans=False,
                                    policy_capacity_bytes=6 * SIZE)
        assert _gauge(svc.metrics, "greenserve.cache_manager.eviction_policy.lcs_leads")["skewed"][0] == 0
        await svc.server.stop(0)
