"""The serving-mode solver plans a pool only in modes its engines can run: the launchers' own rule
(``engine_modes.engines_mode_problem``, the one the gpu-partitioner refuses a plan with), and `explain` says why a
mode was not considered."""

from __future__ import annotations

import grpc
from greenserve.common.engine_modes import engines_mode_problem
from greenserve.optimizer.fleet import validate_fleet
from greenserve.optimizer.solvers import serving_modes as sm
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc
from tests.optimizer.conftest import ci_ref, ingest_daily, load_ref
from tests.optimizer.test_serving_modes import REQUESTS, _fleet, _inputs, _modes

VLLM = common_pb2.ENGINE_KIND_VLLM
EMULATOR = common_pb2.ENGINE_KIND_SIMULATED
UNSPECIFIED = common_pb2.ENGINE_KIND_UNSPECIFIED


def _with_engines(fleet: common_pb2.FleetInventory, *kinds: int) -> common_pb2.FleetInventory:
    for i, kind in enumerate(kinds):
        fleet.pools[0].engines.add(id=f"e{i}", url=f"http://127.0.0.1:{8100 + i}", pool="chat",
                                   model=fleet.pools[0].model, kind=kind)
    return fleet


def test_a_vllm_pool_never_gets_dsd_and_explain_says_why() -> None:
    fleet = _with_engines(_fleet(), VLLM)
    validate_fleet(fleet)
    plan = sm.GreenLlmModes(requests=REQUESTS).solve(_inputs(fleet, (1.0, 21.0)))
    assert plan.status == "ok"
    modes = _modes(plan)
    assert sm.DSD not in modes  # the emulator pool below gets DSD at 1 req/s
    assert modes[1] == sm.SPEC_DECODE  # vLLM runs SpecDecode with the pool's draft model
    text = "\n".join(plan.explanation)
    assert "DSD not considered for pool chat: vLLM has no disaggregated speculative decoding" in text
    assert "DSD not considered (its engines cannot run it)" in text
    assert "SpecDecode not considered" not in text and "DPD not considered" not in text


def test_the_emulator_pool_keeps_todays_choices() -> None:
    fleet = _with_engines(_fleet(), EMULATOR, EMULATOR)
    fleet.pools[0].draft.simulator_model = "llama3.2-1b"
    plan = sm.GreenLlmModes(requests=REQUESTS).solve(_inputs(fleet, (1.0, 21.0)))
    assert _modes(plan) == [sm.DSD, sm.SPEC_DECODE]  # as test_serving_modes' pool without engines
    assert "not considered" not in "\n".join(plan.explanation)


def test_an_emulator_pool_without_the_drafts_simulator_model_never_speculates() -> None:
    fleet = _with_engines(_fleet(), EMULATOR)  # the draft names a model only: the emulator cannot load it
    plan = sm.GreenLlmModes(requests=REQUESTS).solve(_inputs(fleet, (1.0, 21.0)))
    assert not {sm.SPEC_DECODE, sm.DSD} & set(_modes(plan))
    text = "\n".join(plan.explanation)
    assert "SpecDecode not considered for pool chat: the emulator's speculative modes need the draft's " \
           "simulator model" in text
    assert "DSD not considered for pool chat" in text


def test_a_vllm_pool_without_a_draft_never_gets_spec_decode() -> None:
    fleet = _with_engines(_fleet(draft=False), VLLM)
    plan = sm.GreenLlmModes(requests=REQUESTS).solve(_inputs(fleet, (1.0, 21.0)))
    assert not {sm.SPEC_DECODE, sm.DSD} & set(_modes(plan))
    assert "SpecDecode not considered for pool chat: vLLM's speculative decoding needs the pool's draft model" \
        in "\n".join(plan.explanation)


def test_dpd_is_not_planned_on_vllm_beside_the_pools_lmcache_server() -> None:
    fleet = _with_engines(_fleet(), VLLM)
    inputs = _inputs(fleet, (0.25,))
    free = sm.pool_modes(inputs, fleet.pools[0], 0)
    assert free is not None and sm.DPD not in free.unsupported
    inputs.cache_sizes = {"chat": (1 << 30, 0)}  # the cache-manager lists an LMCache server for the pool
    plan = sm.GreenLlmModes(requests=REQUESTS).solve(inputs)
    assert _modes(plan)[0] not in (sm.DPD, sm.DSD)
    text = "\n".join(plan.explanation)
    assert "DPD not considered for pool chat: the pool has an LMCache server" in text
    # the emulator has no such rule: its DPD pairs run beside a cache
    emulated = _with_engines(_fleet(), EMULATOR)
    emulated.pools[0].draft.simulator_model = "llama3.2-1b"
    inputs = _inputs(emulated, (0.25,))
    inputs.cache_sizes = {"chat": (1 << 30, 0)}
    assert sm.pool_modes(inputs, emulated.pools[0], 0).unsupported == {}


def test_mixed_kinds_get_only_the_modes_every_kind_runs_and_unspecified_adds_no_rule() -> None:
    def unsupported(*kinds: int) -> set[int]:
        fleet = _with_engines(_fleet(), *kinds)
        fleet.pools[0].draft.simulator_model = "llama3.2-1b"
        inputs = _inputs(fleet, (1.0,))
        inputs.cache_sizes = {"chat": (1 << 30, 0)}
        modes = sm.pool_modes(inputs, fleet.pools[0], 0)
        assert modes is not None
        return set(modes.unsupported)

    assert unsupported() == set()  # no engine listed: all four modes, as before
    assert unsupported(UNSPECIFIED, UNSPECIFIED) == set()
    assert unsupported(EMULATOR) == set()
    assert unsupported(VLLM) == {sm.DPD, sm.DSD}
    assert unsupported(VLLM, UNSPECIFIED) == {sm.DPD, sm.DSD}
    assert unsupported(EMULATOR, VLLM) == {sm.DPD, sm.DSD}
    # one rule per kind, the first refusal named
    target = common_pb2.ServingModeTarget(pool="chat", serving_mode=sm.DSD)
    no_draft = _fleet(draft=False).pools[0]
    assert engines_mode_problem([EMULATOR, VLLM], target, no_draft).startswith("vLLM has no disaggregated")
    assert engines_mode_problem([EMULATOR], target, no_draft).startswith("the emulator's speculative modes")
    assert engines_mode_problem([UNSPECIFIED], target, no_draft) == ""


def test_without_a_feasible_mode_the_fallback_is_one_the_engines_run() -> None:
    setting = sm.pool_modes(_inputs(_fleet(), (1.0,)), _fleet().pools[0], 0).setting
    impossible = common_pb2.Slo(ttft_s=1e-6, tpot_s=1e-6, attainment_fraction=0.99)
    refused = {sm.DSD: "no DSD", sm.SPEC_DECODE: "no SpecDecode", sm.DPD: "no DPD"}
    mode, evals = sm.choose(setting, 1.0, 160, 140, impossible, 261.0, requests=REQUESTS, current=sm.DSD,
                            unsupported=refused)
    assert mode == sm.STANDALONE and not evals[sm.STANDALONE].feasible
    assert evals[sm.DSD].reason == "not considered: no DSD" and evals[sm.DSD].attainment_fraction == 0.0


async def test_the_plan_in_force_explains_the_mode_left_out(forecaster, optimizer) -> None:
    """Through the service: SetFleet with a vLLM pool, ComputePlan; no interval carries DSD and the plan's
    explanation (what ``plan explain`` prints) says why."""
    fc_channel = grpc.aio.insecure_channel(forecaster.address)
    await ingest_daily(fc_channel, ci_ref("CISO"), 260.0, 20.0)
    await ingest_daily(fc_channel, load_ref("chat"), 1.0, 0.2)
    running = await optimizer(schedule_plans=False)
    stub = optimizer_pb2_grpc.OptimizerServiceStub(grpc.aio.insecure_channel(running.address))
    fleet = _with_engines(_fleet(), VLLM)
    fleet.pools[0].engines[0].hardware = "A100-40GB"
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=fleet))
    plan = (await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2))).plan
    modes = [t.serving_mode for iv in plan.intervals for t in iv.serving_modes]
    assert modes and sm.DSD not in modes
    assert "DSD not considered for pool chat: vLLM has no disaggregated speculative decoding" in plan.explanation


def test_a_pool_without_an_older_gpu_is_told_the_hardware_reason_only() -> None:
    fleet = _with_engines(_fleet(old=False), EMULATOR)
    fleet.pools[0].draft.simulator_model = "llama3.2-1b"
    plan = sm.GreenLlmModes(requests=REQUESTS).solve(_inputs(fleet, (1.0,)))
    assert _modes(plan)[0] in (sm.STANDALONE, sm.SPEC_DECODE)
    text = "\n".join(plan.explanation)
    assert "not considered" not in text and "DSD out (the pool has no older GPU to pair with)" in text
