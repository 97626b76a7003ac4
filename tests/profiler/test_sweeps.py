"""Simulator sweeps over gRPC: streamed points, the ladder stop, profiles, bad specs, cancel, paging."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from greenserve.common.errors import error_detail_from_rpc_error
from greenserve.profiler.method import resolve
from greenserve.profiler.sim_backend import simulate_point
from greenserve.v1 import common_pb2, profiler_pb2

from .conftest import SLO, config, sim_spec, wait_state

DONE = {profiler_pb2.SWEEP_STATE_SUCCEEDED, profiler_pb2.SWEEP_STATE_FAILED, profiler_pb2.SWEEP_STATE_CANCELLED}


async def test_simulator_sweep_streams_points_and_stops_the_ladder(profiler) -> None:
    stub = await profiler(import_published=False)
    spec = sim_spec(configs=[config(), config(cache_dram_bytes=4 << 30)])
    sweep = (await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))).sweep
    assert sweep.total_points == 10 and sweep.state == profiler_pb2.SWEEP_STATE_PENDING
    points, states = [], []
    async for event in stub.WatchSweep(profiler_pb2.WatchSweepRequest(sweep_id=sweep.id)):
        states.append(event.sweep.state)
        if event.HasField("point"):
            points.append(event.point)
    assert states[-1] == profiler_pb2.SWEEP_STATE_SUCCEEDED
    final = (await stub.GetSweep(profiler_pb2.GetSweepRequest(sweep_id=sweep.id))).sweep
    assert len(points) == final.done_points and final.done_points + final.skipped_points == 10
    # each ladder: attainment >= target until the last measured rate, which is below it; higher rates skipped
    assert final.skipped_points > 0
    assert len(final.profile_ids) == 2
    for pid in final.profile_ids:
        key, version = pid.rsplit("@", 1)
        profile = (await stub.GetProfile(profiler_pb2.GetProfileRequest(config_key=key, version=int(version)))).profile
        assert profile.source == common_pb2.PROFILE_SOURCE_SIMULATED and profile.sweep_id == sweep.id
        assert profile.config.workload == "zipf-docs" and "greenserve.simulator" in profile.note
        rates = [p.request_rate_per_s for p in profile.points]
        assert rates == sorted(rates)
        assert [p.below_slo_target for p in profile.points] == [False] * (len(rates) - 1) + [True]
        assert profile.points[-1].slo_attainment_fraction < SLO.attainment_fraction
        assert profile.ladder_note.startswith("stopped: SLO attainment")
        assert list(profile.skipped_rates_per_s) == [r for r in spec.request_rates_per_s if r > rates[-1]]
        low = profile.points[0]
        assert low.ttft_slo_attainment_fraction >= low.slo_attainment_fraction
        assert low.tpot_slo_attainment_fraction >= low.slo_attainment_fraction
        assert 0 < low.ttft_p50_s <= low.ttft_p90_s <= low.ttft_p99_s and low.ttft_mean_s > 0
        assert 0 < low.e2e_p50_s <= low.e2e_p95_s <= low.e2e_p99_s
        assert low.power_source == "simulator_model" and low.power_w > 0 and low.carbon_per_output_token_g > 0
        assert profile.method.warmup_s == 6.0  # 10 % of the 60 s window
    assert any("stopped" in n for n in final.notes)


async def test_full_ladder_measures_every_rate(profiler) -> None:
    stub = await profiler(import_published=False)
    spec = sim_spec(rates=(1.0, 8.0, 16.0))
    spec.method.stop_rule = common_pb2.LADDER_STOP_RULE_FULL_LADDER
    sweep = (await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))).sweep
    final = await wait_state(stub, sweep.id, DONE)
    assert (final.state, final.done_points, final.skipped_points) == (profiler_pb2.SWEEP_STATE_SUCCEEDED, 3, 0)


def _bad(spec_edit):
    spec = sim_spec()
    spec_edit(spec)
    return spec


@pytest.mark.parametrize(("spec", "code", "field"), [
    (_bad(lambda s: s.ClearField("configs")), grpc.StatusCode.INVALID_ARGUMENT, "spec.configs"),
    (_bad(lambda s: s.request_rates_per_s.__setitem__(1, -2.0)), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.request_rates_per_s[1]"),
    (_bad(lambda s: s.request_rates_per_s.__setitem__(0, float("nan"))), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.request_rates_per_s[0]"),
    (_bad(lambda s: s.request_rates_per_s.__setitem__(4, float("inf"))), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.request_rates_per_s[4]"),
    (_bad(lambda s: s.ClearField("request_rates_per_s")), grpc.StatusCode.INVALID_ARGUMENT, "spec.request_rates_per_s"),
    (_bad(lambda s: setattr(s, "workload", "sharegpt-v9")), grpc.StatusCode.INVALID_ARGUMENT, "spec.workload"),
    (_bad(lambda s: s.ClearField("slo")), grpc.StatusCode.INVALID_ARGUMENT, "spec.slo"),
    (_bad(lambda s: setattr(s.slo, "tpot_s", -1.0)), grpc.StatusCode.INVALID_ARGUMENT, "spec.slo.tpot_s"),
    (_bad(lambda s: setattr(s, "backend", profiler_pb2.SWEEP_BACKEND_UNSPECIFIED)), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.backend"),
    (_bad(lambda s: setattr(s.configs[0], "hardware", "Z80")), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.configs[0].hardware"),
    (_bad(lambda s: setattr(s.method, "arrival", "bursty")), grpc.StatusCode.INVALID_ARGUMENT, "spec.method.arrival"),
    # found by an adversarial audit: a negative seed was accepted and the sweep then FAILED in the workload sampler
    (_bad(lambda s: setattr(s, "seed", -1)), grpc.StatusCode.INVALID_ARGUMENT, "spec.seed"),
    # found by an adversarial audit: an unknown stop rule was stored and run as STOP_BELOW_TARGET
    (_bad(lambda s: setattr(s.method, "stop_rule", 99)), grpc.StatusCode.INVALID_ARGUMENT, "spec.method.stop_rule"),
    (_bad(lambda s: (setattr(s, "backend", profiler_pb2.SWEEP_BACKEND_ENGINE),
                     setattr(s, "engine_url", "http://127.0.0.1:9"))),
     grpc.StatusCode.FAILED_PRECONDITION, "spec.engine_url"),
    (_bad(lambda s: (setattr(s, "backend", profiler_pb2.SWEEP_BACKEND_ENGINE), setattr(s, "engine_url", "localhost"))),
     grpc.StatusCode.INVALID_ARGUMENT, "spec.engine_url"),
])
async def test_bad_spec_names_the_field_and_stores_nothing(profiler, spec, code, field) -> None:
    stub = await profiler(import_published=False)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))
    assert err.value.code() == code, err.value.details()
    assert error_detail_from_rpc_error(err.value).field == field
    assert len((await stub.ListSweeps(profiler_pb2.ListSweepsRequest())).sweeps) == 0
    assert len((await stub.ListProfiles(profiler_pb2.ListProfilesRequest())).profiles) == 0


async def test_cancel_stops_within_seconds_and_keeps_points(profiler) -> None:
    stub = await profiler(import_published=False)
    spec = sim_spec(rates=[0.5 * (i + 1) for i in range(12)], configs=[config()] * 40, workload="poisson")
    spec.method.stop_rule = common_pb2.LADDER_STOP_RULE_FULL_LADDER
    sweep = (await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))).sweep
    deadline = time.monotonic() + 60
    while (await stub.GetSweep(profiler_pb2.GetSweepRequest(sweep_id=sweep.id))).sweep.done_points < 3:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    started = time.monotonic()
    cancelled = (await stub.CancelSweep(profiler_pb2.CancelSweepRequest(sweep_id=sweep.id))).sweep
    assert time.monotonic() - started < 30  # bounded by the runner's 10 s wait; generous for a loaded machine
    assert cancelled.state == profiler_pb2.SWEEP_STATE_CANCELLED
    kept = cancelled.done_points
    assert 3 <= kept < cancelled.total_points
    await asyncio.sleep(0.5)
    later = (await stub.GetSweep(profiler_pb2.GetSweepRequest(sweep_id=sweep.id))).sweep
    assert later.done_points == kept and later.state == profiler_pb2.SWEEP_STATE_CANCELLED
    streamed = [e async for e in stub.WatchSweep(profiler_pb2.WatchSweepRequest(sweep_id=sweep.id))]
    assert sum(e.HasField("point") for e in streamed) == kept
    # the partial ladder of the configuration in progress is stored as a profile that says so
    partial = [p for p in (await stub.ListProfiles(profiler_pb2.ListProfilesRequest())).profiles
               if p.ladder_note.startswith("partial")]
    if kept % 12:
        assert len(partial) == 1 and len(partial[0].points) == kept % 12
        assert list(partial[0].skipped_rates_per_s) == list(spec.request_rates_per_s[kept % 12:])
    else:
        assert partial == []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.CancelSweep(profiler_pb2.CancelSweepRequest(sweep_id=sweep.id))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_sweeps_run_in_order_and_page(profiler) -> None:
    stub = await profiler(import_published=False)
    ids = [(await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=sim_spec(rates=(1.0,), seed=i)))).sweep.id
           for i in range(3)]
    for sweep_id in ids:
        assert (await wait_state(stub, sweep_id, DONE)).state == profiler_pb2.SWEEP_STATE_SUCCEEDED
    page = await stub.ListSweeps(profiler_pb2.ListSweepsRequest(page_size=2))
    rest = await stub.ListSweeps(profiler_pb2.ListSweepsRequest(page_size=2, page_token=page.next_page_token))
    assert [s.id for s in page.sweeps] + [s.id for s in rest.sweeps] == ids[::-1] and rest.next_page_token == ""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetSweep(profiler_pb2.GetSweepRequest(sweep_id="nope"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_simulator_point_is_deterministic_and_cache_helps_multiturn() -> None:
    spec = sim_spec(workload="multiturn", seed=3)
    method = resolve(spec)
    a = simulate_point(config(), 4.0, spec, method)
    b = simulate_point(config(), 4.0, spec, method)
    assert a == b
    cached = simulate_point(config(cache_dram_bytes=16 << 30), 4.0, spec, method)
    assert cached.cache_hit_fraction >= a.cache_hit_fraction


def test_cache_configurations_are_prefilled_before_measurement() -> None:
    spec = sim_spec(workload="multiturn", seed=1)
    method = resolve(spec)
    assert method.prefill_requests(2.0, config()) == 0
    assert method.prefill_requests(2.0, config(cache_dram_bytes=1 << 30)) == method.measured_requests(2.0) == 120
    spec.method.cache_prefill_requests = 7
    assert resolve(spec).prefill_requests(2.0, config(cache_dram_bytes=1 << 30)) == 7
    # the pre-fill is not measured: the point stands on the measured requests only
    point = simulate_point(config(cache_dram_bytes=8 << 30), 2.0, sim_spec(workload="multiturn", seed=1), method)
    assert point.requests == 120
