"""CLOVER's technique as an evaluation strategy: a scenario pool declares MIG-capable GPUs and its model variants,
the clover-exact solver plans each hour's layouts, the replay runs one engine per MIG instance (its variant on that
slice's profile), a layout change restarts the instances it changes, and each hour records the layout and the
traffic-weighted accuracy loss."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from greenserve.evaluation import day, grids, run, scenario
from greenserve.evaluation.hour import PoolState, restart_changed
from greenserve.optimizer.solvers.mig_variants import MigVariantsSolver

MIG_POOL = """pools:
  - name: chat
    gpus: {model: A100-80GB, count: 2, mig: true}
    variants: [3.1-8b-bf16, 3.1-8b-gptq-w4a16]
    peak_requests_per_s: 6
    slo: {ttft_s: 2.0, tpot_s: 0.1, attainment_fraction: 0.9}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def test_mig_declaration_builds_the_fleet(tmp_path: Path) -> None:
    chosen = scenario.load(_write(tmp_path, MIG_POOL))
    pool = chosen.pools[0]
    assert chosen.has_mig and pool.hardware == "A100-80GB" and pool.engines == 2
    assert [v.name for v in pool.variants] == ["3.1-8b-bf16", "3.1-8b-gptq-w4a16"]  # the catalogue's, best first
    assert pool.variants[1].quality_fraction == pytest.approx(67.57 / 69.32)
    fleet = chosen.fleet("CISO")
    assert [(g.uuid, g.mig_enabled, g.pool) for g in fleet.gpus] == [("GPU-chat-0", True, "chat"),
                                                                     ("GPU-chat-1", True, "chat")]
    assert [e.gpu_uuid for e in fleet.pools[0].engines] == ["GPU-chat-0", "GPU-chat-1"]
    assert not scenario.Scenario().has_mig and len(scenario.Scenario().fleet("CISO").gpus) == 0
    assert "mig_variants" not in day.strategies_for(scenario.Scenario())
    assert "mig_variants" in day.strategies_for(chosen)
    assert any(isinstance(s, MigVariantsSolver) for s in day.solvers_for("joint", mig=True))
    assert not any(isinstance(s, MigVariantsSolver) for s in day.solvers_for("joint"))


@pytest.mark.parametrize(("body", "field"), [
    ("gpus: {model: A100-80GB, count: 2, mig: yes-please}", r"pools\[0\]\.gpus\.mig"),
    ("gpus: {model: L40, count: 2, mig: true}", r"pools\[0\]\.gpus\.model"),
    ("gpus: {model: A100-80GB, count: 0, mig: true}", r"pools\[0\]\.gpus\.count"),
    ("gpus: {model: A100-80GB, count: 2, mig: true}\n    variants: [8b-int2]", r"pools\[0\]\.variants\[0\]"),
    ("gpus: {model: A100-80GB, count: 2, mig: true}\n    variants: [{name: q, simulator_model: llama3-8b, "
     "quality_fraction: 1.5, quality_source: x}]", r"pools\[0\]\.variants\[0\]\.quality_fraction"),
    ("gpus: {model: A100-80GB, count: 2, mig: true}\n    variants: [{name: q, simulator_model: gpt-9, "
     "quality_fraction: 0.9, quality_source: x}]", r"pools\[0\]\.variants\[0\]\.simulator_model"),
    ("hardware: A100-80GB\n    variants: [3.1-8b-bf16]", r"pools\[0\]\.variants"),
    ("gpus: {model: A100-40GB, count: 2, mig: true}\n    variants: [3.1-8b-bf16]", r"pools\[0\]\.gpus\.model"),
])
def test_bad_mig_declaration_is_refused_naming_the_field(tmp_path: Path, body: str, field: str) -> None:
    with pytest.raises(scenario.ScenarioError, match=field):
        scenario.load(_write(tmp_path, f"pools:\n  - name: chat\n    {body}\n"))


def test_a_layout_change_restarts_the_changed_instances_empty() -> None:
    state = PoolState()
    assert restart_changed(state, ["g0/7g.80gb@0/a", "g1/7g.80gb@0/a"]) == 0  # the first hour: nothing to restart
    state.contents = {"g0/7g.80gb@0/a": {"hbm": (1, 2)}, "g1/7g.80gb@0/a": {"hbm": (3,)}}
    assert restart_changed(state, ["g0/7g.80gb@0/a", "g1/3g.40gb@0/b", "g1/3g.40gb@4/b"]) == 2
    assert state.contents == {"g0/7g.80gb@0/a": {"hbm": (1, 2)}}  # the kept instance keeps its cache
    assert restart_changed(state, ["g0/7g.80gb@0/a", "g1/3g.40gb@0/b", "g1/3g.40gb@4/b"]) == 0


def test_mig_variants_beats_base_on_carbon_within_slo_and_accuracy(tmp_path: Path) -> None:
    chosen = scenario.load(_write(tmp_path, MIG_POOL))
    start = int(datetime(2022, 7, 6, tzinfo=UTC).timestamp())
    result = run.evaluate({"CISO": grids.shipped()["CISO"]}, day_start_s=start,
                          strategies=["base_full_cache", "mig_variants"], scenario=chosen,
                          forecast_model="seasonal_naive", window_s=60.0, hours=3, workers=1, fidelity=False)
    base, mig = (result["grids"]["CISO"][s] for s in ("base_full_cache", "mig_variants"))
    assert mig["totals"]["total_g"] < base["totals"]["total_g"]
    assert mig["totals"]["min_attainment_fraction"] >= 0.9
    assert 0 < mig["totals"]["accuracy_loss_fraction"] <= day.MIG_MAX_ACCURACY_LOSS_FRACTION
    assert base["totals"]["accuracy_loss_fraction"] == 0.0
    assert result["summary"]["CISO"]["mig_variants"]["accuracy_loss_fraction"] == mig["totals"]["accuracy_loss_fraction"]
    for h in mig["hours"]:
        layout = h["mig_layout"]["chat"]
        assert layout and all(key.split(" ")[1] in ("3.1-8b-bf16", "3.1-8b-gptq-w4a16") for key in layout)
        assert 0 <= h["accuracy_loss_fraction"] <= day.MIG_MAX_ACCURACY_LOSS_FRACTION
        assert h["requests_measured"] > 0 and h["engines_weighted"]["chat"] == sum(layout.values())
    assert all(h["mig_layout"] == {"chat": {"whole 3.1-8b-bf16": 2}} for h in base["hours"])


def test_report_plots_the_mig_layout_and_accuracy_loss_from_the_json(tmp_path: Path) -> None:
    from greenserve.evaluation import report

    hours = [{"ci_actual_g_per_kwh": 1.0, "ci_forecast_g_per_kwh": 1.0, "load_actual_requests_per_s": 1.0,
              "load_forecast_requests_per_s": 1.0, "total_g": 1.0, "attainment_fraction": 1.0, "cache_bytes": {},
              "mig_layout": {"chat": layout}, "accuracy_loss_fraction": loss}
             for layout, loss in (({"7g.80gb 8b-fp8": 2}, 0.007), ({"3g.40gb 8b-fp8": 4}, 0.007))]
    plots = report.plots_for("CISO", {"mig_variants": {"hours": hours}}, 0.9)
    assert plots["CISO_mig"][2] == {"mig_variants": [2.0, 4.0]}
    assert plots["CISO_accuracy"][2] == {"mig_variants": [0.007, 0.007]}
    plain = [{**h, "mig_layout": {}} for h in hours]
    assert "CISO_mig" not in report.plots_for("CISO", {"base_full_cache": {"hours": plain}}, 0.9)


def test_cli_refuses_mig_variants_without_a_mig_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    from greenserve_client.commands import evaluate

    with pytest.raises(SystemExit) as exc:
        evaluate.main(["--grids", "CISO", "--strategies", "base_full_cache,mig_variants", "--headlines", "none"])
    assert exc.value.code == 2
    assert "--strategies: mig_variants needs a scenario" in capsys.readouterr().err


def test_shipped_mig_scenario_loads() -> None:
    shipped = Path(scenario.__file__).parent / "data" / "scenario_mig.yaml"
    chosen = scenario.load(shipped)
    assert chosen.has_mig and chosen.pools[0].engines == 4 and chosen.pools[0].profile == "llama3-8b@A100-80GB"
    assert [v.name for v in chosen.pools[0].variants][0] == "8b-bf16"


def test_the_replay_weights_mig_instances_as_the_plan_weights_their_placements(tmp_path: Path) -> None:
    from greenserve.optimizer.solvers.routing_weights import placement_engine_id
    from greenserve.v1 import common_pb2

    pool = scenario.load(_write(tmp_path, MIG_POOL)).pools[0]
    bf16, w4 = (v.name for v in pool.variants)
    interval = common_pb2.PlanInterval(mig_layouts=[
        common_pb2.MigLayout(gpu_uuid="GPU-chat-0", placements=[
            common_pb2.MigPlacement(profile="7g.80gb", start=0, size=8, pool="chat", model_variant=w4)]),
        common_pb2.MigLayout(gpu_uuid="GPU-chat-1", placements=[
            common_pb2.MigPlacement(profile="7g.80gb", start=0, size=8, pool="chat", model_variant=bf16)])])
    planned = {placement_engine_id("GPU-chat-0", "7g.80gb", 0): 0.8, placement_engine_id("GPU-chat-1", "7g.80gb", 0): 0.2,
               "chat-0": 0.0, "chat-1": 0.0}
    engines = day.pool_engines(pool, interval, planned, 1 << 30)
    assert engines.weights == {f"GPU-chat-0/7g.80gb@0/{w4}": 0.8, f"GPU-chat-1/7g.80gb@0/{bf16}": 0.2}
    # a plan that names no placement (a routing answer kept from before the layout): weighted by capacity
    fallback = day.pool_engines(pool, interval, {"chat-0": 1.0, "chat-1": 1.0}, 1 << 30)
    assert all(w > 1.0 for w in fallback.weights.values())  # requests/s at the SLO, not the plan's shares
