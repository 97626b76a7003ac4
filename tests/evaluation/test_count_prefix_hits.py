"""A scenario pool's ``count_prefix_hits``: on by default (the planner's capacity counts prefix reuse, replayed as
each conversation's own prefix on the engine's memory); each hour's plan then counts the prefix-hit fraction measured
in the window replayed before it (none before the first); off, no reuse is assumed."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from greenserve.evaluation import grids, run, scenario
from greenserve.optimizer import capacity


def _load(tmp_path: Path, extra: str) -> scenario.Scenario:
    path = tmp_path / "scenario.yaml"
    path.write_text(f"pools:\n  - name: chat\n    peak_requests_per_s: 4\n{extra}")
    return scenario.load(path)


def test_the_key_is_on_by_default_and_must_be_a_boolean(tmp_path: Path) -> None:
    assert scenario.Scenario().pools[0].count_prefix_hits
    assert _load(tmp_path, "").pools[0].count_prefix_hits  # a pool that does not say
    shipped_mig = Path(scenario.__file__).parent / "data" / "scenario_mig.yaml"
    assert scenario.load(shipped_mig).pools[0].count_prefix_hits
    assert not _load(tmp_path, "    count_prefix_hits: false\n").pools[0].count_prefix_hits
    with pytest.raises(scenario.ScenarioError, match=r"pools\[0\]\.count_prefix_hits: must be true or false"):
        _load(tmp_path, "    count_prefix_hits: 0.6\n")


@pytest.mark.parametrize("counted", [False, True])
def test_the_plans_count_the_hit_fraction_measured_the_hour_before(tmp_path: Path, counted: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[float] = []
    real = capacity.predict

    def recording(*args, **kwargs):  # records what day.py asks for
        asked.append(args[6] if len(args) > 6 else kwargs.get("prefix_hit_fraction", 0.0))
        return real(*args, **kwargs)

    monkeypatch.setattr(capacity, "predict", recording)
    chosen = _load(tmp_path, f"    count_prefix_hits: {'true' if counted else 'false'}\n")
    start = int(datetime(2022, 7, 6, tzinfo=UTC).timestamp())
    result = run.evaluate({"FR": grids.shipped()["FR"]}, day_start_s=start, strategies=["carbon_routing"],
                          scenario=chosen, forecast_model="seasonal_naive", window_s=60.0, hours=2, workers=1,
                          fidelity=False)
    hours = result["grids"]["FR"]["carbon_routing"]["hours"]
    assert len(asked) == 2  # one prediction per hour's plan
    if counted:  # the first plan counts the hit rate measured in the hour before the day (the static fleet's)
        assert asked[0] > 0
        assert hours[0]["prefix_hit_fraction"] > capacity.HIT_FRACTION_STEP  # something to count
        assert asked[1] == capacity.hit_fraction_step(hours[0]["prefix_hit_fraction"]) > 0
    else:
        assert asked[0] == 0.0
        assert asked[1] == 0.0
