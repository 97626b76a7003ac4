"""The pieces of the variants-on-MIG model (CLOVER): variant catalogue, what one variant does on one MIG slice,
and the layout-and-variants patterns a GPU can take.

* **Catalogue** (``data/variants.toml``): published quality of each variant (score / baseline score of the same
  evaluation, cited) and its weight bytes per parameter.
* **Options**: the capability of a variant on a slice ``(gpu model, MIG profile)``: an engine of the pool already
  running there (its capability, stored profile or prediction, from ``capacity.py``), else the simulator: its own
  profile ``"<simulator_model>@<hardware>-MIG-<profile>"`` when it has one, else the closest profile of the same
  architecture scaled to the slice (SM share, memory slices, memory, weight bytes) and predicted by the same
  bisection; the option says which. A variant whose weights do not fit the slice has no option there.
* **Patterns**: with GPUs of one model interchangeable, what matters of a GPU is the multiset of
  ``(profile, variant)`` of its instances (CLOVER's configuration graph, Sec. 4.2: which GPU a copy runs on does
  not change the objective). Patterns are enumerated from the gpu-partitioner's maximal layouts (all rules of
  ``geometry.py``; ``+me`` profiles left out: media engines do nothing for an LLM) and every assignment of a
  fitting variant to each instance; an instance no variant fits stays without an engine.
"""

from __future__ import annotations

import itertools
import math
import tomllib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path

from greenserve.common.mig_geometry import GpuGeometry, Placement, geometry
from greenserve.optimizer import capacity
from greenserve.simulator.engine_profile import DATA_FILE, EngineProfile, list_profiles, load_profile
from greenserve.v1 import common_pb2

CATALOGUE_FILE = Path(__file__).resolve().parent.parent / "data" / "variants.toml"
NO_VARIANT = ""  # an instance without an engine

# SMs of each GPU-instance profile and of the whole GPU (NVIDIA's MIG User Guide,
# https://docs.nvidia.com/datacenter/tesla/mig-user-guide/, "Supported MIG Profiles" tables, and the SMs that
# `nvidia-smi mig -lgip` prints). H100/H200: SXM5 counts.
GPU_SMS = {"A100-40GB": 108, "A100-80GB": 108, "H100-80GB": 132, "H200-141GB": 132}
PROFILE_SMS = {
    "A100-40GB": {"1g.5gb": 14, "1g.10gb": 14, "2g.10gb": 28, "3g.20gb": 42, "4g.20gb": 56, "7g.40gb": 98},
    "A100-80GB": {"1g.10gb": 14, "1g.20gb": 14, "2g.20gb": 28, "3g.40gb": 42, "4g.40gb": 56, "7g.80gb": 98},
    "H100-80GB": {"1g.10gb": 16, "1g.20gb": 26, "2g.20gb": 32, "3g.40gb": 60, "4g.40gb": 64, "7g.80gb": 132},
    "H200-141GB": {"1g.18gb": 16, "1g.35gb": 26, "2g.35gb": 32, "3g.71gb": 60, "4g.71gb": 64, "7g.141gb": 132},
}


# ----------------------------------------------------------------------------------------------------------------
# Catalogue
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CatalogueVariant:
    family: str
    name: str
    model: str
    simulator_model: str
    weight_bytes_per_param: float
    vllm_args: tuple[str, ...]
    score: float
    baseline_score: float
    source: str

    @property
    def quality_fraction(self) -> float:
        return min(1.0, self.score / self.baseline_score)

    def to_proto(self) -> common_pb2.ModelVariant:
        return common_pb2.ModelVariant(name=self.name, model=self.model, quality_fraction=self.quality_fraction,
                                       quality_source=f"{self.source}; {catalogue_benchmark()}",
                                       simulator_model=self.simulator_model, vllm_args=list(self.vllm_args))


@cache
def _catalogue_document() -> dict:
    with CATALOGUE_FILE.open("rb") as fh:
        return tomllib.load(fh)


def catalogue_benchmark() -> str:
    return str(_catalogue_document()["benchmark"])


@cache
def catalogue() -> dict[str, CatalogueVariant]:
    """Every catalogued variant by name."""
    out: dict[str, CatalogueVariant] = {}
    for fam in _catalogue_document()["families"]:
        for v in fam["variants"]:
            out[v["name"]] = CatalogueVariant(
                family=fam["name"], name=v["name"], model=v["model"], simulator_model=fam["simulator_model"],
                weight_bytes_per_param=float(v["weight_bytes_per_param"]), vllm_args=tuple(v["vllm_args"]),
                score=float(v["score"]), baseline_score=float(v["baseline_score"]), source=v["source"])
    return out


def family(name: str) -> list[CatalogueVariant]:
    """The catalogued variants of one family, best first."""
    found = [v for v in catalogue().values() if v.family == name]
    if not found:
        raise KeyError(f"no variant family {name!r} in the catalogue")
    return sorted(found, key=lambda v: -v.quality_fraction)


def weight_bytes_per_param(variant: common_pb2.ModelVariant | None, pool_model: str) -> float:
    """Bytes per parameter of a variant: the catalogue's (by name or model), else what its vLLM flags say."""
    cat = catalogue()
    if variant is not None:
        for v in cat.values():
            if v.name == variant.name or v.model == variant.model:
                return v.weight_bytes_per_param
        text = " ".join([variant.model, *variant.vllm_args]).lower()
    else:
        text = pool_model.lower()
    if any(k in text for k in ("awq", "gptq", "w4a16", "int4", "4bit", "4-bit")):
        return 0.5
    if any(k in text for k in ("fp8", "int8", "w8a8", "w8a16", "8bit", "8-bit")):
        return 1.0
    return 2.0


# ----------------------------------------------------------------------------------------------------------------
# Options: a variant on a slice
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """What one instance of ``variant`` on a ``profile`` slice of a ``gpu_model`` GPU does at the pool's SLO."""

    capacity_requests_per_s: float
    idle_power_w: float
    energy_per_request_j: float
    quality_fraction: float
    source: str  # "measured", "published", "predicted", "predicted (scaled)", "engine"
    detail: str


class NoOption(ValueError):
    """A variant that has no profile and no way to predict one (``field`` names the fleet field)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def slice_sm_fraction(gpu_model: str, profile: str, geo: GpuGeometry) -> float:
    sms = PROFILE_SMS.get(gpu_model, {}).get(profile)
    if sms is None:  # a profile the table lacks: its compute slices of the 7 (98 of 108 SMs usable in MIG mode)
        return geo.profile(profile).compute_slices / geo.compute_slices * 98 / 108
    return sms / GPU_SMS[gpu_model]


@cache
def _sim_gpus() -> dict:
    with DATA_FILE.open("rb") as fh:
        return tomllib.load(fh)["gpus"]


def _closest_profile(sim_model: str, gpu_model: str) -> str | None:
    known = list_profiles()
    same = [p for p in known if p.split("@")[0] == sim_model]
    for want in (f"{sim_model}@{gpu_model}", f"{sim_model}@{gpu_model.split('-')[0]}"):
        hit = [p for p in same if p == want or p.startswith(want)]
        if hit:
            return sorted(hit, key=len)[0]
    whole = [p for p in same if "MIG" not in p]
    return sorted(whole, key=len)[0] if whole else (same[0] if same else None)


def scaled_engine_profile(sim_model: str, gpu_model: str, profile: str, bytes_per_param: float
                          ) -> tuple[EngineProfile, str] | None:
    """A simulator profile for ``sim_model`` on one ``profile`` slice, built from the closest known profile of the
    same architecture: per-GPU totals of the slice's GPU (the simulator's GPU table; the closest family's when it
    has none) times the slice's SM share (compute, power) and memory slices (bandwidth), the slice's memory, the
    variant's weight bytes. None when the simulator has no profile of that architecture."""
    base_name = _closest_profile(sim_model, gpu_model)
    if base_name is None:
        return None
    base = load_profile(base_name)
    geo = geometry(gpu_model)
    prof = geo.profile(profile)
    gpus = _sim_gpus()
    gpu_key = gpu_model if gpu_model in gpus else next(
        (k for k in gpus if k.split("-")[0] == gpu_model.split("-")[0]),
        "H100-80GB" if gpu_model.startswith("H") else "A100-80GB")
    gpu = gpus[gpu_key]
    sm = slice_sm_fraction(gpu_model, profile, geo)
    bw = prof.memory_slices / geo.memory_slices
    name = f"{sim_model}@{gpu_model}-MIG-{profile}/{bytes_per_param:g}B"
    scaled = base.with_overrides(
        name=name, hardware=f"{gpu_model} MIG {profile}", gpu_count=1, tp_comm_efficiency=1.0,
        peak_flops=gpu["peak_fp16_flops"] * sm, hbm_bandwidth_bytes_per_s=gpu["hbm_bandwidth_bytes_per_s"] * bw,
        memory_bytes=prof.memory_mib * 2.0 ** 20, idle_w=gpu["idle_w"] * sm, max_w=gpu["tdp_w"] * sm,
        dram_bandwidth_bytes_per_s=gpu["host_link_bandwidth_bytes_per_s"], weight_bytes_per_param=bytes_per_param)
    note = (f"scaled from {base_name} to {gpu_model} {profile} ({sm:.0%} of the SMs, {prof.memory_slices}/8 memory "
            f"slices{'' if gpu_key == gpu_model else f', {gpu_key} figures'}), {bytes_per_param:g} B/param")
    return scaled, note


def fits(engine: EngineProfile, prompt: int, output: int) -> bool:
    """The weights, vLLM's reserve and one request's KV cache fit the slice at vLLM's memory utilisation."""
    room = (engine.memory_bytes * engine.gpu_memory_utilization - engine.weight_bytes
            - engine.non_kv_reserve_bytes_per_gpu)
    return room >= engine.kv_bytes_per_token * (prompt + output)


def predicted_option(pool: common_pb2.Pool, gpu_model: str, profile: str, variant: common_pb2.ModelVariant | None,
                     sim_model: str | None, field: str, prefix_hit_fraction: float = 0.0) -> Option | None:
    """Simulator option of a variant on a slice; None when it does not fit; NoOption when it cannot be predicted.
    ``prefix_hit_fraction``: the pool's measured prefix-cache hit fraction, the conversations' shape
    (``capacity.predict``: the slice's own KV memory decides its hits)."""
    if not sim_model or sim_model not in {p.split("@")[0] for p in list_profiles()}:
        raise NoOption(field, f"variant {variant.name if variant else pool.model!r} has no stored profile for "
                              f"{gpu_model} MIG slices and no simulator model to predict one (set simulator_model "
                              f"to one of the simulator's architectures)")
    prompt = pool.mean_prompt_tokens or capacity.DEFAULT_PROMPT_TOKENS
    output = pool.mean_output_tokens or capacity.DEFAULT_OUTPUT_TOKENS
    bpp = weight_bytes_per_param(variant, pool.model)
    quality = variant.quality_fraction if variant is not None else 1.0
    exact = f"{sim_model}@{gpu_model}-MIG-{profile}"
    if exact in list_profiles() and math.isclose(load_profile(exact).weight_bytes_per_param, bpp):
        engine, note = load_profile(exact), exact
    else:
        built = scaled_engine_profile(sim_model, gpu_model, profile, bpp)
        if built is None:
            return None
        engine, note = built
    if not fits(engine, prompt, output):
        return None
    cap = capacity.predict(engine if note != exact else exact, pool.slo.ttft_s, pool.slo.tpot_s,
                           pool.slo.attainment_fraction, prompt, output, prefix_hit_fraction)
    if cap.capacity_requests_per_s <= 0:
        return None
    source = "predicted" if note == exact else "predicted (scaled)"
    if prefix_hit_fraction > 0:
        note = (f"{note}, conversations with {prefix_hit_fraction:.0%} of prompts reusable, "
                f"{cap.predicted_hit_fraction:.0%} hit in its KV memory")
    return Option(cap.capacity_requests_per_s, cap.idle_power_w, cap.energy_per_request_j, quality, source, note)


# ----------------------------------------------------------------------------------------------------------------
# Layouts and patterns
# ----------------------------------------------------------------------------------------------------------------


@cache
def layout_classes(gpu_model: str) -> dict[tuple[str, ...], tuple[tuple[Placement, ...], ...]]:
    """Maximal layouts of a GPU model grouped by their multiset of profiles (sorted names)."""
    geo = geometry(gpu_model)
    names = [p.name for p in geo.profiles if not p.media_extensions]
    out: dict[tuple[str, ...], list[tuple[Placement, ...]]] = {}
    for layout in geo.maximal_layouts(names):
        out.setdefault(tuple(sorted(p.profile for p in layout)), []).append(layout)
    return {k: tuple(v) for k, v in out.items()}


@dataclass(frozen=True, eq=False)
class Pattern:
    """A GPU's layout class with a variant per instance (a multiset of (profile, variant)). Compared by identity:
    each pattern is enumerated once per (pool, GPU model), and solvers key dictionaries by it."""

    gpu_model: str
    profiles: tuple[str, ...]
    kinds: tuple[tuple[str, str], ...]  # sorted (profile, variant) per instance
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    layout: tuple[Placement, ...] = ()  # set for a "keep" pattern: exactly the layout a GPU has now

    def label(self) -> str:
        """``{2x 3g.40gb:8b-fp8, 1g.10gb:8b-awq}``: the instances with an engine (others are not created)."""
        parts = [f"{n}x {p}:{v}" if n > 1 else f"{p}:{v}" for (p, v), n in sorted(self.counts.items()) if v]
        return "{" + ", ".join(parts) + "}" if parts else "{no engine}"


def make_pattern(gpu_model: str, profiles: tuple[str, ...], kinds: Iterable[tuple[str, str]]) -> Pattern:
    ks = tuple(sorted(kinds))
    return Pattern(gpu_model, profiles, ks, dict(Counter(ks)))


def keep_pattern(gpu_model: str, state: tuple[tuple[Placement, str], ...]) -> Pattern | None:
    """The pattern "this GPU stays exactly as it is" (None when its layout breaks the GPU's rules). Its layout
    need not be maximal nor its variants fit the model's memory check: it is what runs now."""
    layout = tuple(sorted(p for p, _ in state))
    if not layout or not geometry(gpu_model).is_valid(layout):
        return None
    ks = tuple(sorted((p.profile, v) for p, v in state))
    return Pattern(gpu_model, tuple(sorted(p.profile for p in layout)), ks, dict(Counter(ks)), layout)


def enumerate_patterns(gpu_model: str, variants_by_profile: dict[str, list[str]]) -> list[Pattern]:
    """Every layout class of ``gpu_model`` x every multiset assignment of fitting variants to its instances."""
    out: list[Pattern] = []
    for profiles in layout_classes(gpu_model):
        per_profile = []
        for prof, n in sorted(Counter(profiles).items()):
            choices = variants_by_profile.get(prof) or [NO_VARIANT]
            per_profile.append([[(prof, v) for v in combo]
                                for combo in itertools.combinations_with_replacement(sorted(choices), n)])
        for combo in itertools.product(*per_profile):
            out.append(make_pattern(gpu_model, profiles, [k for part in combo for k in part]))
    return out


def ged(a: dict[tuple[str, str], int], b: dict[tuple[str, str], int]) -> int:
    """CLOVER's graph edit distance between two configuration graphs (edge weights (variant, slice) -> count):
    the sum of edge-weight changes (swapping one instance's variant costs 2)."""
    return sum(abs(a.get(k, 0) - b.get(k, 0)) for k in set(a) | set(b))


@lru_cache(maxsize=65536)
def stopped(current: tuple[tuple[Placement, str], ...], pattern: Pattern) -> int:
    """Engines of ``current`` that taking ``pattern`` (as ``restarts`` lays it out) stops."""
    _, layout, variants = restarts(current, pattern)
    target = {(p, v) for p, v in zip(layout, variants) if v}
    return sum(1 for p, v in current if v and (p, v) not in target)


@lru_cache(maxsize=65536)
def restarts(current: tuple[tuple[Placement, str], ...], pattern: Pattern
             ) -> tuple[list[tuple[str, str]], tuple[Placement, ...], list[str]]:
    """The fewest engines a GPU in state ``current`` ((placement, variant) per instance) must (re)start to take
    ``pattern`` (as (profile, variant)), with the concrete layout that achieves it and the variant per placement of
    that layout. An instance is kept when the layout has the same placement and the pattern the same variant
    there (the gpu-partitioner keeps a GI whose profile and placement do not change, ``planner.plan``)."""
    cur = dict(current)
    best: tuple[list[tuple[str, str]], tuple[Placement, ...], list[str]] | None = None
    if pattern.layout:
        layouts: tuple[tuple[Placement, ...], ...] = (pattern.layout,)
        same_kinds = Counter((p.profile, v) for p, v in cur.items()) == Counter(pattern.counts)
        if set(cur) == set(pattern.layout) and same_kinds:
            return [], pattern.layout, [cur[p] for p in pattern.layout]
    else:
        layouts = layout_classes(pattern.gpu_model)[pattern.profiles]
    for layout in layouts:
        left = Counter(pattern.counts)
        variants: list[str | None] = [None] * len(layout)
        for i, p in enumerate(layout):  # keep an instance where placement and variant already match
            v = cur.get(p)
            if v is not None and left[(p.profile, v)] > 0:
                left[(p.profile, v)] -= 1
                variants[i] = v
        kept = sum(v is not None for v in variants)
        for i, p in enumerate(layout):
            if variants[i] is None:
                v = next(vv for (pp, vv), n in sorted(left.items()) if pp == p.profile and n > 0)
                left[(p.profile, v)] -= 1
                variants[i] = v
        del kept
        started = [(p.profile, str(v)) for p, v in zip(layout, variants)
                   if v != NO_VARIANT and cur.get(p) != v]
        if best is None or len(started) < len(best[0]):
            best = (started, layout, [str(v) for v in variants])
    assert best is not None
    return best
