"""Which pools' LMCache tier works, by the profiler's measurements, and a cache answer without the ones that do not.

The profiler says, per measured point, what the engine's KV connector did over the window
(``ProfilePoint.kv_connector_state``, from vLLM's external-prefix counters: ``profiler/engine_metrics.py``).
LMCache's in-process vLLM connector (LMCacheConnectorV1) on a CPU build runs in a degraded mode that stores nothing:
asked for thousands of prefix tokens, it serves none (DEGRADED). A pool whose latest verdict is DEGRADED gets no
cache target: a DRAM or disk size for a tier that serves nothing would count prefix hits that never come (capacity,
energy) and pay its embodied carbon for nothing. A later profile in which the connector served tokens (WORKING)
takes the fault back.

A profile belongs to a pool when its model (or variant) is one the pool serves and its hardware is one of the pool's
engines' (or it names none).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from greenserve.v1 import common_pb2

if TYPE_CHECKING:
    from greenserve.optimizer.planning import KnobPlan, PlanningInputs

DEGRADED = common_pb2.KV_CONNECTOR_STATE_DEGRADED
WORKING = common_pb2.KV_CONNECTOR_STATE_WORKING


def _pool_names(pool: common_pb2.Pool) -> set[str]:
    names = {pool.model}
    for variant in pool.variants:
        names.update((variant.name, variant.model))
    return {n for n in names if n}


def _verdict(profile: common_pb2.Profile) -> tuple[int, int, int]:
    """(state, windows degraded, windows measured with a verdict): WORKING when any window served prefix tokens,
    else DEGRADED when any window was degraded, else UNSPECIFIED."""
    states = [p.kv_connector_state for p in profile.points]
    degraded = sum(1 for s in states if s == DEGRADED)
    judged = sum(1 for s in states if s in (DEGRADED, WORKING))
    if any(s == WORKING for s in states):
        return WORKING, degraded, judged
    return (DEGRADED if degraded else common_pb2.KV_CONNECTOR_STATE_UNSPECIFIED), degraded, judged


def faults(fleet: common_pb2.FleetInventory, profiles: Iterable[common_pb2.Profile],
           hardware_of: dict[str, str]) -> dict[str, common_pb2.CacheTierFault]:
    """Pool -> its fault, for the pools whose most recent profile with a verdict says DEGRADED. ``hardware_of``:
    engine id -> hardware name (``inputs.engine_hardware``)."""
    judged = [(p, *_verdict(p)) for p in profiles]
    judged = [j for j in judged if j[1] != common_pb2.KV_CONNECTOR_STATE_UNSPECIFIED]
    out: dict[str, common_pb2.CacheTierFault] = {}
    for pool in fleet.pools:
        names = _pool_names(pool)
        hardware = {hardware_of.get(e.id, "") for e in pool.engines} - {""}
        mine = [j for j in judged if names & {j[0].config.model, j[0].config.model_variant}
                and (not j[0].config.hardware or not hardware or j[0].config.hardware in hardware)]
        if not mine:
            continue
        profile, state, degraded, windows = max(mine, key=lambda j: j[0].created_at.ToNanoseconds())
        if state != DEGRADED:
            continue
        measured = profile.created_at.ToDatetime().strftime("%Y-%m-%d %H:%M UTC") if profile.HasField(
            "created_at") else "at an unknown time"
        out[pool.name] = common_pb2.CacheTierFault(
            pool=pool.name, profile_config_key=profile.config_key,
            reason=(f"the KV connector of {profile.config.model} on {profile.config.hardware or 'its hardware'} "
                    f"served no prefix tokens in {degraded} of {windows} measured windows although vLLM asked it "
                    f"for thousands (degraded mode; profile {profile.config_key} v{profile.version}, "
                    f"measured {measured})"))
    return out


def without_faulty_tiers(inputs: PlanningInputs, result: KnobPlan) -> KnobPlan:
    """A cache answer with no target for the pools of ``inputs.cache_tier_faults``, and those pools' engines
    planned on their capabilities without the tier (``inputs.capabilities``), with one explanation line per pool."""
    bad = inputs.cache_tier_faults
    if not bad:
        return result
    per_interval = [[m for m in messages if getattr(m, "pool", "") not in bad] for messages in result.per_interval]
    capabilities = result.capabilities
    if capabilities is not None:
        engines = {e.id for pool in inputs.fleet.pools if pool.name in bad for e in pool.engines}
        capabilities = [{k: (inputs.capabilities.get(k, v) if k in engines else v) for k, v in caps.items()}
                        for caps in capabilities]
    lines = [f"pool {name}: LMCache tier NOT WORKING, planned without it (no cache target, no prefix hits from it): "
             f"{fault.reason}" for name, fault in sorted(bad.items())]
    return dataclasses.replace(result, per_interval=per_interval, capabilities=capabilities,
                               explanation=[*result.explanation, *lines])
