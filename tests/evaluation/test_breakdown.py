"""The carbon breakdown of an evaluation (idle, prefill, decode, embodied): its parts add up to what the replay
recorded, idle is what the held GPUs draw, and the prefill estimate follows the cache hits."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from greenserve.evaluation import breakdown, grids, run, scenario
from greenserve.simulator.engine_profile import load_profile
from greenserve.simulator.perf_model import PerfModel


@pytest.fixture(scope="module")
def result() -> dict:
    start = int(datetime(2022, 7, 6, tzinfo=UTC).timestamp())
    return run.evaluate({"FR": grids.shipped()["FR"]}, day_start_s=start,
                        strategies=["base_full_cache", "carbon_routing"], scenario=scenario.Scenario(),
                        forecast_model="seasonal_naive", window_s=60.0, hours=2, workers=1, fidelity=False)


def test_components_add_up_to_the_recorded_carbon(result: dict) -> None:
    model = PerfModel(load_profile("llama3-8b@A100-80GB"))
    for strategy in ("base_full_cache", "carbon_routing"):
        c = breakdown.components(result, "FR", strategy)
        assert c["idle_g"] + c["prefill_g"] + c["decode_g"] == pytest.approx(c["operational_g"], rel=1e-9)
        parts = sum(c[k] for k in breakdown.COMPONENTS)
        assert parts == pytest.approx(c["total_g"], rel=1e-9)
        # idle: the 4 GPUs held for the 2 hours at the profile's idle power, whatever the strategy
        assert c["idle_kwh"] == pytest.approx(4 * model.power_w(0.0) * 2 * 3600 / 3.6e6)
        assert c["prefill_g"] > 0 and c["decode_g"] > 0 and c["embodied_compute_g"] > 0
    base, routed = (breakdown.components(result, "FR", s) for s in ("base_full_cache", "carbon_routing"))
    assert routed["idle_g"] == pytest.approx(base["idle_g"])  # routing saves dynamic energy only


def test_prefill_estimate_shrinks_with_cache_hits() -> None:
    model = PerfModel(load_profile("llama3-8b@A100-80GB"))
    cold = breakdown.prefill_dynamic_j(model, 1000, 0.0)
    warm = breakdown.prefill_dynamic_j(model, 1000, 0.6)
    assert 0 < warm < 0.5 * cold
    assert breakdown.prefill_dynamic_j(model, 1000, 1.0) == 0.0


def test_cli_prints_a_table_and_refuses_an_unknown_grid(result: dict, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(result))
    assert breakdown.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "## FR" in out and "| base_full_cache |" in out and "| carbon_routing |" in out
    assert breakdown.main([str(path), "--grids", "XX"]) == 2
    assert "--grids: 'XX'" in capsys.readouterr().err
    assert breakdown.main([str(tmp_path / "missing.json")]) == 2
