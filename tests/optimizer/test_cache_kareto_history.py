"""Kareto scores cache tiers on the pool's own recorded traffic (issue 18): the cache-manager's access history
(GetAccessWindow) becomes a replay trace (replay_trace.py), fetched where the planner gathers its inputs
(traffic_history.py): same hour yesterday, else last week, else the most recent hour, else the synthetic shape,
and the plan's explanation names which."""

from __future__ import annotations

import time

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.cache_manager.settings import CacheManagerSettings
from greenserve.cache_manager.service import build as build_cache_manager
from greenserve.common.carbon_params import load_default_params
from greenserve.optimizer.planning import PlanningInputs, SeriesForecast
from greenserve.optimizer.replay_trace import BLOCK_TOKENS, build_trace
from greenserve.optimizer.replay_trace import router_accesses as replay_accesses
from greenserve.optimizer.solvers.cache_kareto import KaretoSearch
from greenserve.optimizer.traffic_history import pool_trace
from greenserve.simulator.workloads import multi_turn_workload
from greenserve.v1 import cache_manager_pb2 as cpb
from greenserve.v1 import cache_manager_pb2_grpc as cpbg
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc

from tests.optimizer.conftest import ci_ref, engine, ingest_daily, load_ref, pool

pytestmark = pytest.mark.timeout(120)
GIB = 1 << 30
HOUR = 3600


def _ts(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def router_accesses(pool_name: str, start_s: float, rate_per_s: float, seconds: float,
                    seed: int = 1) -> tuple[list[cpb.ReportAccessesRequest], float]:
    """Multi-turn conversations as the router reports them (replay_trace.router_accesses: an unbounded cache),
    as ReportAccesses messages, and the true fraction of prompt tokens in blocks an earlier request held."""
    wl = multi_turn_workload(int(rate_per_s / 4 * seconds), rate_per_s / 4, seed=seed, block_tokens=BLOCK_TOKENS)
    wl = wl.head(sum(1 for t in wl.arrival_s if t < seconds))
    held: set[int] = set()
    reused = 0
    for blocks in wl.block_hashes:
        reused += sum(1 for b in blocks if b in held) * BLOCK_TOKENS
        held.update(blocks)
    out = [cpb.ReportAccessesRequest(pool=pool_name, entry_key=a.entry_key, kind=a.kind, tokens=a.tokens,
                                     size_bytes=max(a.tokens, 1), hit_tokens=a.hit_tokens,
                                     conversation_id=a.conversation_id, time=a.time)
           for a in replay_accesses(wl, pool_name, start_s)]
    return out, reused / sum(wl.prompt_tokens)


def _records(requests: list[cpb.ReportAccessesRequest]) -> list[cpb.AccessRecord]:
    return [cpb.AccessRecord(entry_key=r.entry_key, kind=r.kind, tokens=r.tokens, hit_tokens=r.hit_tokens,
                             conversation_id=r.conversation_id, time=r.time) for r in requests]


def test_trace_rebuilds_shared_prefixes_and_scales_to_the_forecast_rate() -> None:
    start = 1_700_000_000.0
    accesses, true_reuse = router_accesses("chat", start, 2.0, 1800.0)
    trace = build_trace("chat", "yesterday", "same hour yesterday", start, _records(accesses),
                        mean_output_tokens=200.0, output_source="test")
    assert trace is not None and len(trace.requests) > 500
    # The reuse the accesses show is rebuilt (hits name the shared prefix; conversations resend their history).
    assert trace.reused_fraction == pytest.approx(true_reuse, abs=0.05) and true_reuse > 0.3
    recorded = trace.recorded_rate_per_s
    assert recorded == pytest.approx(2.0, rel=0.3)
    # Slower forecast: whole conversations are dropped, about half of them, and time is left alone.
    wl, length, how = trace.workload(recorded / 2, 3600.0)
    assert "conversations kept" in how and len(wl) == pytest.approx(len(trace.requests) / 2, rel=0.25)
    groups = {r.group for r in trace.requests}
    kept_groups = {r.group for r in trace.requests if r.blocks in set(wl.block_hashes)}
    assert 0.3 < len(kept_groups) / len(groups) < 0.7
    assert len(wl) / max(wl.duration_s, 1.0) == pytest.approx(recorded / 2, rel=0.3)
    # Faster forecast: every request kept, time compressed; cut at the window.
    wl, length, how = trace.workload(recorded * 2, 300.0)
    assert "every request kept" in how and "arrivals 2x as fast" in how and length == 300.0
    factor = 2.0
    t0 = trace.requests[0].arrival_s
    assert wl.arrival_s[-1] < 300.0 and abs(len(wl) - sum(1 for r in trace.requests
                                                        if r.arrival_s - t0 < 300.0 * factor)) <= 2
    assert sum(wl.output_tokens) / len(wl) == pytest.approx(200.0, rel=0.2)
    # Too few requests: no trace.
    assert build_trace("chat", "yesterday", "x", start, _records(accesses[:10]), mean_output_tokens=200.0,
                       output_source="test") is None
    with pytest.raises(ValueError, match="rate_per_s"):
        trace.workload(0.0, 60.0)


def _inputs(traffic: dict, missing: dict) -> PlanningInputs:
    chat = pool("chat", [engine("e1")], max_cache_dram_bytes=8 * GIB, cache_step_bytes=4 * GIB)
    other = pool("docs", [engine("e2")], max_cache_dram_bytes=8 * GIB, cache_step_bytes=4 * GIB)
    def flat(v: float) -> SeriesForecast:
        return SeriesForecast((v,) * 2, (v,) * 2, (v,) * 2)

    return PlanningInputs(0.0, 2, common_pb2.FleetInventory(pools=[chat, other]), {"FR": flat(300.0)},
                          {"chat": flat(1.0), "docs": flat(1.0)}, {}, load_default_params(), {},
                          traffic=traffic, traffic_missing=missing)


def test_points_are_scored_on_the_recorded_trace_and_the_explanation_names_it() -> None:
    start = 1_700_000_000.0
    accesses, _ = router_accesses("chat", start, 2.0, 1200.0)
    trace = build_trace("chat", "yesterday", "same hour yesterday (2023-11-13 22:00-23:00 UTC)", start,
                        _records(accesses), mean_output_tokens=200.0, output_source="test")
    solver = KaretoSearch(window_s=120.0, time_limit_s=120.0, max_evaluations=6)
    out = solver.solve(_inputs({"chat": trace}, {"docs": "same hour yesterday: none recorded"}))
    chat = next(line for line in out.explanation if line.startswith("pool chat"))
    docs = next(line for line in out.explanation if line.startswith("pool docs"))
    assert "replayed the pool's own traffic of same hour yesterday (2023-11-13 22:00-23:00 UTC)" in chat
    assert "synthetic multi-turn shape" in docs and "same hour yesterday: none recorded" in docs
    # The recorded trace is what was replayed: the same search on the synthetic shape scores differently.
    with_trace = solver.search_pool(_inputs({"chat": trace}, {}), _inputs({}, {}).pool("chat"),
                                    time.perf_counter() + 60)
    synthetic = solver.search_pool(_inputs({}, {}), _inputs({}, {}).pool("chat"), time.perf_counter() + 60)
    assert [p.latency_s for p in with_trace.points] != [p.latency_s for p in synthetic.points]


async def test_optimizer_fetches_history_and_falls_back(start_inprocess, forecaster, optimizer) -> None:
    cm = await start_inprocess(CacheManagerSettings, build_cache_manager, follow_plans=False)
    cm_channel = grpc.aio.insecure_channel(cm.address)
    stub = cpbg.CacheManagerServiceStub(cm_channel)
    hour = int(time.time()) // HOUR * HOUR
    yesterday, accesses_2h = hour - 86400, hour - 2 * HOUR
    accesses, _ = router_accesses("chat", yesterday, 1.0, 900.0)
    recent, _ = router_accesses("docs", accesses_2h, 1.0, 600.0, seed=2)
    weekly, _ = router_accesses("weekly", hour - 7 * 86400, 1.0, 600.0, seed=3)

    async def gen(items):
        for item in items:
            yield item
    await stub.ReportAccesses(gen(accesses + recent + weekly))

    # pool_trace's order: yesterday (chat), else the most recent hour (docs), else nothing (idle).
    chat = pool("chat", [engine("a100", "A100-80GB")], max_cache_dram_bytes=8 * GIB, cache_step_bytes=4 * GIB)
    docs = pool("docs", [engine("b100", "A100-80GB")], max_cache_dram_bytes=8 * GIB, cache_step_bytes=4 * GIB)
    idle = pool("idle", [engine("c100", "A100-80GB")], max_cache_dram_bytes=8 * GIB, cache_step_bytes=4 * GIB)
    trace, why = await pool_trace(stub, None, docs, hour)
    assert trace is not None and trace.source == "recent" and why == ""
    assert "same hour yesterday" not in trace.label and "most recent hour" in trace.label
    assert trace.output_source == "the default"
    weekly_pool = pool("weekly", [engine("d100", "A100-80GB")], max_cache_dram_bytes=8 * GIB)
    trace, why = await pool_trace(stub, None, weekly_pool, hour)
    assert trace is not None and trace.source == "last_week" and "same hour last week" in trace.label
    trace, why = await pool_trace(stub, None, idle, hour)
    assert trace is None and "same hour yesterday" in why and "same hour last week" in why

    fc = grpc.aio.insecure_channel(forecaster.address)
    await ingest_daily(fc, ci_ref("FR"), 60.0, 30.0)
    for name in ("chat", "docs", "idle"):
        await ingest_daily(fc, load_ref(name), 0.5, 0.2)
    # chat's output tokens per second: the trace's mean output per request comes from them.
    await ingest_daily(fc, common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_LOAD, key="chat",
                                                unit=common_pb2.UNIT_OUTPUT_TOKENS_PER_S), 150.0, 60.0)
    running = await optimizer(schedule_plans=False, cache_solver="kareto", cache_manager_addr=cm.address)
    opt = optimizer_pb2_grpc.OptimizerServiceStub(grpc.aio.insecure_channel(running.address))
    await opt.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(pools=[chat, docs, idle])))
    plan = (await opt.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=1, dry_run=True))).plan
    outcome = next(o for o in plan.solver_outcomes if o.knob == "cache_targets")
    assert outcome.status == "ok", outcome.detail
    lines = {name: next((x for x in plan.explanation.splitlines() if f"pool {name}: Kareto" in x), "")
             for name in ("chat", "docs", "idle")}
    assert "replayed the pool's own traffic of same hour yesterday" in lines["chat"], plan.explanation
    assert "mean output 300 tokens (the forecaster's load history of that hour)" in lines["chat"], plan.explanation
    assert "the most recent hour with recorded accesses" in lines["docs"], plan.explanation
    assert "synthetic multi-turn shape" in lines["idle"] and "none recorded" in lines["idle"], plan.explanation
    await cm_channel.close()


def test_scores_are_cached_by_the_trace_digest_without_holding_the_trace() -> None:
    import gc
    import weakref

    from greenserve.optimizer.solvers.cache_kareto import score_point

    start = 1_700_000_000.0
    accesses, _ = router_accesses("chat", start, 1.0, 600.0, seed=4)
    trace = build_trace("chat", "yesterday", "x", start, _records(accesses), mean_output_tokens=100.0,
                        output_source="test")
    twin = build_trace("chat", "yesterday", "x", start, _records(accesses), mean_output_tokens=100.0,
                       output_source="test")
    args = ("llama3-8b@A100-80GB", 0, 0, 1.0, 120.0, 1.0, 0.1)
    first = score_point(*args, trace=trace)
    assert score_point(*args, trace=twin) is first  # same content, same digest: the cached score
    assert score_point(*args) is not first  # the synthetic shape is another key
    ref = weakref.ref(trace)
    del trace, twin
    gc.collect()
    assert ref() is None  # the cache keeps scores, not the recorded windows
