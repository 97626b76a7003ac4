"""The variants-on-MIG planner keeps a GPU's layout from one plan to the next when nothing asks for a change.

The demo's GPU (an A100-40GB declared as two 3g.20gb instances of BF16 Llama-3-8B, which the planner's memory check
says do not fit at the pool's request shape; the load carried by engines elsewhere) flipped on every hourly plan:
the plan made while the instances ran destroyed them, the next one (nothing running) created them again, each flip
draining and restarting both engines. The running engines' capability was the optimizer's whole-GPU fallback for a
slice it cannot predict (another GPU's idle power, 70 W per engine), so keeping them looked worse than a GPU
without engines, while the same layout not running (no option for that slice) cost the GPU's idle power alone.
"""

from __future__ import annotations

from greenserve.common.carbon_params import load_default_params
from greenserve.optimizer import inputs as inputs_module
from greenserve.optimizer.fleet import merge_fleet, validate_fleet
from greenserve.optimizer.planning import PlanningInputs, SeriesForecast
from greenserve.optimizer.solvers import mig_variants as mv
from greenserve.v1 import common_pb2, optimizer_pb2

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"
HALVES = (("MIG-a", 0, "n0-a"), ("MIG-b", 4, "n0-b"))


def _declared() -> common_pb2.FleetInventory:
    """The demo's fleet: pool chat (BF16 8B; its load carried by an A100-80GB engine elsewhere) and GPU-0, an
    A100-40GB declared as two 3g.20gb halves."""
    fleet = common_pb2.FleetInventory()
    pool = fleet.pools.add(name="chat", model=MODEL, region="R",
                           slo=common_pb2.Slo(ttft_s=2.0, tpot_s=0.2, attainment_fraction=0.9),
                           mean_prompt_tokens=1024, mean_output_tokens=128)
    pool.variants.add(name="8b-bf16", model=MODEL, quality_fraction=1.0, simulator_model="llama3-8b")
    pool.engines.add(id="elsewhere", pool="chat", hardware="A100-80GB", model_variant="8b-bf16")
    gpu = fleet.gpus.add(uuid="GPU-0", node="n0", pool="chat", model=common_pb2.GPU_MODEL_A100_40GB)
    for _, start, _ in HALVES:
        gpu.instances.add(profile="3g.20gb", placement_start=start, placement_size=4)
    validate_fleet(fleet)
    return fleet


def _reported(declared: common_pb2.FleetInventory, running: bool) -> common_pb2.FleetInventory:
    """The fleet as the optimizer merges it with the gpu-partitioner's report of GPU-0: MIG on, and either both
    halves running an engine each (``running``) or no instance."""
    gpu = common_pb2.Gpu(uuid="GPU-0", model=common_pb2.GPU_MODEL_A100_40GB, mig_enabled=True)
    if running:
        for uuid, start, engine_id in HALVES:
            gpu.instances.add(uuid=uuid, profile="3g.20gb", placement_start=start, placement_size=4,
                              engine_id=engine_id, engine_ids=[engine_id])
    return merge_fleet(declared, {"n0": optimizer_pb2.ReportGpusRequest(node="n0", gpus=[gpu])})


def _inputs(declared: common_pb2.FleetInventory, fleet: common_pb2.FleetInventory,
            current: common_pb2.Plan | None) -> PlanningInputs:
    """Two hours of near-identical CI and load (1 % apart), the engines' capabilities as the optimizer gathers
    them (no stored profile: predicted)."""
    notes: list[str] = []
    ci = SeriesForecast((220.0, 222.0), (220.0, 222.0), (220.0, 222.0))
    load = SeriesForecast((1.0, 1.01), (0.9, 0.91), (1.0, 1.01))
    return PlanningInputs(start_s=0.0, horizon_hours=2, fleet=fleet, ci={"R": ci}, load={"chat": load},
                          capabilities=inputs_module.capabilities(fleet, [], notes), params=load_default_params(),
                          gpu_platform={}, current=current, declared=declared, notes=notes)


def _halves(layouts: list[common_pb2.MigLayout]) -> list[tuple[str, int, str, str]]:
    (layout,) = layouts
    assert layout.gpu_uuid == "GPU-0"
    return [(p.profile, p.start, p.pool, p.model_variant) for p in layout.placements]


KEPT = [("3g.20gb", 0, "chat", "8b-bf16"), ("3g.20gb", 4, "chat", "8b-bf16")]


def test_the_layout_running_is_kept_over_two_near_identical_hours() -> None:
    declared = _declared()
    fleet = _reported(declared, running=True)
    inputs = _inputs(declared, fleet, None)
    # the running engines' capability is the whole-GPU fallback (the slice prediction finds no room for them)
    assert {"n0-a", "n0-b"} <= set(inputs.capabilities)
    plan = mv.MigVariantsSolver().solve(inputs)
    assert plan.status == "ok"
    for hour in plan.per_interval:
        assert _halves(hour) == KEPT
    assert "no engine restarted" in " ".join(plan.explanation)


def test_consecutive_plans_keep_the_layout_across_the_partitioners_report() -> None:
    """The demo's loop: the first plan, made before the partitioner ran anything, lays the GPU out; the plan made
    after the partitioner applied it and reported its engines keeps that layout (it destroyed it before)."""
    declared = _declared()
    first = mv.MigVariantsSolver().solve(_inputs(declared, _reported(declared, running=False), None))
    plan = common_pb2.Plan(version=1)
    for h, layouts in enumerate(first.per_interval):
        interval = plan.intervals.add()
        interval.start.FromSeconds(3600 * h)
        interval.end.FromSeconds(3600 * (h + 1))
        interval.mig_layouts.extend(layouts)
    second = mv.MigVariantsSolver().solve(_inputs(declared, _reported(declared, running=True), plan))
    assert [_halves(h) for h in second.per_interval] == [_halves(h) for h in first.per_interval] == [KEPT, KEPT]
    assert "no engine restarted" in " ".join(second.explanation)
