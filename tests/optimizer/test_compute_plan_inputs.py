"""ComputePlan's carbon parameters are held to the ranges EstimateCarbon documents: a plan is never computed, stored
and put in force on numbers that make its carbon infinite.

Found by an adversarial audit of ComputePlan (failed before the fix: pue=1e308 gave an ACTIVE plan whose
operational carbon was inf)."""

from __future__ import annotations

import grpc
import pytest
from greenserve.v1 import common_pb2, optimizer_pb2

from tests.optimizer.test_plans import FLEET, _setup

HUGE = [
    (common_pb2.CarbonParams(pue=1e308), "carbon_params.pue"),
    (common_pb2.CarbonParams(ssd_embodied_g_per_tb=1e308), "carbon_params.ssd_embodied_g_per_tb"),
    (common_pb2.CarbonParams(components=[common_pb2.EmbodiedComponent(
        kind=common_pb2.COMPONENT_KIND_GPU, name="A100-80GB", embodied_g=1e308)]), "carbon_params.components[0].embodied_g"),
]


@pytest.mark.parametrize(("params", "field"), HUGE, ids=[f for _, f in HUGE])
async def test_carbon_params_beyond_their_range_are_refused_and_no_plan_is_stored(forecaster, optimizer, params,
                                                                                 field) -> None:
    _, stub, _ = await _setup(forecaster, optimizer, schedule_plans=False)
    await stub.SetFleet(optimizer_pb2.SetFleetRequest(fleet=FLEET))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ComputePlan(optimizer_pb2.ComputePlanRequest(horizon_hours=2, carbon_params=params))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert field in err.value.details()
    assert not (await stub.ListPlans(optimizer_pb2.ListPlansRequest())).plans
