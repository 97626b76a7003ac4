"""The engines on a MIG instance, as every reader of ``MigInstance`` takes them.

An instance can run several engines (a DPD pair's prefiller and its decoder). ``MigInstance.engine_ids`` lists
them one per entry; ``engine_id`` holds the first for readers that predate ``engine_ids``. A gpu-partitioner
from before ``engine_ids`` sent only ``engine_id``, with all the instance's engines joined by ','. Reading
``engine_id`` as one id made an engine "a,b" that exists nowhere (the optimizer added it to the pool and gave it
routing weight), so readers go through ``instance_engine_ids``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only annotations: the CLI imports this without loading the stubs
    from greenserve.v1 import common_pb2


def instance_engine_ids(instance: common_pb2.MigInstance) -> list[str]:
    """The ids of the engines on ``instance``: ``engine_ids``, or for an old sender (``engine_ids`` empty) its
    ``engine_id`` split at ',' (an engine id never holds one, so a single id comes back as it is)."""
    if instance.engine_ids:
        return list(instance.engine_ids)
    return [engine_id for engine_id in instance.engine_id.split(",") if engine_id]

