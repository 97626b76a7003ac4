"""One unit of a GreenLLM serving mode as a replay fleet: shared by the optimizer's serving-modes solver and the
profiler's simulator backend, so both evaluate a mode the same way.

* STANDALONE: the target on one new GPU;
* SPEC_DECODE: target and draft on the new GPU (``SpecDecodeConfig``);
* DISAGGREGATED (DPD): prefill on the new GPU, decode on the old one, the KV cache over the link;
* DISAGGREGATED_SPEC_DECODE (DSD): target on the new GPU, draft on the old one, tokens and probabilities over
  the link.

Profiles are the simulator's: the stored ``<model>@<hardware>`` one, else the closest stored profile of the model
scaled to the GPU's figures (the data file's ``gpus`` table).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache

from greenserve.simulator.engine_profile import DATA_FILE, EngineProfile, list_profiles, load_profile
from greenserve.simulator.mode_configs import SpecDecodeConfig
from greenserve.simulator.perf_model import PerfModel
from greenserve.simulator.replay_fleet import EngineSpec, FleetConfig
from greenserve.v1 import common_pb2

STANDALONE = common_pb2.SERVING_MODE_STANDALONE
SPEC_DECODE = common_pb2.SERVING_MODE_SPEC_DECODE
DPD = common_pb2.SERVING_MODE_DISAGGREGATED
DSD = common_pb2.SERVING_MODE_DISAGGREGATED_SPEC_DECODE
DEFAULT_SPEC_TOKENS = 3  # GreenLLM Sec. V-A
VOCAB_SIZE = 32000  # Llama 2's vocabulary (the draft's probability vectors)


@lru_cache(maxsize=1)
def gpu_table() -> dict:
    """The simulator's GPU figures (its data file's ``gpus`` table), read once."""
    with DATA_FILE.open("rb") as fh:
        return tomllib.load(fh)["gpus"]


@lru_cache(maxsize=256)
def engine_profile(sim_model: str, hardware: str) -> EngineProfile | None:
    """The simulator's profile of ``sim_model`` on one whole ``hardware`` GPU: the stored one, else the closest
    stored profile of the same model with that GPU's figures; None when the model or the GPU is unknown."""
    known = list_profiles()
    if f"{sim_model}@{hardware}" in known:
        return load_profile(f"{sim_model}@{hardware}")
    gpus = gpu_table()
    same = [p for p in known if p.split("@")[0] == sim_model and p.split("@")[1] in gpus]  # whole single GPUs
    if hardware not in gpus or not same:
        return None
    g = gpus[hardware]
    # the base with the closest memory keeps its KV reserve (a 16 GB GPU's smaller one)
    base = min(same, key=lambda p: (abs(float(gpus[p.split("@")[1]]["memory_bytes"]) - float(g["memory_bytes"])), p))
    return load_profile(base).with_overrides(
        name=f"{sim_model}@{hardware} (scaled from {base})", hardware=hardware, gpu_count=1,
        peak_flops=float(g["peak_fp16_flops"]), hbm_bandwidth_bytes_per_s=float(g["hbm_bandwidth_bytes_per_s"]),
        memory_bytes=float(g["memory_bytes"]), idle_w=float(g["idle_w"]), max_w=float(g["tdp_w"]))


@dataclass(frozen=True)
class Unavailable:
    """Why a mode cannot be built; ``setting`` names what is missing or unknown: "hardware", "draft",
    "old_hardware" or "link_bandwidth"."""

    setting: str
    reason: str


@dataclass(frozen=True)
class ModeUnit:
    """The replay fleet of one unit and, per engine, the GPUs it occupies ("new" and/or "old")."""

    fleet: FleetConfig
    engine_gpus: tuple[tuple[str, ...], ...]


def mode_unit(mode: int, target_model: str, new_hardware: str, *, draft_model: str = "", old_hardware: str = "",
              acceptance_fraction: float = 0.0, num_speculative_tokens: int = DEFAULT_SPEC_TOKENS,
              link_bandwidth_bytes_per_s: float = 0.0, target: EngineProfile | None = None
              ) -> ModeUnit | Unavailable:
    """One unit of ``mode`` (see the module docstring); ``target`` replaces the target's profile on the new GPU
    (a calibrated or MIG profile)."""
    target = target or engine_profile(target_model, new_hardware)
    if target is None:
        return Unavailable("hardware", f"the simulator has no profile of {target_model} on {new_hardware}")
    if mode in (SPEC_DECODE, DSD) and not draft_model:
        return Unavailable("draft", "no draft model declared")
    if mode in (DPD, DSD):
        if not old_hardware:
            return Unavailable("old_hardware", "no older GPU to pair with")
        if link_bandwidth_bytes_per_s <= 0:
            return Unavailable("link_bandwidth", "no link bandwidth declared")
    if mode == DPD:
        decode = engine_profile(target_model, old_hardware)
        if decode is None:
            return Unavailable("old_hardware", f"the simulator has no profile of {target_model} on {old_hardware}")
        if PerfModel(decode).kv_cache_tokens() <= 0:
            return Unavailable("old_hardware", f"{target_model} leaves no KV cache on {old_hardware}")
        return ModeUnit(FleetConfig((EngineSpec(target, role="prefill"), EngineSpec(decode, role="decode")),
                                    kv_link_bandwidth_bytes_per_s=link_bandwidth_bytes_per_s),
                        (("new",), ("old",)))
    if mode in (SPEC_DECODE, DSD):
        hw = new_hardware if mode == SPEC_DECODE else old_hardware
        draft = engine_profile(draft_model, hw)
        if draft is None:
            return Unavailable("old_hardware" if mode == DSD and engine_profile(draft_model, new_hardware) else "draft",
                               f"the simulator has no profile of the draft {draft_model} on {hw}")
        spec = SpecDecodeConfig(draft=draft, num_speculative_tokens=num_speculative_tokens or DEFAULT_SPEC_TOKENS,
                                acceptance_rate=acceptance_fraction, disaggregated=mode == DSD,
                                link_bandwidth_bytes_per_s=link_bandwidth_bytes_per_s or 1.0, vocab_size=VOCAB_SIZE)
        return ModeUnit(FleetConfig((EngineSpec(target, spec=spec),)),
                        (("new", "old") if mode == DSD else ("new",),))
    return ModeUnit(FleetConfig((EngineSpec(target),)), (("new",),))
