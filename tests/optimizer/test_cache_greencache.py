"""The GreenCache ILP: proven optimum (checked by brute force), global and per-hour SLO, the fleet's storage limit,
the fallback when the SLO is out of reach, and a plan with cache targets and their explanation."""

from __future__ import annotations

import itertools
import random

import grpc
import pytest
from greenserve.optimizer.solvers.cache_greencache import PoolCacheModel, candidate_sizes, solve_ilp
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc

from tests.optimizer.conftest import ci_ref, engine, ingest_daily, load_ref, pool


def _random_model(rng: random.Random, name: str, hours: int, n: int, rho: float) -> PoolCacheModel:
    return PoolCacheModel(
        name, "disk", [k * 10 for k in range(n)], [rng.uniform(1, 5) for _ in range(hours)],
        [[rng.uniform(1, 10) for _ in range(n)] for _ in range(hours)],
        [[rng.uniform(0.5, 1) for _ in range(n)] for _ in range(hours)],
        [[rng.uniform(0.7, 1) for _ in range(n)] for _ in range(hours)], rho, "test", [0.0] * hours)


def _brute(models: list[PoolCacheModel], limit: int = 0, per_hour: bool = False) -> float | None:
    best = None
    hours, n = len(models[0].requests), len(models[0].sizes)
    for combo in itertools.product(itertools.product(range(n), repeat=hours), repeat=len(models)):
        ok = True
        for m, picks in zip(models, combo):
            total = sum(m.requests)
            if per_hour:
                ok &= all(m.ttft[t][k] >= m.rho and m.tpot[t][k] >= m.rho for t, k in enumerate(picks))
            else:
                ok &= sum(m.requests[t] * m.ttft[t][k] for t, k in enumerate(picks)) >= m.rho * total
                ok &= sum(m.requests[t] * m.tpot[t][k] for t, k in enumerate(picks)) >= m.rho * total
        if limit:
            ok &= all(sum(m.sizes[p[t]] for m, p in zip(models, combo)) <= limit for t in range(hours))
        if ok:
            c = sum(m.carbon_g[t][k] for m, p in zip(models, combo) for t, k in enumerate(p))
            best = c if best is None or c < best else best
    return best


@pytest.mark.parametrize("seed", range(12))
def test_ilp_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    models = [_random_model(rng, "a", 3, 4, 0.85)]
    best = _brute(models)
    chosen, status, objective, gap = solve_ilp(models)
    if best is None:
        assert status != "Optimal" and not chosen
    else:
        assert status == "Optimal" and gap == pytest.approx(0.0, abs=1e-9)
        assert objective == pytest.approx(best, rel=1e-9)
        assert sum(models[0].carbon_g[t][k] for t, k in enumerate(chosen["a"])) == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_fleet_storage_limit_couples_pools_and_per_hour_slo(seed: int) -> None:
    rng = random.Random(100 + seed)
    models = [_random_model(rng, "a", 2, 3, 0.8), _random_model(rng, "b", 2, 3, 0.8)]
    for limit in (20, 30):
        best = _brute(models, limit=limit)
        chosen, status, objective, _ = solve_ilp(models, fleet_limit_bytes=limit)
        assert (best is None) == (status != "Optimal")
        if best is not None:
            assert objective == pytest.approx(best, rel=1e-9)
            for t in range(2):
                assert sum(m.sizes[chosen[m.pool][t]] for m in models) <= limit
    per_hour = _brute(models[:1], per_hour=True)
    chosen, status, objective, _ = solve_ilp(models[:1], per_hour_slo=True)
    if per_hour is not None:
        assert objective == pytest.approx(per_hour, rel=1e-9)


def test_candidate_sizes_follow_the_step_and_stay_bounded() -> None:
    tb = 10**12
    assert candidate_sizes(16 * tb, tb) == [k * tb for k in range(17)]
    assert candidate_sizes(5, 2) == [0, 2, 4, 5]
    many = candidate_sizes(1000 * tb, tb)
    assert len(many) <= 65 and many[0] == 0 and many[-1] == 1000 * tb


async def test_plan_sizes_the_cache_with_an_explanation(forecaster, optimizer) -> None:
    fc = grpc.aio.insecure_channel(forecaster.address)
    await ingest_daily(fc, ci_ref("FR"), 60.0, 30.0)
    await ingest_daily(fc, load_ref("chat"), 3.0, 2.0)
    running = await optimizer(schedule_plans=False, cache_solver="greencache")
    stub = optimizer_pb2_grpc.OptimizerServiceStub(grpc.aio.insecure_channel(running.address))
    chat = pool("chat", [engine("a100", "A100-80GB")], max_cache_dram_bytes=8 << 30, cache_step_bytes=4 << 30)
    other = pool("batch", [engine("b1", "A100-80GB")])  # no cache limit: its sizes in force are kept (none)
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=common_pb2.FleetInventory(pools=[chat, other])))
    plan = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=4))).plan
    outcome = next(o for o in plan.solver_outcomes if o.knob == "cache_targets")
    assert outcome.solver == "cache.greencache_ilp" and outcome.status == "ok", outcome.detail
    assert "optimal" in outcome.detail
    for interval in plan.intervals:
        (target,) = interval.cache_targets
        assert target.pool == "chat" and target.dram_bytes in (0, 4 << 30, 8 << 30) and target.disk_bytes == 0
    assert "vs Full Cache" in plan.explanation and "vs No Cache" in plan.explanation
    assert "pool chat: dram cache" in plan.explanation
