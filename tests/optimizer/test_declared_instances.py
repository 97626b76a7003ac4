"""SetFleet checks a declared GPU's MIG instances by a report's rules (ReportGpus): their engine ids are names,
one id each in ``engine_ids``, whatever the GPU's model. Before, a declared fleet's instance engines were not
checked at all: ``"evil id\\n"`` or ``"a,b"`` went into the fleet the plans are computed over."""

from __future__ import annotations

import pytest

from greenserve.common.errors import InvalidArgument
from greenserve.optimizer.fleet import validate_fleet
from greenserve.v1 import common_pb2


def _fleet(*instances: common_pb2.MigInstance, model: int = common_pb2.GPU_MODEL_UNSPECIFIED
           ) -> common_pb2.FleetInventory:
    return common_pb2.FleetInventory(gpus=[common_pb2.Gpu(uuid="GPU-1", model=model, mig_enabled=True,
                                                          instances=list(instances))])


def test_good_declared_instances_pass() -> None:
    validate_fleet(_fleet(common_pb2.MigInstance(uuid="MIG-1", profile="3g.40gb", engine_ids=["e1", "e2"],
                                                 engine_id="e1"),
                          common_pb2.MigInstance(profile="3g.40gb", engine_id="e3")))


@pytest.mark.parametrize(("instance", "field"), [
    (common_pb2.MigInstance(profile="3g.40gb", engine_ids=["evil id\n"]), "fleet.gpus[0].instances[0].engine_ids[0]"),
    (common_pb2.MigInstance(profile="3g.40gb", engine_ids=["a"], engine_id="b"), "fleet.gpus[0].instances[0].engine_id"),
    (common_pb2.MigInstance(profile="3g.40gb", engine_id="a,b c"), "fleet.gpus[0].instances[0].engine_id"),
    (common_pb2.MigInstance(profile="3g.40gb", engine_ids=[f"e{k}" for k in range(9)]),
     "fleet.gpus[0].instances[0].engine_ids"),
    (common_pb2.MigInstance(profile="bad profile"), "fleet.gpus[0].instances[0].profile"),
    (common_pb2.MigInstance(uuid="MIG 1", profile="3g.40gb"), "fleet.gpus[0].instances[0].uuid"),
])
def test_bad_declared_instances_name_the_field(instance: common_pb2.MigInstance, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_fleet(_fleet(instance))
    assert err.value.field == field


def test_too_many_declared_instances() -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_fleet(_fleet(*(common_pb2.MigInstance(profile="1g.10gb") for _ in range(57))))
    assert err.value.field == "fleet.gpus[0].instances"
