"""Kareto's adaptive Pareto search as the planner's cache solver (cache_kareto.py): points scored by simulator
replays, the Pareto set kept in the detail, the lowest-carbon point meeting the SLO chosen, budgets honoured."""

from __future__ import annotations

import time

import grpc
import pytest
from greenserve.common.carbon_params import load_default_params
from greenserve.optimizer.planning import PlanningInputs, SeriesForecast
from greenserve.optimizer.solvers import cache_solver
from greenserve.optimizer.solvers.cache_kareto import KaretoSearch, _axis
from greenserve.optimizer.solvers.cache_pareto import pareto_filter
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc

from tests.optimizer.conftest import ci_ref, engine, ingest_daily, load_ref, pool

GIB = 1 << 30


def _inputs(rate: float, ci: float = 300.0, **pool_kw) -> PlanningInputs:
    chat = pool("chat", [engine("e1")], **pool_kw)
    other = pool("batch", [engine("e2")])  # no cache limit: not searched, nothing emitted for it
    hours = 2
    def flat(v: float) -> SeriesForecast:
        return SeriesForecast((v,) * hours, (v,) * hours, (v,) * hours)

    return PlanningInputs(0.0, hours, common_pb2.FleetInventory(pools=[chat, other]), {"FR": flat(ci)},
                          {"chat": flat(rate), "batch": flat(1.0)}, {}, load_default_params(), {})


def test_search_chooses_the_lowest_carbon_point_meeting_the_slo_and_keeps_the_pareto_set() -> None:
    solver = KaretoSearch(window_s=120.0, time_limit_s=120.0)
    inputs = _inputs(0.5, max_cache_dram_bytes=4 * GIB, max_cache_disk_bytes=32 * GIB, cache_step_bytes=4 * GIB)
    search = solver.search_pool(inputs, inputs.pool("chat"), time.perf_counter() + 120.0)
    assert search is not None and search.points
    # Adaptive: never more points than the grid, the Pareto set is the filter of what was scored.
    assert search.grid_points == 2 * 9 and len(search.points) < search.grid_points  # DRAM 0, 4 x disk 0-32 step 4
    assert {(p.x, p.y) for p in search.pareto} == {(p.x, p.y) for p in pareto_filter(search.points)}
    ok = [p for p in search.points if search.attained(p) >= 0.9]
    assert search.meets_slo == bool(ok)
    if ok:
        assert search.chosen.cost == min(p.cost for p in ok)
    # At this light load the tiers change nothing in the replay, so their embodied carbon decides: no cache.
    assert (search.chosen.x, search.chosen.y) == (0.0, 0.0)

    plan = cache_solver("kareto")
    plan.window_s = 120.0
    plan.time_limit_s = 120.0
    out = plan.solve(inputs)
    assert out.status == "ok"
    for interval in out.per_interval:
        (target,) = interval
        assert target.pool == "chat" and target.dram_bytes == 0 and target.disk_bytes == 0
    assert "pool chat: Kareto search: DRAM 0.0 GiB, disk 0.0 GiB" in out.explanation[0]
    assert "Pareto set" in out.explanation[0] and "the lowest-carbon point meeting the SLO" in out.explanation[0]
    assert "Pareto sets (dram_bytes,disk_bytes or disk TTL s,ttft_s,requests_per_s,g_per_h): chat: 0,0," in out.detail


def test_ttl_axis_plans_the_disk_at_its_limit_with_a_ttl_and_charges_what_it_held() -> None:
    inputs = _inputs(0.5, max_cache_disk_bytes=32 * GIB, cache_step_bytes=8 * GIB)
    solver = KaretoSearch(window_s=120.0, time_limit_s=120.0, ttl_max_s=800.0)
    search = solver.search_pool(inputs, inputs.pool("chat"), time.perf_counter() + 120.0)
    assert search is not None and search.ttl_disk_bytes == 32 * GIB and search.grid_points == 9  # TTL 0-800 s / 100
    assert all(p.x == 0.0 and p.y in {100.0 * k for k in range(9)} for p in search.points)
    by_ttl = {p.y: p for p in search.points}
    # An elastic disk holds less than the whole allocation: its embodied carbon, and so its cost, is lower.
    assert by_ttl[800.0].cost < by_ttl[0.0].cost
    out = solver.solve(inputs)
    (target,) = out.per_interval[0]
    assert target.disk_bytes == 32 * GIB and target.ttl_s == search.target(search.chosen)[2]
    assert "TTL" in out.explanation[0] or target.ttl_s == 0
    with pytest.raises(ValueError, match="ttl_max_s"):
        KaretoSearch(ttl_max_s=-1.0)


def test_time_limit_stops_the_search_with_the_points_so_far() -> None:
    inputs = _inputs(0.5, max_cache_disk_bytes=64 * GIB, cache_step_bytes=4 * GIB)
    solver = KaretoSearch(window_s=120.0, time_limit_s=1e-9)
    assert solver.search_pool(inputs, inputs.pool("chat"), time.perf_counter() - 1.0) is None
    out = solver.solve(inputs)
    assert out.status == "kept" and out.per_interval == [[], []]


def test_axes_and_bad_settings() -> None:
    assert _axis(0, GIB) == (1.0, 1.0)
    assert _axis(16 * GIB, 4 * GIB) == (4 * GIB, 8 * GIB)  # start grid 0, 8, 16 GiB; fine step 4 GiB
    fine, coarse = _axis(1000 * GIB, GIB)
    assert fine == 1000 * GIB / 16 and coarse == fine * 8
    for kw, field in (({"window_s": 10.0}, "window_s"), ({"max_evaluations": 2}, "max_evaluations"),
                      ({"time_limit_s": float("nan")}, "time_limit_s")):
        with pytest.raises(ValueError, match=field):
            KaretoSearch(**kw)
    with pytest.raises(ValueError, match="kareto"):
        cache_solver("nope")


async def test_optimizer_runs_kareto_when_asked(forecaster, optimizer) -> None:
    fc = grpc.aio.insecure_channel(forecaster.address)
    await ingest_daily(fc, ci_ref("FR"), 60.0, 30.0)
    await ingest_daily(fc, load_ref("chat"), 0.5, 0.2)
    running = await optimizer(schedule_plans=False, cache_solver="kareto")
    stub = optimizer_pb2_grpc.OptimizerServiceStub(grpc.aio.insecure_channel(running.address))
    chat = pool("chat", [engine("a100", "A100-80GB")], max_cache_disk_bytes=16 * GIB, cache_step_bytes=8 * GIB)
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(pools=[chat])))
    plan = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2))).plan
    outcome = next(o for o in plan.solver_outcomes if o.knob == "cache_targets")
    assert outcome.solver == "cache.kareto" and outcome.status == "ok", outcome.detail
    assert "Pareto sets" in outcome.detail and "pool chat: Kareto search" in plan.explanation
    for interval in plan.intervals:
        (target,) = interval.cache_targets
        assert target.pool == "chat" and target.disk_bytes in (0, 8 * GIB, 16 * GIB) and target.dram_bytes == 0
