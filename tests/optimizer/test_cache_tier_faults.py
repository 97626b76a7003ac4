"""A pool whose LMCache tier the profiler measured as not working (its KV connector asked for thousands of prefix
tokens and served none: LMCache's degraded mode on a CPU build) is planned without the tier: no cache target, the
engines' capacity without its prefix hits, `explain` says why, and `plan status` shows the tier as not working."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from greenserve.optimizer import cache_tier_health
from greenserve.profiler.points import PointExtras, RequestSamples, summarize
from greenserve.profiler.service import ProfilerSettings
from greenserve.profiler.service import build as build_profiler
from greenserve.v1 import common_pb2, optimizer_pb2, profiler_pb2, profiler_pb2_grpc

from tests.optimizer.conftest import engine, pool
from tests.optimizer.test_cache_capacity_coupling import DRAM_CAPACITY, HBM_CAPACITY, _inputs, _joint, fake_models
from tests.optimizer.test_plans import FLEET, _setup

__all__ = ["fake_models"]  # the fixture, used by name below

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"
GIB = 1 << 30
DEGRADED = common_pb2.KV_CONNECTOR_STATE_DEGRADED
WORKING = common_pb2.KV_CONNECTOR_STATE_WORKING


def _profile(states: list[int], created_s: int, key: str = "k", model: str = MODEL,
             hardware: str = "A100-80GB") -> common_pb2.Profile:
    profile = common_pb2.Profile(
        config_key=key, version=1, source=common_pb2.PROFILE_SOURCE_MEASURED,
        config=common_pb2.ProfileConfig(model=model, hardware=hardware, cache_dram_bytes=8 * GIB, workload="chat"),
        slo=common_pb2.Slo(ttft_s=1.0, tpot_s=0.1, attainment_fraction=0.9))
    for i, state in enumerate(states):
        profile.points.add(request_rate_per_s=1.0 + i, slo_attainment_fraction=0.95, requests=100,
                           kv_connector_state=state)
    profile.created_at.FromSeconds(created_s)
    return profile


def test_the_latest_verdict_of_the_pools_model_and_hardware_decides() -> None:
    fleet = common_pb2.FleetInventory(pools=[pool("chat", [engine("e0")])])
    hardware = {"e0": "A100-80GB"}
    degraded = _profile([DEGRADED, DEGRADED, common_pb2.KV_CONNECTOR_STATE_UNKNOWN], 1000)
    (fault,) = cache_tier_health.faults(fleet, [degraded], hardware).values()
    assert fault.pool == "chat" and fault.profile_config_key == "k"
    assert "served no prefix tokens in 2 of 2 measured windows" in fault.reason
    # a later measurement in which the connector served tokens takes the fault back; an earlier one does not
    assert cache_tier_health.faults(fleet, [degraded, _profile([WORKING], 2000, "k2")], hardware) == {}
    assert set(cache_tier_health.faults(fleet, [degraded, _profile([WORKING], 500, "k2")], hardware)) == {"chat"}
    # another model's or another GPU's connector says nothing of this pool's; no verdict says nothing either
    assert cache_tier_health.faults(fleet, [_profile([DEGRADED], 1000, model="other/model")], hardware) == {}
    assert cache_tier_health.faults(fleet, [_profile([DEGRADED], 1000, hardware="H100-80GB")], hardware) == {}
    assert cache_tier_health.faults(fleet, [_profile([common_pb2.KV_CONNECTOR_STATE_NONE], 1000)], hardware) == {}


def test_the_profilers_point_carries_the_windows_verdict() -> None:
    import numpy as np

    one = np.ones(4)
    samples = RequestSamples(arrival_s=np.arange(4.0), ttft_s=one * 0.1, tpot_s=one * 0.01, e2e_s=one,
                             output_tokens=one * 10, prompt_tokens=one * 100)
    slo = common_pb2.Slo(ttft_s=1.0, tpot_s=0.1, attainment_fraction=0.9)
    assert summarize(1.0, samples, slo, PointExtras(kv_connector="degraded")).kv_connector_state == DEGRADED
    assert summarize(1.0, samples, slo, PointExtras(kv_connector="working")).kv_connector_state == WORKING
    assert summarize(1.0, samples, slo, PointExtras()).kv_connector_state == common_pb2.KV_CONNECTOR_STATE_UNSPECIFIED


def test_a_degraded_tier_gets_no_cache_target_and_no_capacity_from_it(fake_models: list[tuple]) -> None:
    """The joint plan that picks a DRAM tier for its prefix hits (test_cache_capacity_coupling) does not, once the
    tier is known not to work: no target, the capacity without the tier, and the explanation says why."""
    fault = common_pb2.CacheTierFault(pool="chat", reason="served no prefix tokens in 3 of 3 measured windows",
                                      profile_config_key="k")
    planner = _joint()
    try:
        working = planner.plan(_inputs(hits=0.5), trigger="test", created_s=1_656_460_800.0).plan
        inputs = _inputs(hits=0.5)
        inputs.cache_tier_faults = {"chat": fault}
        broken = planner.plan(inputs, trigger="test", created_s=1_656_460_800.0).plan
    finally:
        planner.close()
    assert all(t.dram_bytes >= 32 * GIB for iv in working.intervals for t in iv.cache_targets if t.pool == "chat")
    for interval in broken.intervals:
        assert not [t for t in interval.cache_targets if t.pool == "chat"]
        (figures,) = [p for p in interval.pools if p.pool == "chat"]
        assert figures.capacity_requests_per_s == pytest.approx(3 * HBM_CAPACITY)
        assert figures.capacity_requests_per_s < 3 * DRAM_CAPACITY
    assert list(broken.cache_tier_faults) == [fault]
    assert "pool chat: LMCache tier NOT WORKING, planned without it" in broken.explanation
    assert "LMCache tier not working: no cache target" in broken.explanation


async def test_the_profilers_verdict_reaches_the_plan_and_plan_status(forecaster, optimizer, start_inprocess: Any,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Profiler and optimizer as services: a measured profile whose connector was degraded, stored with PutProfile,
    makes the optimizer's plan say the tier does not work and give the pool no cache target."""
    from greenserve_client.commands import plan as plan_cli

    profiler = await start_inprocess(ProfilerSettings, build_profiler, log_json=False)
    channel = grpc.aio.insecure_channel(profiler.address)
    try:
        stored = (await profiler_pb2_grpc.ProfilerServiceStub(channel).PutProfile(profiler_pb2.PutProfileRequest(
            profile=_profile([DEGRADED, DEGRADED], 0)))).profile
        assert [p.kv_connector_state for p in stored.points] == [DEGRADED, DEGRADED]
        bad = _profile([99], 0)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await profiler_pb2_grpc.ProfilerServiceStub(channel).PutProfile(profiler_pb2.PutProfileRequest(profile=bad))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "points[0].kv_connector_state" in err.value.details()
    finally:
        await channel.close()
    running, stub, _ = await _setup(forecaster, optimizer, schedule_plans=False, profiler_addr=profiler.address)
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=FLEET))
    plan = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2))).plan
    assert [f.pool for f in plan.cache_tier_faults] == ["chat"]
    assert plan.cache_tier_faults[0].profile_config_key == stored.config_key
    assert not [t for iv in plan.intervals for t in iv.cache_targets if t.pool == "chat"]
    assert "pool chat: LMCache tier NOT WORKING" in plan.explanation
    assert any(n.startswith("LMCache tier of pool chat not working: ") for n in plan.input_notes)
    capsys.readouterr()
    await asyncio.to_thread(plan_cli.main, ["status", "--optimizer-addr", running.address])
    out = capsys.readouterr().out
    assert "LMCache tier of pool chat: NOT WORKING, planned without it" in out, out
