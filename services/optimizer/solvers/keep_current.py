"""The "keep the current configuration" solver of a knob, until a solver for it is configured.

* ``cache_targets``: the sizes of the plan in force, else the sizes the pool's LMCache servers hold now (from the
  cache-manager), each clamped to the pool's declared limits (``max_cache_dram_bytes`` / ``max_cache_disk_bytes``
  when set): a limit lowered in the fleet file is enforced by the next plan.
* ``mig_layouts``: per GPU, the layout the operator declared for it in the fleet (its ``instances``, the engines'
  pool being the GPU's pool), else the layout of the plan in force, else the layout the GPU has now.
* ``serving_modes`` and anything else: the plan in force's targets (nothing without a plan).
"""

from __future__ import annotations

from google.protobuf.message import Message

from greenserve.common.mig_geometry import instance_engine_ids
from greenserve.optimizer.planning import KNOB_LABELS, KnobPlan, PlanningInputs, keep_current_messages
from greenserve.v1 import common_pb2


def _clamp(limit: int, value: int) -> int:
    return min(limit, value) if limit > 0 else value


def _cache_targets(inputs: PlanningInputs) -> tuple[list[list[Message]], str]:
    kept = keep_current_messages(inputs, "cache_targets")
    limits = {p.name: (p.max_cache_dram_bytes, p.max_cache_disk_bytes) for p in inputs.fleet.pools}
    out: list[list[Message]] = []
    sources: set[str] = set()
    for hour in kept:
        targets = {t.pool: t for t in hour if t.pool in limits}
        if targets:
            sources.add("plan in force")
        for pool, (dram, disk) in inputs.cache_sizes.items():
            if pool in limits and pool not in targets:
                targets[pool] = common_pb2.CacheTarget(pool=pool, dram_bytes=dram, disk_bytes=disk)
                sources.add("LMCache now")
        clamped = []
        for pool, t in sorted(targets.items()):
            dram_max, disk_max = limits[pool]
            clamped.append(common_pb2.CacheTarget(pool=pool, dram_bytes=_clamp(dram_max, t.dram_bytes),
                                                  disk_bytes=_clamp(disk_max, t.disk_bytes), ttl_s=t.ttl_s))
        out.append(clamped)
    return out, " and ".join(sorted(sources))


def _layout(gpu: common_pb2.Gpu, pool_of: dict[str, str], default_variant: dict[str, str],
            use_gpu_pool: bool, engine_variants: dict[str, str] | None = None,
            engine_on_mig: dict[str, str] | None = None) -> common_pb2.MigLayout:
    engine_variants, engine_on_mig = engine_variants or {}, engine_on_mig or {}
    layout = common_pb2.MigLayout(gpu_uuid=gpu.uuid)
    for inst in sorted(gpu.instances, key=lambda i: i.placement_start):
        # the engine on the instance: as reported (the first), else the one the fleet declares on that MIG device
        reported = instance_engine_ids(inst)
        engine_id = reported[0] if reported else engine_on_mig.get(inst.uuid, "")
        pool = gpu.pool if use_gpu_pool else pool_of.get(engine_id, gpu.pool if engine_id else "")
        # An engine already running keeps its own variant (else the enforcer would replace it).
        variant = engine_variants.get(engine_id, "") or (default_variant.get(pool, "") if pool else "")
        layout.placements.add(profile=inst.profile, start=inst.placement_start, size=inst.placement_size,
                              pool=pool, model_variant=variant)
    return layout


def _mig_layouts(inputs: PlanningInputs) -> tuple[list[list[Message]], str]:
    kept = keep_current_messages(inputs, "mig_layouts")
    declared = {g.uuid: g for g in (inputs.declared.gpus if inputs.declared is not None else ()) if g.instances}
    pool_of = {e.id: p.name for p in inputs.fleet.pools for e in p.engines}
    default_variant = {p.name: p.variants[0].name for p in inputs.fleet.pools if p.variants}
    engine_variants = {e.id: e.model_variant for p in inputs.fleet.pools for e in p.engines if e.model_variant}
    engine_on_mig = {e.mig_uuid: e.id for p in inputs.fleet.pools for e in p.engines if e.mig_uuid}
    out: list[list[Message]] = []
    sources: set[str] = set()
    for hour in kept:
        by_gpu = {layout.gpu_uuid: layout for layout in hour}
        layouts: list[Message] = []
        for gpu in inputs.fleet.gpus:
            if gpu.uuid in declared:  # the operator's layout wins: changing it in the fleet is how one asks
                layouts.append(_layout(declared[gpu.uuid], pool_of, default_variant, use_gpu_pool=True,
                                       engine_variants=engine_variants, engine_on_mig=engine_on_mig))
                sources.add("declared in the fleet")
            elif gpu.uuid in by_gpu:
                layouts.append(by_gpu[gpu.uuid])
                sources.add("plan in force")
            elif gpu.mig_enabled and gpu.reported_by != "operator":
                layouts.append(_layout(gpu, pool_of, default_variant, use_gpu_pool=False,
                                       engine_variants=engine_variants, engine_on_mig=engine_on_mig))
                sources.add("GPU now")
        out.append(layouts)
    return out, " and ".join(sorted(sources))


class KeepCurrent:
    """Keeps the knob's current configuration (see the module docstring)."""

    def __init__(self, knob: str) -> None:
        if knob not in KNOB_LABELS:
            raise ValueError(f"knob: must be one of {sorted(KNOB_LABELS)}, got {knob!r}")
        self.knob = knob
        self.name = f"{KNOB_LABELS[knob].lower()}.keep_current"

    def solve(self, inputs: PlanningInputs) -> KnobPlan:
        if self.knob == "cache_targets":
            messages, source = _cache_targets(inputs)
        elif self.knob == "mig_layouts":
            messages, source = _mig_layouts(inputs)
        else:
            messages, source = keep_current_messages(inputs, self.knob), "plan in force"
        held = len(messages[0]) if messages else 0
        label = KNOB_LABELS[self.knob]
        detail = (f"{label} kept as configured ({held} targets per hour, from {source}); no solver for it yet"
                  if held else f"{label} not planned (no solver configured and nothing in force to keep)")
        return KnobPlan(messages, detail=detail, status="kept")
