"""compute_receipt against the shared carbon model it takes its formulas from."""

from __future__ import annotations

import math
import random

import pytest
from greenserve.common import carbon
from greenserve.common.carbon_params import load_default_params
from greenserve.router.accounting.receipt import CarbonSettings, Measurement, compute_receipt, load_router_defaults


def _settings(pue: float = 1.0) -> CarbonSettings:
    params = load_default_params({"pue": pue} if pue != 1.0 else None)
    platform = params.platform(dict(load_router_defaults()["carbon"]["platform"]))
    return CarbonSettings(params=params, platform=platform, saturation_requests=256, slo_ttft_s=1.0, slo_tpot_s=0.1)


def _measurement(**changes: float) -> Measurement:
    values = dict(engine_id="e", pool="p", ttft_s=0.2, e2e_s=3.0, prompt_tokens=100, cached_prompt_tokens=0,
                  completion_tokens=30, energy_j=500.0, busy_slot_s=12.0, ci_g_per_kwh=250.0, plan_version=1)
    return Measurement(**(values | changes))  # type: ignore[arg-type]


@pytest.mark.parametrize("pue", [1.0, 1.35])
def test_receipt_matches_the_shared_carbon_model(pue: float) -> None:
    """Operational and embodied grams equal carbon.request_carbon's for the same request (to rounding), over
    random measurements including zero and negative readings the receipt clamps."""
    settings = _settings(pue)
    assert settings.pue == pue
    rnd = random.Random(7)
    for _ in range(500):
        m = _measurement(e2e_s=rnd.choice([0.0, rnd.uniform(0.001, 120.0)]), energy_j=rnd.uniform(-5.0, 5e4),
                         busy_slot_s=rnd.uniform(0.0, 2000.0), ci_g_per_kwh=rnd.choice([-1.0, rnd.uniform(0, 900)]))
        r = compute_receipt(m, settings)
        mean_batch = max(1.0, m.busy_slot_s / m.e2e_s) if m.e2e_s > 0 else 1.0
        expected = carbon.request_carbon(duration_s=max(0.0, m.e2e_s), energy_kwh=max(0.0, m.energy_j) / 3.6e6,
                                         ci_g_per_kwh=max(0.0, m.ci_g_per_kwh), mean_batch_size=mean_batch,
                                         platform=settings.platform, pue=pue)
        assert r.operational_g == pytest.approx(expected.operational_g, rel=1e-12, abs=0.0)
        assert r.embodied_g == pytest.approx(expected.embodied_g, rel=1e-12, abs=0.0)
        assert r.total_g == pytest.approx(expected.total_g, rel=1e-12, abs=0.0)
    assert compute_receipt(_measurement(e2e_s=10.0), settings).embodied_g > 0  # the platform has embodied carbon


def test_receipt_refuses_non_finite_readings_as_the_shared_model_does() -> None:
    settings = _settings()
    with pytest.raises(ValueError, match="finite"):
        compute_receipt(_measurement(e2e_s=math.inf), settings)
    with pytest.raises(ValueError, match="finite"):
        compute_receipt(_measurement(ci_g_per_kwh=math.inf), settings)


def test_receipt_slo_verdict_uses_tpot_over_the_tokens_after_the_first() -> None:
    settings = _settings()
    r = compute_receipt(_measurement(ttft_s=0.5, e2e_s=3.4, completion_tokens=30), settings)
    assert r.tpot_s == pytest.approx(0.1) and r.slo_met
    assert not compute_receipt(_measurement(ttft_s=1.5, e2e_s=3.0), settings).slo_met
