"""GreenLLM's serving modes as an evaluation strategy: a scenario pool may declare a draft model, the
`serving_modes` solver picks Standalone or SpecDecode per hour, and the replay runs the mode the plan gives (a mode
change restarts the engines: their caches come back empty)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from greenserve.evaluation import day, grids, run, scenario
from greenserve.evaluation.hour import PoolState, replay_hour
from greenserve.optimizer.solvers.serving_modes import DPD, SPEC_DECODE, STANDALONE

DRAFTED = scenario.PoolScenario("chat", draft_model="llama3.2-1b", draft_acceptance_fraction=0.457)


def test_scenario_draft_is_checked_naming_the_key(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("pools:\n  - name: chat\n    draft_model: llama3.2-1b\n    draft_acceptance_fraction: 0.5\n")
    fleet = scenario.load(good).fleet("ES")
    assert fleet.pools[0].draft.simulator_model == "llama3.2-1b" and len(fleet.gpus) == 4
    assert len(scenario.Scenario().fleet("ES").gpus) == 0  # no draft: the default fleet is unchanged
    for body, key in (("draft_model: gpt-9\n    draft_acceptance_fraction: 0.5", "draft_model"),
                      ("draft_model: llama3.2-1b", "draft_acceptance_fraction")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(f"pools:\n  - name: chat\n    {body}\n")
        with pytest.raises(scenario.ScenarioError, match=rf"pools\[0\]\.{key}"):
            scenario.load(bad)


def test_replay_runs_the_plans_mode_and_a_change_restarts_the_engines() -> None:
    spec = day._spec_for(DRAFTED, SPEC_DECODE)
    assert spec is not None and day._spec_for(DRAFTED, STANDALONE) is None
    with pytest.raises(ValueError, match="DPD/DSD need older GPUs"):
        day._spec_for(DRAFTED, DPD)
    args = (DRAFTED.profile, ["chat-0", "chat-1"], 2.0, {}, 0, 2.0, 0.15, 5)
    standalone, spec_state = PoolState(), PoolState()
    plain = replay_hour(*args, 0, 90.0, standalone)
    drafted = replay_hour(*args, 0, 90.0, spec_state, spec=spec)
    assert drafted.dynamic_energy_per_request_j != pytest.approx(plain.dynamic_energy_per_request_j, rel=1e-3)
    assert replay_hour(*args, 1, 90.0, spec_state, spec=spec).engine_restarts == 0
    switched = replay_hour(*args, 2, 90.0, spec_state)  # back to Standalone: both engines restart
    assert switched.engine_restarts == 2


def test_serving_modes_strategy_end_to_end() -> None:
    start = int(datetime(2022, 7, 6, tzinfo=UTC).timestamp())
    result = run.evaluate({"ES": grids.shipped()["ES"]}, day_start_s=start, strategies=["serving_modes"],
                          scenario=scenario.Scenario((DRAFTED,)), forecast_model="seasonal_naive", window_s=60.0,
                          hours=2, workers=1, fidelity=False)
    hours = result["grids"]["ES"]["serving_modes"]["hours"]
    assert [set(h["serving_modes"]) for h in hours] == [{"chat"}, {"chat"}]
    assert all(h["serving_modes"]["chat"] in ("Standalone", "SpecDecode") for h in hours)
    assert all(0 <= h["attainment_fraction"] <= 1 and h["requests_measured"] > 0 for h in hours)
