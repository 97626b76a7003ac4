"""The performance profile of one vLLM engine (model x hardware) and the versioned data file it is loaded from.

An ``EngineProfile`` holds every parameter ``perf_model.PerfModel`` needs: the model's architecture, the hardware's
engine totals (already multiplied by the GPU count and the MIG fractions), vLLM's engine settings and the
calibratable efficiencies. ``load_profile(name)`` builds one from ``data/profiles.toml`` (``DATA_FILE``).

Every parameter comes from ``data/profiles.toml`` where each number cites its source; ``EngineProfile.sources``
carries those citations so a caller can show them. ``calibration.calibrate`` refits the efficiency and power
parameters to measured points and returns a new profile that says so.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from google.protobuf import json_format

from greenserve.common.file_errors import cannot_read
from greenserve.v1 import common_pb2

__all__ = [
    "DATA_FILE",
    "DEFAULT_PROFILE",
    "EngineProfile",
    "data_version",
    "list_profiles",
    "load_profile",
    "FACT_NAMES",
    "base_profile",
    "engine_profile_from_file",
    "engine_profile_from_measured",
    "tiny_llama_cpu_profile",
    "with_coefficients",
]

DATA_FILE: Path = Path(__file__).resolve().parent / "data" / "profiles.toml"
"""The versioned parameter file (every number with its cited source)."""

DEFAULT_PROFILE: str = "llama3-8b@A100-80GB"
"""The profile used when a caller names none (the most common single-GPU vLLM setup)."""

SUPPORTED_SCHEMA_VERSION = 1

# Numeric fields of EngineProfile that a profile / engine_defaults table may set.
_ENGINE_KEYS = (
    "block_size_tokens",
    "gpu_memory_utilization",
    "non_kv_reserve_bytes_per_gpu",
    "weight_bytes_per_param",
    "kv_bytes_per_element",
    "prefill_mfu",
    "decode_mbu",
    "step_overhead_s",
    "max_num_seqs",
    "max_num_batched_tokens",
    "disk_bandwidth_bytes_per_s",
    "disk_latency_s",
    "dram_latency_s",
    "memory_power_weight",
    "tp_comm_efficiency",
    "tp_link_bandwidth_bytes_per_s",
    "tp_allreduce_latency_s",
)
_INT_KEYS = frozenset({"block_size_tokens", "max_num_seqs", "max_num_batched_tokens", "gpu_count",
                       "n_layers", "hidden_size", "n_kv_heads", "head_dim"})



@dataclass(frozen=True)
class EngineProfile:
    """All parameters of one engine: a model served on some hardware (several GPUs or one MIG slice).

    Totals (``peak_flops``, ``hbm_bandwidth_bytes_per_s``, ``memory_bytes``, ``idle_w``, ``max_w``,
    ``dram_bandwidth_bytes_per_s``) are for the whole engine, i.e. already multiplied by the GPU count
    and by the MIG fractions. ``sources`` maps each field name to the citation of its value.
    """

    name: str
    model: str
    hardware: str
    block_size_tokens: int
    # model architecture
    n_params: float
    n_layers: int
    hidden_size: int
    n_kv_heads: int
    head_dim: int
    weight_bytes_per_param: float
    kv_bytes_per_element: float
    # hardware (engine totals)
    gpu_count: int
    peak_flops: float
    hbm_bandwidth_bytes_per_s: float
    memory_bytes: float
    idle_w: float
    max_w: float
    dram_bandwidth_bytes_per_s: float
    dram_latency_s: float
    disk_bandwidth_bytes_per_s: float
    disk_latency_s: float
    # vLLM engine
    gpu_memory_utilization: float
    non_kv_reserve_bytes_per_gpu: float
    max_num_seqs: int
    max_num_batched_tokens: int
    # efficiencies (the calibratable part)
    prefill_mfu: float
    decode_mbu: float
    step_overhead_s: float
    memory_power_weight: float
    tp_comm_efficiency: float
    # Tensor-parallel all-reduces over a link (PCIe-only nodes); 0 = not modelled (NVLink, or the flat
    # tp_comm_efficiency). When set, PerfModel derives the TP cost from them instead of tp_comm_efficiency.
    tp_link_bandwidth_bytes_per_s: float = 0.0
    tp_allreduce_latency_s: float = 0.0
    # A measured CPU engine's linear step model (step_model.py): when step_per_prefill_token_s > 0 a step takes
    # ``step_overhead_s + per_prefill_token x prefill tokens + per_sequence x decode batch + per_context_token x
    # decode context`` instead of the roofline. 0 (the data file's profiles): the roofline.
    step_per_prefill_token_s: float = 0.0
    step_per_sequence_s: float = 0.0
    step_per_context_token_s: float = 0.0
    # Seconds each request spends outside the engine's steps before its first token is counted (the API server's
    # input processing and its hand-offs to and from the engine core): added to TTFT and end-to-end latency, not
    # to the engine's busy time. 0: none (the data file's profiles).
    request_frontend_s: float = 0.0
    data_version: str = ""
    calibrated_from: str = ""
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("name", "model", "hardware", "data_version", "calibrated_from", "sources"):
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{f.name}: must be a finite number, got {value!r} (profile {self.name!r})")
            if value < 0:
                raise ValueError(f"{f.name}: must be >= 0, got {value!r} (profile {self.name!r})")
        for name in ("block_size_tokens", "n_params", "n_layers", "hidden_size", "n_kv_heads", "head_dim",
                     "gpu_count", "peak_flops", "hbm_bandwidth_bytes_per_s", "memory_bytes",
                     "dram_bandwidth_bytes_per_s", "disk_bandwidth_bytes_per_s", "max_num_seqs",
                     "max_num_batched_tokens", "weight_bytes_per_param", "kv_bytes_per_element"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0 (profile {self.name!r})")
        for name in ("prefill_mfu", "decode_mbu", "gpu_memory_utilization", "memory_power_weight",
                     "tp_comm_efficiency"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name}: must be in (0, 1], got {value!r} (profile {self.name!r})")
        if self.step_per_prefill_token_s > 0 and self.step_per_sequence_s <= 0:
            raise ValueError(f"step_per_sequence_s: must be > 0 with a linear step model (profile {self.name!r})")
        if self.max_w < self.idle_w:
            raise ValueError(f"max_w: must be >= idle_w ({self.max_w} < {self.idle_w}, profile {self.name!r})")
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))

    # Derived sizes --------------------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> float:
        """Bytes of K and V for one token over all layers: ``2 x L x kv_heads x head_dim x dtype``."""
        return 2.0 * self.n_layers * self.n_kv_heads * self.head_dim * self.kv_bytes_per_element

    @property
    def weight_bytes(self) -> float:
        """Bytes of the model weights held in GPU memory."""
        return self.n_params * self.weight_bytes_per_param

    def with_overrides(self, **overrides: Any) -> EngineProfile:
        """A validated copy with the named fields replaced (unknown names raise ``ValueError``)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: not a field of EngineProfile")
        return replace(self, **overrides)


# -----------------------------------------------------------------------------------------------------
# Data file
# -----------------------------------------------------------------------------------------------------


@lru_cache(maxsize=4)
def _document(path: str) -> Mapping[str, Any]:
    with open(path, "rb") as handle:
        document = tomllib.load(handle)
    version = document.get("schema_version")
    if version != SUPPORTED_SCHEMA_VERSION:
        raise ValueError(f"schema_version: {path} has {version!r}, this code reads {SUPPORTED_SCHEMA_VERSION}")
    for table in ("gpus", "models", "engine_defaults", "profiles"):
        if not isinstance(document.get(table), dict):
            raise ValueError(f"{table}: missing table in {path}")
    return document


def data_version(path: Path | None = None) -> str:
    """The ``data_version`` string of the parameter file (recorded with every replay)."""
    return str(_document(str(path or DATA_FILE)).get("data_version", ""))


MEASURED_PROFILES_ENV = "GREENSERVE_MEASURED_PROFILES"
"""Environment variable: measured profile files (protobuf JSON, ``os.pathsep``-separated) whose fitted step model
(profiler/step_fit.py) joins the data file's profiles under ``model@hardware``; set by ``greenserve evaluate
--profile`` so that its worker processes see the same engines."""


def measured_profiles() -> dict[str, EngineProfile]:
    """The engines of the measured profiles named by ``MEASURED_PROFILES_ENV`` (none when it is unset)."""
    return _measured_from(os.environ.get(MEASURED_PROFILES_ENV, ""))


@lru_cache(maxsize=4)
def _measured_from(paths: str) -> dict[str, EngineProfile]:
    engines = {}
    for path in (p for p in paths.split(os.pathsep) if p):
        engine = engine_profile_from_file(Path(path))
        engines[engine.name] = engine
    return engines


def list_profiles(path: Path | None = None) -> list[str]:
    """Names of all profiles in the data file (and, without ``path``, the measured ones), sorted."""
    names = set(_document(str(path or DATA_FILE))["profiles"])
    if path is None:
        names |= set(measured_profiles())
    return sorted(names)


def _number(table: Mapping[str, Any], key: str, where: str) -> float:
    value = table.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key}: missing or not a number in {where}")
    return float(value)


def load_profile(name: str, path: Path | None = None) -> EngineProfile:
    """Build the named profile from the data file.

    Raises ``KeyError`` naming the known profiles when ``name`` is unknown, ``ValueError`` when the file
    is malformed (a referenced GPU/model missing, a number missing or out of range).
    """
    if path is None:
        measured = measured_profiles().get(name)
        if measured is not None:
            return measured
    return _load_profile_cached(name, str(path or DATA_FILE))


@lru_cache(maxsize=64)
def _load_profile_cached(name: str, path: str) -> EngineProfile:
    document = _document(path)
    profiles = document["profiles"]
    if not isinstance(name, str) or name not in profiles:
        raise KeyError(f"profile {name!r} is unknown; known profiles: {', '.join(sorted(profiles))}")
    spec = profiles[name]
    gpu_name, model_name = spec.get("gpu"), spec.get("model")
    if gpu_name not in document["gpus"]:
        raise ValueError(f"gpu: profile {name!r} names unknown GPU {gpu_name!r}")
    if model_name not in document["models"]:
        raise ValueError(f"model: profile {name!r} names unknown model {model_name!r}")
    gpu, model, defaults = document["gpus"][gpu_name], document["models"][model_name], document["engine_defaults"]

    sources: dict[str, str] = {}
    engine: dict[str, float] = {}
    for key in _ENGINE_KEYS:
        if key in spec:
            engine[key] = _number(spec, key, f"profiles.{name}")
            sources[key] = spec.get("sources", {}).get(key, "")
        else:
            engine[key] = _number(defaults, key, "engine_defaults")
            sources[key] = defaults.get("sources", {}).get(key, "")

    count = int(_number(spec, "gpu_count", f"profiles.{name}"))
    compute_fraction = float(spec.get("compute_fraction", 1.0))
    memory_fraction = float(spec.get("memory_fraction", 1.0))
    bandwidth_fraction = float(spec.get("bandwidth_fraction", 1.0))
    for key, value in (("compute_fraction", compute_fraction), ("memory_fraction", memory_fraction),
                       ("bandwidth_fraction", bandwidth_fraction)):
        if not 0.0 < value <= 1.0:
            raise ValueError(f"{key}: must be in (0, 1] in profiles.{name}")
    # W8A8 INT8 checkpoints run their GEMMs on the INT8 tensor cores (vLLM's scaled_mm kernels); weight-only
    # quantisation and BF16 run at the FP16 rate.
    tensor_dtype = str(spec.get("tensor_dtype", "fp16"))
    if tensor_dtype not in ("fp16", "int8"):
        raise ValueError(f"tensor_dtype: must be 'fp16' or 'int8' in profiles.{name}")
    peak_key = "peak_int8_ops" if tensor_dtype == "int8" else "peak_fp16_flops"
    power_fraction = compute_fraction  # a MIG slice's share of the board power follows its SMs (assumption)
    gpu_sources = gpu.get("sources", {})
    model_sources = model.get("sources", {})
    prof_sources = spec.get("sources", {})

    def cite(key: str, base: str, *extra: str) -> str:
        parts = [gpu_sources.get(base, "")] + [prof_sources.get(e, "") for e in extra if prof_sources.get(e)]
        return "; ".join(p for p in parts if p)

    values: dict[str, Any] = dict(
        name=name,
        model=str(model.get("served_name", model_name)),
        hardware=str(spec.get("hardware", f"{count}x {gpu_name}" if count > 1 else gpu_name)),
        n_params=_number(model, "n_params", f"models.{model_name}"),
        n_layers=int(_number(model, "n_layers", f"models.{model_name}")),
        hidden_size=int(_number(model, "hidden_size", f"models.{model_name}")),
        n_kv_heads=int(_number(model, "n_kv_heads", f"models.{model_name}")),
        head_dim=int(_number(model, "head_dim", f"models.{model_name}")),
        gpu_count=count,
        peak_flops=_number(gpu, peak_key, f"gpus.{gpu_name}") * count * compute_fraction,
        hbm_bandwidth_bytes_per_s=_number(gpu, "hbm_bandwidth_bytes_per_s", f"gpus.{gpu_name}") * count
        * bandwidth_fraction,
        memory_bytes=_number(gpu, "memory_bytes", f"gpus.{gpu_name}") * count * memory_fraction,
        idle_w=_number(gpu, "idle_w", f"gpus.{gpu_name}") * count * power_fraction,
        max_w=_number(gpu, "tdp_w", f"gpus.{gpu_name}") * count * power_fraction,
        dram_bandwidth_bytes_per_s=_number(gpu, "host_link_bandwidth_bytes_per_s", f"gpus.{gpu_name}") * count,
        data_version=str(document.get("data_version", "")),
    )
    for key, value in engine.items():
        values[key] = int(value) if key in _INT_KEYS else value
    sources.update({
        "n_params": model_sources.get("n_params", ""),
        "n_layers": model_sources.get("n_layers", ""),
        "hidden_size": model_sources.get("hidden_size", ""),
        "n_kv_heads": model_sources.get("n_kv_heads", ""),
        "head_dim": model_sources.get("head_dim", ""),
        "gpu_count": prof_sources.get("gpu_count", ""),
        "peak_flops": cite("peak_flops", peak_key, "compute_fraction", "tensor_dtype"),
        "hbm_bandwidth_bytes_per_s": cite("hbm", "hbm_bandwidth_bytes_per_s", "bandwidth_fraction"),
        "memory_bytes": cite("memory", "memory_bytes", "memory_fraction"),
        "idle_w": cite("idle", "idle_w", "compute_fraction"),
        "max_w": cite("max", "tdp_w", "compute_fraction"),
        "dram_bandwidth_bytes_per_s": cite("dram", "host_link_bandwidth_bytes_per_s"),
    })
    values["sources"] = sources
    return EngineProfile(**values)


# -- measured profiles: the linear step model of a CPU engine (fitted by profiler/step_fit.py) ----------------

FACT_NAMES: tuple[str, ...] = ("step_overhead_s", "step_per_prefill_token_s", "step_per_sequence_s",
                               "step_per_context_token_s", "request_frontend_s")
"""The step model's coefficients, as facts of a measured profile and fields of ``EngineProfile``."""

TINY_LLAMA = "tiny-llama"
CPU = "CPU"
TINY_KV_CACHE_BYTES = 2**30  # VLLM_CPU_KVCACHE_SPACE=1 (vllm_cpu.engines)


def tiny_llama_cpu_profile() -> EngineProfile:
    """The tiny model (vllm_cpu/tiny_model.py: 2 layers, hidden 128, 2 KV heads of 32, MLP 256, vocabulary <= 1024,
    float32) on a CPU with a 1 GiB KV pool: the shape (KV bytes per token, KV capacity, batch limits) that the
    linear step model's coefficients complete. The roofline numbers (2e11 FLOP/s, 2e10 B/s) are orders of
    magnitude only; a fitted step model replaces them."""
    n_params = 2 * (4 * 128 * 128 // 2 + 2 * 128 * 64 + 3 * 128 * 256) + 2 * 1024 * 128
    return load_profile("llama3-8b@A100-80GB", DATA_FILE).with_overrides(
        name=f"{TINY_LLAMA}@{CPU}", model=TINY_LLAMA, hardware=CPU, n_params=float(n_params), n_layers=2,
        hidden_size=128, n_kv_heads=2, head_dim=32, weight_bytes_per_param=4.0, kv_bytes_per_element=4.0,
        gpu_count=1, peak_flops=2e11, hbm_bandwidth_bytes_per_s=2e10,
        memory_bytes=TINY_KV_CACHE_BYTES + 4.0 * n_params, gpu_memory_utilization=1.0,
        non_kv_reserve_bytes_per_gpu=0.0, max_num_seqs=128, max_num_batched_tokens=2048, idle_w=1.0, max_w=1.0,
        calibrated_from="", sources={})


def base_profile(config: common_pb2.ProfileConfig) -> EngineProfile:
    """The engine shape a measured profile of ``config`` is fitted onto: the data file's profile of that model and
    hardware, or the tiny CPU Llama. ValueError naming ``config`` when neither fits."""
    name = f"{config.model}@{config.hardware}"
    if name in list_profiles(DATA_FILE):
        return load_profile(name, DATA_FILE)
    if (config.model, config.hardware) == (TINY_LLAMA, CPU):
        return tiny_llama_cpu_profile()
    raise ValueError(f"config: no engine shape for {name!r} (the simulator's data file or {TINY_LLAMA}@{CPU})")


def with_coefficients(base: EngineProfile, coefficients: Mapping[str, float], label: str) -> EngineProfile:
    sources = dict(base.sources)
    sources.update({n: f"least-squares step-model fit to {label}" for n in FACT_NAMES})
    return base.with_overrides(**{n: float(coefficients[n]) for n in FACT_NAMES}, calibrated_from=label,
                               sources=sources)


def engine_profile_from_measured(profile: common_pb2.Profile, field: str = "profile") -> EngineProfile:
    """The simulator's engine for a MEASURED profile that carries the step model's facts. ValueError naming
    ``field`` otherwise (another source, a fact missing or not a positive number where one is needed)."""
    if profile.source != common_pb2.PROFILE_SOURCE_MEASURED:
        raise ValueError(f"{field}.source: a calibrated step model needs a MEASURED profile")
    facts = {f.name: f.value for f in profile.facts}
    missing = [n for n in FACT_NAMES if n not in facts]
    if missing:
        raise ValueError(f"{field}.facts: no fitted {missing[0]} (fit it with greenserve bench calibration)")
    for name in FACT_NAMES:
        if not math.isfinite(facts[name]) or facts[name] < 0:
            raise ValueError(f"{field}.facts: {name} must be a finite number >= 0")
    try:
        return with_coefficients(base_profile(profile.config), facts, profile.config_key or "measured profile")
    except ValueError as exc:
        raise ValueError(f"{field}.{exc}") from None


def engine_profile_from_file(path: Path, field: str = "profile") -> EngineProfile:
    """``engine_profile_from_measured`` of a profile file (protobuf JSON); ValueError naming ``field`` when the file
    cannot be read or parsed."""
    try:
        profile = json_format.Parse(path.read_text(), common_pb2.Profile())
    except OSError as exc:
        raise ValueError(f"{field}: {cannot_read(exc, path)}") from None
    except (UnicodeDecodeError, json_format.ParseError) as exc:
        raise ValueError(f"{field}: cannot read a profile from {path.absolute()}: {exc}") from None
    return engine_profile_from_measured(profile, field)
