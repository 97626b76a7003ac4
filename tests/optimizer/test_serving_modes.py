"""GreenLLM's serving modes (issue 19 item 5): the mode with the lowest carbon per token among those meeting the SLO
and the link, per pool and hour; the fleet's draft and link checked; the solver wired in the planner."""

from __future__ import annotations

import pytest
from greenserve.common.carbon_params import load_default_params
from greenserve.common.errors import InvalidArgument
from greenserve.optimizer.fleet import validate_fleet
from greenserve.optimizer.inputs import gpu_platforms
from greenserve.optimizer.planning import PlanningInputs, SeriesForecast
from greenserve.optimizer.solvers import default_solvers, modes_solver
from greenserve.optimizer.solvers import serving_modes as sm
from greenserve.v1 import common_pb2

REQUESTS = 300  # fewer simulated requests than the service's 600: the tests stay fast


def _fleet(link: float = 2e9, draft: bool = True, old: bool = True) -> common_pb2.FleetInventory:
    """GreenLLM's setting: Llama 7B on an A100 with a T4 beside it, a 1B draft, ShareGPT's median request."""
    fleet = common_pb2.FleetInventory(link_bandwidth_bytes_per_s=link)
    pool = fleet.pools.add(name="chat", model="meta-llama/Llama-2-7b-chat-hf", region="CISO",
                           mean_prompt_tokens=160, mean_output_tokens=140,
                           slo=common_pb2.Slo(ttft_s=0.2, tpot_s=0.08, attainment_fraction=0.9))
    if draft:
        pool.draft.CopyFrom(common_pb2.SpeculativeDraft(model="meta-llama/Llama-3.2-1B-Instruct",
                                                        acceptance_fraction=0.457))
    fleet.gpus.add(uuid="GPU-a100", model=common_pb2.GPU_MODEL_A100_40GB, pool="chat")
    if old:
        fleet.gpus.add(uuid="GPU-t4", hardware="T4", name="Tesla T4", pool="chat")
    return fleet


def _inputs(fleet: common_pb2.FleetInventory, loads: tuple[float, ...]) -> PlanningInputs:
    params = load_default_params()
    ci = (261.0,) * len(loads)
    return PlanningInputs(start_s=0.0, horizon_hours=len(loads), fleet=fleet,
                          ci={"CISO": SeriesForecast(ci, ci, ci)}, load={"chat": SeriesForecast(loads, loads, loads)},
                          capabilities={}, params=params, gpu_platform=gpu_platforms(fleet, params, []))


def _modes(plan) -> list[int]:
    return [hour[0].serving_mode for hour in plan.per_interval]


def test_low_load_disaggregates_the_draft_high_load_speculates_on_the_a100() -> None:
    fleet = _fleet()
    validate_fleet(fleet)
    plan = sm.GreenLlmModes(requests=REQUESTS).solve(_inputs(fleet, (1.0, 21.0)))
    assert plan.status == "ok"
    assert _modes(plan) == [sm.DSD, sm.SPEC_DECODE]
    dsd = plan.per_interval[0][0]
    assert (dsd.old_hardware, dsd.link_bandwidth_bytes_per_s) == ("T4", 2e9)  # what the engine launch pairs with
    assert plan.per_interval[1][0].old_hardware == ""
    text = "\n".join(plan.explanation)
    assert "hour 0: DSD on A100-40GB target + T4 draft" in text and "below Standalone" in text
    assert "hour 1: SpecDecode (was DSD)" in text and "DPD out (SLO attainment" in text


def test_each_gpu_charged_its_own_embodied_carbon() -> None:
    setting = sm.pool_modes(_inputs(_fleet(), (1.0,)), _fleet().pools[0], 0).setting
    assert (setting.new_hardware, setting.old_hardware) == ("A100-40GB", "T4")
    assert (setting.new_embodied_g, setting.old_embodied_g) == (26340.0, 10300.0)  # GreenLLM Table I
    args = (2.0, 160, 140, 0.2, 0.08, 0.9, REQUESTS)
    alone = sm.evaluate(sm.SPEC_DECODE, setting, *args)
    pair = sm.evaluate(sm.DSD, setting, *args)
    no_old = sm.evaluate(sm.DSD, sm.ModeSetting(**{**setting.__dict__, "old_embodied_g": 0.0}), *args)
    assert pair.embodied_g_per_token > no_old.embodied_g_per_token > 0  # the T4's 10.3 kg is charged
    assert pair.embodied_g_per_token / no_old.embodied_g_per_token == pytest.approx(36640 / 26340, rel=1e-9)
    assert alone.embodied_g_per_token > 0


def test_disaggregation_needs_a_declared_link_that_carries_its_traffic() -> None:
    none = sm.GreenLlmModes(requests=REQUESTS).solve(_inputs(_fleet(link=0.0), (1.0,)))
    assert _modes(none) in ([sm.SPEC_DECODE], [sm.STANDALONE])
    assert "DSD out (the fleet declares no link bandwidth)" in none.explanation[0]
    # DSD ships the draft's probabilities (32,000 x 4 bytes per proposed token, ~0.02 GB/s at 1 req/s): a 80 Mb/s
    # link cannot carry them
    thin = sm.GreenLlmModes(requests=REQUESTS).solve(_inputs(_fleet(link=1e7), (1.0,)))
    assert _modes(thin)[0] != sm.DSD
    assert "link traffic 0.02 GB/s > 0.01 GB/s" in thin.explanation[0].split("DSD out (")[1]


def test_pools_without_an_alternative_are_left_alone() -> None:
    plan = sm.GreenLlmModes(requests=REQUESTS).solve(_inputs(_fleet(draft=False, old=False), (1.0, 2.0)))
    assert plan.per_interval == [[], []] and "every pool Standalone" in plan.detail
    only_old = sm.GreenLlmModes(requests=REQUESTS).solve(_inputs(_fleet(draft=False), (1.0,)))
    assert _modes(only_old)[0] in (sm.STANDALONE, sm.DPD)
    assert "the pool declares no draft model" in only_old.explanation[0]


@pytest.mark.parametrize(("change", "field"), [
    (lambda f: setattr(f, "link_bandwidth_bytes_per_s", -1.0), "fleet.link_bandwidth_bytes_per_s"),
    (lambda f: setattr(f, "link_bandwidth_bytes_per_s", float("nan")), "fleet.link_bandwidth_bytes_per_s"),
    (lambda f: setattr(f.pools[0].draft, "acceptance_fraction", 1.5), "fleet.pools[0].draft.acceptance_fraction"),
    (lambda f: setattr(f.pools[0].draft, "acceptance_fraction", 0.0), "fleet.pools[0].draft.acceptance_fraction"),
    (lambda f: setattr(f.pools[0].draft, "model", ""), "fleet.pools[0].draft.model"),
    (lambda f: setattr(f.pools[0].draft, "num_speculative_tokens", 99), "fleet.pools[0].draft.num_speculative_tokens"),
    (lambda f: setattr(f.pools[0].draft, "simulator_model", "gpt-9"), "fleet.pools[0].draft.simulator_model"),
])
def test_bad_modes_input_is_refused_naming_the_field(change, field) -> None:
    fleet = _fleet()
    change(fleet)
    with pytest.raises(InvalidArgument) as err:
        validate_fleet(fleet)
    assert err.value.field == field


def test_a_draft_the_simulator_cannot_model_fails_the_solver_naming_the_field() -> None:
    fleet = _fleet()
    fleet.pools[0].draft.model = "acme/secret-draft"
    validate_fleet(fleet)  # a valid fleet: the draft is served by vLLM whatever the simulator knows
    with pytest.raises(InvalidArgument) as err:
        sm.GreenLlmModes(requests=REQUESTS).solve(_inputs(fleet, (1.0,)))
    assert err.value.field == "fleet.pools[0].draft.simulator_model"


def test_wired_in_the_planner_with_keep() -> None:
    assert next(s for s in default_solvers() if s.knob == "serving_modes").name == "serving_modes.greenllm"
    assert next(s for s in default_solvers(modes="keep") if s.knob == "serving_modes").name != "serving_modes.greenllm"
    with pytest.raises(ValueError, match="modes solver"):
        modes_solver("fastest")


def test_greenllm_headline_quick_follows_the_convention_and_the_paper() -> None:
    from greenserve.evaluation.headlines import check, greenllm

    row = check("greenllm", greenllm.run(quick=True))
    ours = row["ours"]
    saving = ours["largest carbon saving vs Standalone (%)"]
    assert 31.3 * 0.8 <= saving["value"] <= 40.6 * 1.2 and saving["mode"].startswith("DSD")
    assert ours["mode at high load"]["value"] == "SpecDecode"
    assert row["within_tolerance"] is True


async def test_set_fleet_refuses_a_bad_draft_with_invalid_argument_and_stores_nothing(optimizer) -> None:
    import grpc
    from greenserve.v1 import optimizer_pb2, optimizer_pb2_grpc

    running = await optimizer(schedule_plans=False)
    async with grpc.aio.insecure_channel(running.address) as channel:
        stub = optimizer_pb2_grpc.OptimizerServiceStub(channel)
        fleet = _fleet()
        fleet.pools[0].draft.acceptance_fraction = 1.5
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=fleet))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "fleet.pools[0].draft.acceptance_fraction" in err.value.details()
        assert not (await stub.GetFleet(optimizer_pb2.GetFleetRequest())).fleet.pools
        await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=_fleet()))  # the good one is stored whole
        stored = (await stub.GetFleet(optimizer_pb2.GetFleetRequest())).fleet
        assert stored.link_bandwidth_bytes_per_s == 2e9 and stored.pools[0].draft.acceptance_fraction == 0.457
