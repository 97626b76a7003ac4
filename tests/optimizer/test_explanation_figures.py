"""Issue 35: an explanation states the figures that decided, as the plan's other figures give them.

* The MIG line gave "load 0.00 req/s" while the pool's load was 0.71 req/s (the MIG GPUs' share, the pool's other
  engines carrying it all) and "+27.2 % vs BASE" with no figure behind it.
"""

from __future__ import annotations

import re

from greenserve.common.carbon_params import load_default_params
from greenserve.optimizer.capacity import Capability
from greenserve.optimizer.fleet import validate_fleet
from greenserve.optimizer.planning import PlanningInputs, SeriesForecast
from greenserve.optimizer.solvers import mig_patterns as mp
from greenserve.optimizer.solvers.mig_variants import MigVariantsSolver
from greenserve.v1 import common_pb2


def _mig_fleet() -> common_pb2.FleetInventory:
    """`greenserve up`'s pool: two engines on whole GPUs and a simulated A100-40GB in two 3g.20gb halves."""
    fleet = common_pb2.FleetInventory()
    pool = fleet.pools.add(name="default", model="meta-llama/Meta-Llama-3-8B-Instruct", region="ES",
                           slo=common_pb2.Slo(ttft_s=2.0, tpot_s=0.2, attainment_fraction=0.9))
    pool.variants.extend(v.to_proto() for v in mp.family("llama3-8b-instruct")[:1])
    for i in range(2):
        pool.engines.add(id=f"whole-{i}", hardware="A100-80GB", url=f"http://127.0.0.1:{8000 + i}")
    gpu = fleet.gpus.add(uuid="GPU-0", model=common_pb2.GPU_MODEL_A100_40GB, pool="default", mig_enabled=True)
    for start in (0, 4):
        gpu.instances.add(profile="3g.20gb", placement_start=start, placement_size=4)
    validate_fleet(fleet)
    return fleet


def test_the_mig_line_gives_the_pools_load_and_the_carbon_it_compares() -> None:
    fleet = _mig_fleet()
    ci = (65.0, 71.0, 75.0, 150.0)
    mean, upper = (0.71, 0.75, 0.77, 0.65), (1.02, 1.1, 1.2, 0.9)
    inputs = PlanningInputs(
        start_s=0.0, horizon_hours=len(ci), fleet=fleet, ci={"ES": SeriesForecast(ci, ci, ci)},
        load={"default": SeriesForecast(mean, mean, upper)}, params=load_default_params(), gpu_platform={},
        capabilities={f"whole-{i}": Capability(8.8, 70.0, 59.0, "predicted", "llama3-8b@A100-80GB")
                      for i in range(2)})
    plan = MigVariantsSolver().solve(inputs)
    (line,) = [text for text in plan.explanation if text.startswith("pool default, hour 0:")]
    assert "pool load 0.71 req/s (planned for 1.02, the forecast's upper)" in line, line
    assert "0.00 req/s of it on the MIG GPUs (the pool's other engines carry up to 15.84 req/s first)" in line, line
    # The percentage against BASE comes with the two carbon figures it compares, and BASE's CI.
    found = re.search(r"MIG GPUs ([\d.]+) g/h vs BASE ([\d.]+) g/h at the horizon's mean CI (\d+) g/kWh, carbon "
                      r"([+-][\d.]+) % vs BASE", line)
    assert found, line
    mig_g, base_g, base_ci, pct = (float(x) for x in found.groups())
    assert base_ci == round(sum(ci) / len(ci)) and mig_g > 0 and base_g > 0
    assert abs(pct - 100 * (base_g - mig_g) / base_g) < 0.3  # the figures are given to three digits


# ----------------------------------------------------------------------------------------------------------------
# The cache decision: "embodied carbon (0.0 g/h) outweighs the energy it would save (0.0 g/h)" shrank LMCache from
# 1 GiB to 0, a restart that empties L1, on two zeros. A resize must matter, or the size in force is kept.
# ----------------------------------------------------------------------------------------------------------------

GIB = 1 << 30


def _cache_inputs(size_now: int) -> PlanningInputs:
    fleet = _mig_fleet()
    pool = fleet.pools[0]
    pool.max_cache_dram_bytes, pool.cache_step_bytes = 2 * GIB, GIB // 2
    pool.mean_prompt_tokens, pool.mean_output_tokens = 1024, 128
    ci = (65.0, 71.0, 75.0, 150.0)
    mean, upper = (0.71, 0.75, 0.77, 0.65), (1.02, 1.1, 1.2, 0.9)
    return PlanningInputs(
        start_s=0.0, horizon_hours=len(ci), fleet=fleet, ci={"ES": SeriesForecast(ci, ci, ci)},
        load={"default": SeriesForecast(mean, mean, upper)}, params=load_default_params(), gpu_platform={},
        capabilities={f"whole-{i}": Capability(8.8, 70.0, 59.0, "predicted", "llama3-8b@A100-80GB")
                      for i in range(2)}, cache_sizes={"default": (size_now, 0)})


def test_a_cache_resize_on_negligible_figures_keeps_the_size_in_force() -> None:
    from greenserve.optimizer.solvers.cache_greencache import GreenCacheIlp

    plan = GreenCacheIlp().solve(_cache_inputs(GIB))
    assert {t.dram_bytes for hour in plan.per_interval for t in hour} == {GIB}, "LMCache keeps its 1 GiB"
    (line,) = [text for text in plan.explanation if text.startswith("pool default: dram cache")]
    assert "dram cache 1.0 GiB: kept: the best resize" in line, line
    # Every figure given is one that tells: no "0.0 g" standing for a value that decided.
    grams = [float(g) for g in re.findall(r"([\d.]+) g\b", line)]
    assert grams and all(g > 0 for g in grams), line
    assert "(0.0 g/h" not in line and "0.0 g/h)" not in line, line


def test_a_resize_that_matters_is_made_and_states_its_figures() -> None:
    from greenserve.optimizer.solvers.cache_greencache import PoolCacheModel, keep_unless_it_matters

    # Two sizes over two hours: the larger saves 10 g/h of energy for 1 g/h of embodied carbon.
    m = PoolCacheModel("p", "dram", [0, GIB], [3600.0, 3600.0], carbon_g=[[100.0, 91.0], [100.0, 91.0]],
                       ttft=[[0.95, 0.95]] * 2, tpot=[[0.95, 0.95]] * 2, rho=0.9, source="test", ci=[100.0, 100.0])
    assert keep_unless_it_matters(m, [1, 1], 0, per_hour_slo=False) == ([1, 1], "")
    # The same choice on figures a thousand times smaller than the pool's carbon: kept, saying by how much.
    m.carbon_g = [[100.0, 99.99], [100.0, 99.99]]
    picks, why = keep_unless_it_matters(m, [1, 1], 0, per_hour_slo=False)
    assert picks == [0, 0] and "would save 0.02 g over 2 h, 0.01% of the pool's 200 g" in why, why
    # Unless the size in force misses the SLO, or is unknown.
    m.ttft = [[0.5, 0.95]] * 2
    assert keep_unless_it_matters(m, [1, 1], 0, per_hour_slo=False)[0] == [1, 1]
    assert keep_unless_it_matters(m, [1, 1], None, per_hour_slo=False)[0] == [1, 1]
