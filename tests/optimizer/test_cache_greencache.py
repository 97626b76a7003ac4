"""The GreenCache ILP: proven optimum (checked by brute force), global and per-hour SLO, the fleet's storage limit,
the fallback when the SLO is out of reach, and a plan with cache targets and their explanation."""

from __future__ import annotations

import itertools
import random

import grpc
import pytest
from greenserve.optimizer.solvers.cache_greencache import (
    GreenCacheIlp,
    PoolCacheModel,
    candidate_sizes,
    restart_charge,
    solve_ilp,
)
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
    await ingest_daily(fc, load_ref("chat"), 1.0, 0.5)
    running = await optimizer(schedule_plans=False, cache_solver="greencache", planner="per-knob")
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
    assert "L1 resize(s), each a restart that empties L1: charged" in plan.explanation


def _with_restarts(m: PoolCacheModel, rng: random.Random, in_force: int | None) -> PoolCacheModel:
    m.restart_g = [[rng.uniform(0, 3) for _ in m.sizes] for _ in m.requests]
    m.in_force_index = in_force
    m.in_force_restart_g = rng.uniform(0, 3)
    return m


def _brute_restarts(m: PoolCacheModel) -> float | None:
    best = None
    n, total = len(m.sizes), sum(m.requests)
    for picks in itertools.product(range(n), repeat=len(m.requests)):
        if sum(m.requests[t] * m.ttft[t][k] for t, k in enumerate(picks)) < m.rho * total or \
                sum(m.requests[t] * m.tpot[t][k] for t, k in enumerate(picks)) < m.rho * total:
            continue
        c = sum(m.carbon_g[t][k] for t, k in enumerate(picks))
        c += sum(m.restart_g[t][picks[t - 1]] for t in range(1, len(picks)) if picks[t] != picks[t - 1])
        if m.in_force_index is not None and picks[0] != m.in_force_index:
            c += m.in_force_restart_g
        best = c if best is None or c < best else best
    return best


@pytest.mark.parametrize("seed", range(10))
def test_restart_charges_are_exact_and_both_backends_agree(seed: int) -> None:
    rng = random.Random(500 + seed)
    m = _with_restarts(_random_model(rng, "a", 4, 4, 0.8), rng, in_force=[None, -1, 0, 2][seed % 4])
    best = _brute_restarts(m)
    results = [solve_ilp([m], backend=b) for b in ("highs", "pulp-highs", "pulp-cbc")]
    for chosen, status, objective, gap in results:
        if best is None:
            assert status != "Optimal" and not chosen
        else:
            assert status == "Optimal" and gap == pytest.approx(0.0, abs=1e-9)
            assert objective == pytest.approx(best, rel=1e-9)


def test_restart_charge_keeps_the_size_when_a_resize_saves_less() -> None:
    # Hour 1's CI makes size 1 cheaper by 2 g; a resize costs 5 g to leave size 0 and 5 g to come back.
    m = PoolCacheModel("a", "dram", [0, 10], [1.0] * 3, [[10, 11], [10, 8], [10, 11]], [[1, 1]] * 3, [[1, 1]] * 3,
                       0.9, "test", [0.0] * 3)
    chosen, _, objective, _ = solve_ilp([m])
    assert chosen["a"] == [0, 1, 0] and objective == pytest.approx(28)
    m.restart_g = [[5.0, 5.0]] * 3
    m.in_force_index = 0
    m.in_force_restart_g = 5.0
    chosen, _, objective, _ = solve_ilp([m])
    assert chosen["a"] == [0, 0, 0] and objective == pytest.approx(30)
    m.carbon_g[1] = [10, 0]  # the resize saves 10 g for 5 + 5 g of restarts: a tie with staying (30 g either way)
    m.carbon_g[2] = [10, 20]
    _, _, objective, _ = solve_ilp([m])
    assert objective == pytest.approx(30)
    m.restart_g = [[2.0, 2.0]] * 3  # cheaper restarts: now the resize pays (10 + 0 + 10 + 2 + 2)
    chosen, _, objective, _ = solve_ilp([m])
    assert chosen["a"] == [0, 1, 0] and objective == pytest.approx(24)


@pytest.mark.parametrize("seed", range(4))
def test_pulp_and_highs_agree_on_coupled_pools(seed: int) -> None:
    rng = random.Random(900 + seed)
    models = [_random_model(rng, "a", 5, 6, 0.8), _random_model(rng, "b", 5, 6, 0.8)]
    for per_hour in (False, True):
        answers = [solve_ilp(models, fleet_limit_bytes=60, per_hour_slo=per_hour, backend=b)
                   for b in ("highs", "pulp-highs")]
        assert answers[0][1] == answers[1][1]
        if answers[0][1] == "Optimal":
            assert answers[0][2] == pytest.approx(answers[1][2], rel=1e-9)


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="backend"):
        solve_ilp([], backend="glpk")


def test_restart_charge_is_the_lost_hits_energy_over_the_refill() -> None:
    m = PoolCacheModel("a", "dram", [0, 10, 20], [1.0] * 2, [[0.0] * 3] * 2, [[1.0] * 3] * 2, [[1.0] * 3] * 2, 0.9,
                       "test", [0.0] * 2)
    GreenCacheIlp(restart_warmup_s=720.0).charge_restarts(m, [[100.0, 80.0, 70.0], [50.0, 40.0, 60.0]], 15)
    # half the saving of the size left, over 720 s of a 3600 s hour; a size that saves nothing costs nothing
    assert m.restart_g == [[0.0, pytest.approx(2.0), pytest.approx(3.0)], [0.0, pytest.approx(1.0), 0.0]]
    assert m.in_force_index == -1 and m.in_force_restart_g == pytest.approx(2.5)  # 15 lies between 10 and 20
    assert restart_charge(m, [1, 1]) == (1, pytest.approx(2.5))
    assert restart_charge(m, [1, 2]) == (2, pytest.approx(2.5 + 1.0))
    with pytest.raises(ValueError, match="restart_warmup_s"):
        GreenCacheIlp(restart_warmup_s=-1.0)
