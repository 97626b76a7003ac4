"""Kareto's search over the disk medium (issue 18, item 2): with two or more media declared (Pool.disk_tiers) the
medium is a categorical axis (one Algorithm-1 search per medium, budget shared, Pareto sets merged with the medium as
an attribute); one declared medium searches as before; an unknown medium is refused naming the field."""

from __future__ import annotations

import time

import grpc
import pytest
from greenserve.common.carbon_params import load_default_params
from greenserve.optimizer.planning import PlanningInputs, SeriesForecast
from greenserve.optimizer.solvers import cache_kareto
from greenserve.optimizer.solvers.cache_kareto import KaretoSearch, PointScore
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc

from tests.optimizer.conftest import engine, pool

GIB = 1 << 30
NVME = common_pb2.CacheDiskTier(medium="nvme", path="/mnt/nvme/lmcache")
HDD = common_pb2.CacheDiskTier(medium="hdd", path="/mnt/hdd/lmcache")
READ_S = {"": 0.05, "nvme": 0.05, "sata-ssd": 0.15, "hdd": 0.4}  # the fake scorer's TTFT of a hit per medium


def _inputs(rate: float, *, ttft_s: float = 1.0, tiers=(NVME, HDD), ci: float = 300.0, **kw) -> PlanningInputs:
    chat = pool("chat", [engine("e1")], max_cache_disk_bytes=128 * GIB, cache_step_bytes=32 * GIB,
                disk_tiers=list(tiers), **kw)
    chat.slo.ttft_s = ttft_s
    def flat(v: float) -> SeriesForecast:
        return SeriesForecast((v,), (v,), (v,))

    return PlanningInputs(0.0, 1, common_pb2.FleetInventory(pools=[chat]), {"FR": flat(ci)}, {"chat": flat(rate)},
                          {}, load_default_params(), {})


@pytest.fixture
def fake_replay(monkeypatch):
    """A deterministic stand-in for the simulator replay: hits grow with the disk (up to 80 % at 128 GiB) and save
    the same energy on every medium, but a hit's TTFT is the medium's read time; calls are recorded."""
    calls: list[tuple[int, int, str]] = []

    def score(profile, dram_bytes, disk_bytes, rate_per_s, window_s, ttft_slo_s, tpot_slo_s, seed=7,
              disk_ttl_s=0.0, trace=None, disk_medium=""):
        calls.append((dram_bytes, disk_bytes, disk_medium))
        hit = 0.8 * min(1.0, disk_bytes / (128 * GIB))
        base = 0.3 + 0.2 * rate_per_s
        ttft = base * (1 - hit) + hit * READ_S[disk_medium]
        return PointScore(ttft, rate_per_s, 300.0 + 20.0 * rate_per_s * (1 - hit),
                          1.0 if ttft <= ttft_slo_s else 0.5, 1.0, float(disk_bytes))

    monkeypatch.setattr(cache_kareto, "score_point", score)
    return calls


def test_low_load_picks_the_lower_embodied_medium_a_tight_slo_picks_nvme(fake_replay) -> None:
    solver = KaretoSearch(time_limit_s=60.0)
    loose = _inputs(1.0, ttft_s=1.0)
    out = solver.solve(loose)
    (target,) = out.per_interval[0]
    # Every medium meets the SLO and saves the same energy: HDD's eighth of the SSD's embodied carbon decides.
    assert (target.disk_medium, target.disk_path, target.disk_bytes) == ("hdd", "/mnt/hdd/lmcache", 128 * GIB)
    assert "hdd: 88% less embodied per TB than nvme, TTFT still within the SLO" in out.explanation[0]
    assert "media searched: nvme best" in out.explanation[0] and "disk 128.0 GiB on hdd" in out.explanation[0]
    assert {m for _, d, m in fake_replay if d > 0} == {"nvme", "hdd"}  # both media searched
    search = solver.search_pool(loose, loose.pool("chat"), time.perf_counter() + 60.0)
    assert search is not None
    assert {p.tag for p in search.points} == {"", "nvme", "hdd"}  # "" : the shared no-disk points, kept once
    assert len([p for p in search.points if p.y == 0]) == 1
    assert {p.tag for p in search.pareto} >= {"hdd"}

    tight = _inputs(1.0, ttft_s=0.2)  # only NVMe's reads keep TTFT within 0.2 s (HDD: 0.42 s at 128 GiB)
    out = solver.solve(tight)
    (target,) = out.per_interval[0]
    assert (target.disk_medium, target.disk_path, target.disk_bytes) == ("nvme", "/mnt/nvme/lmcache", 128 * GIB)
    assert "nvme: the only medium whose disk meets the SLO (attainment 1.00)" in out.explanation[0]
    assert "hdd: no disk size meets the SLO" in out.explanation[0]
    assert "(last: the disk medium)" in out.detail and ",hdd" in out.detail


def test_the_evaluation_budget_is_shared_between_media(fake_replay) -> None:
    solver = KaretoSearch(time_limit_s=60.0, max_evaluations=8)
    inputs = _inputs(1.0, tiers=(NVME, HDD, common_pb2.CacheDiskTier(medium="sata-ssd", path="/mnt/ssd/c",
                                                                     max_bytes=64 * GIB)))
    search = solver.search_pool(inputs, inputs.pool("chat"), time.perf_counter() + 60.0)
    assert search is not None
    # 8 // 3 = 2, but at least 4 each (Algorithm 1's minimum); sata-ssd's 0-64 GiB in 32 GiB steps has 3 points.
    counts = {m: len([c for c in fake_replay if c[2] == m]) for m in ("nvme", "hdd", "sata-ssd")}
    assert counts == {"nvme": 4, "hdd": 4, "sata-ssd": 3} and len(fake_replay) == 11
    assert max(p.y for p in search.points if p.tag == "sata-ssd") <= 64 * GIB  # the medium's own max_bytes
    assert "stopped at 4 evaluations" in search.stopped


def test_one_declared_medium_searches_as_without_media(fake_replay) -> None:
    solver = KaretoSearch(time_limit_s=60.0)
    one = _inputs(1.0, tiers=(NVME,))
    none = _inputs(1.0, tiers=())
    a = solver.search_pool(one, one.pool("chat"), time.perf_counter() + 60.0)
    b = solver.search_pool(none, none.pool("chat"), time.perf_counter() + 60.0)
    assert a is not None and b is not None
    assert [(p.x, p.y, p.cost) for p in a.points] == [(p.x, p.y, p.cost) for p in b.points]
    assert (a.chosen.x, a.chosen.y) == (b.chosen.x, b.chosen.y) and a.grid_points == b.grid_points
    out = solver.solve(one)
    (target,) = out.per_interval[0]
    assert (target.disk_medium, target.disk_path) == ("nvme", "/mnt/nvme/lmcache")
    assert "media searched" not in out.explanation[0]
    (target,) = solver.solve(none).per_interval[0]
    assert (target.disk_medium, target.disk_path) == ("", "")


def test_replayed_under_load_nvme_keeps_the_slo_hdd_does_not() -> None:
    """Through the real simulator replay (Llama-3 8B / A100-80GB, 5 requests/s, TTFT 1 s): an HDD's reads (270 MB/s)
    leave TTFT attainment near no-cache's, so the NVMe disk is chosen and the explanation says why."""
    solver = KaretoSearch(time_limit_s=120.0)
    inputs = _inputs(5.0, ci=60.0)
    inputs.fleet.pools[0].max_cache_disk_bytes = 128 * GIB
    inputs.fleet.pools[0].cache_step_bytes = 64 * GIB
    out = solver.solve(inputs)
    (target,) = out.per_interval[0]
    assert target.disk_medium == "nvme" and target.disk_bytes > 0, out.explanation
    assert "hdd: no disk size meets the SLO" in out.explanation[0]


@pytest.mark.parametrize(("tiers", "field"), [
    ([common_pb2.CacheDiskTier(medium="tape", path="/mnt/t")], "fleet.pools[0].disk_tiers[0].medium"),
    ([NVME, common_pb2.CacheDiskTier(medium="nvme", path="/mnt/b")], "fleet.pools[0].disk_tiers[1].medium"),
    ([common_pb2.CacheDiskTier(medium="hdd", path="relative/dir")], "fleet.pools[0].disk_tiers[0].path"),
    ([common_pb2.CacheDiskTier(medium="hdd", path="/mnt/h", max_bytes=1 << 40)],
     "fleet.pools[0].disk_tiers[0].max_bytes"),
])
async def test_bad_disk_tiers_are_refused_naming_the_field(optimizer, tiers, field) -> None:
    running = await optimizer(schedule_plans=False, cache_solver="kareto")
    stub = optimizer_pb2_grpc.OptimizerServiceStub(grpc.aio.insecure_channel(running.address))
    good = pool("chat", [engine("e1")], max_cache_disk_bytes=128 * GIB, disk_tiers=[NVME, HDD])
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(pools=[good])))
    bad = pool("chat", [engine("e1")], max_cache_disk_bytes=128 * GIB, disk_tiers=tiers)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(pools=[bad])))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.value.details()
    fleet = (await stub.GetFleet(optimizer_pb2.GetFleetRequest())).fleet
    assert [t.medium for t in fleet.pools[0].disk_tiers] == ["nvme", "hdd"]  # unchanged


def test_bench_refuses_unknown_media(capsys) -> None:
    from greenserve.bench.optimizer_cache import main

    for bad in ("tape", "nvme,nvme"):
        with pytest.raises(SystemExit) as exc:
            main(["--kareto-rate", "5", "--kareto-media", bad])
        assert exc.value.code == 2 and "--kareto-media" in capsys.readouterr().err


def test_ttl_axis_per_medium_plans_each_disk_at_its_own_limit(fake_replay) -> None:
    small_hdd = common_pb2.CacheDiskTier(medium="hdd", path="/mnt/hdd/lmcache", max_bytes=64 * GIB)
    inputs = _inputs(1.0, tiers=(NVME, small_hdd))
    solver = KaretoSearch(time_limit_s=60.0, ttl_max_s=800.0)
    search = solver.search_pool(inputs, inputs.pool("chat"), time.perf_counter() + 60.0)
    assert search is not None and {p.tag for p in search.points} == {"nvme", "hdd"}  # TTL points all hold a disk
    assert {(m, d) for _, d, m in fake_replay} == {("nvme", 128 * GIB), ("hdd", 64 * GIB)}
    for p in search.points:
        assert search.target(p)[1] == (64 * GIB if p.tag == "hdd" else 128 * GIB)
    (target,) = solver.solve(inputs).per_interval[0]
    assert target.disk_bytes == (64 * GIB if target.disk_medium == "hdd" else 128 * GIB) and target.disk_path
