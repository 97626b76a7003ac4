"""EstimateCarbon's documented ranges (issue 21, defect 12: 1e308 kWh x 1e308 g/kWh answered inf).

Each number out of its range is INVALID_ARGUMENT naming the field; at the top of every range at once the
results are finite."""

from __future__ import annotations

import math

import pytest

from greenserve.common.errors import InvalidArgument
from greenserve.optimizer.service import estimate_carbon
from greenserve.v1 import common_pb2 as c
from greenserve.v1 import optimizer_pb2 as o


def _gpu(**kw) -> c.EmbodiedComponent:
    return c.EmbodiedComponent(kind=c.COMPONENT_KIND_GPU, name="X", **{"embodied_g": 1.0, **kw})


@pytest.mark.parametrize("request_,field", [
    (o.EstimateCarbonRequest(energy_kwh=1e308, ci_g_per_kwh=1e308, duration_s=1), "energy_kwh"),
    (o.EstimateCarbonRequest(energy_kwh=1, ci_g_per_kwh=1e5), "ci_g_per_kwh"),
    (o.EstimateCarbonRequest(energy_kwh=1, duration_s=1e308), "duration_s"),
    (o.EstimateCarbonRequest(energy_kwh=1, mean_batch_size=1e300), "mean_batch_size"),
    (o.EstimateCarbonRequest(energy_kwh=1, cache_allocated_bytes=2**64 - 1), "cache_allocated_bytes"),
    (o.EstimateCarbonRequest(carbon_params=c.CarbonParams(pue=1e308)), "carbon_params.pue"),
    (o.EstimateCarbonRequest(carbon_params=c.CarbonParams(ssd_embodied_g_per_tb=1e300)),
     "carbon_params.ssd_embodied_g_per_tb"),
    (o.EstimateCarbonRequest(carbon_params=c.CarbonParams(ssd_lifetime_s=1e-9)), "carbon_params.ssd_lifetime_s"),
    (o.EstimateCarbonRequest(carbon_params=c.CarbonParams(components=[_gpu(embodied_g=1e300)])),
     "carbon_params.components[0].embodied_g"),
    (o.EstimateCarbonRequest(carbon_params=c.CarbonParams(components=[_gpu(lifetime_s=1e-9)])),
     "carbon_params.components[0].lifetime_s"),
    (o.EstimateCarbonRequest(carbon_params=c.CarbonParams(components=[_gpu(count=4_000_000_000)])),
     "carbon_params.components[0].count"),
    (o.EstimateCarbonRequest(energy_kwh=float("nan")), "energy_kwh"),
])
def test_out_of_range_names_the_field(request_, field) -> None:
    with pytest.raises(InvalidArgument) as exc:
        estimate_carbon(request_)
    assert exc.value.field == field


def test_top_of_every_range_is_finite() -> None:
    comps = [c.EmbodiedComponent(kind=c.COMPONENT_KIND_GPU, name=f"G{i}", embodied_g=1e12, lifetime_s=1.0,
                                 count=1_000_000) for i in range(1024)]
    resp = estimate_carbon(o.EstimateCarbonRequest(
        energy_kwh=1e9, ci_g_per_kwh=1e4, duration_s=3.2e9, mean_batch_size=1.0, cache_allocated_bytes=2**60,
        carbon_params=c.CarbonParams(pue=10.0, ssd_embodied_g_per_tb=1e9, ssd_lifetime_s=1.0, components=comps)))
    b = resp.carbon
    for value in (b.operational_g, b.embodied_compute_g, b.embodied_storage_g, b.total_g):
        assert math.isfinite(value) and value > 0


def test_ordinary_request_unchanged() -> None:
    resp = estimate_carbon(o.EstimateCarbonRequest(energy_kwh=2.0, ci_g_per_kwh=400.0, duration_s=3600.0))
    assert resp.carbon.operational_g == pytest.approx(2.0 * 400.0 * resp.carbon_params.pue)
