"""Calibrate the simulator's linear step model (a CPU engine) on a measured profile, and predict held-back rates.

A CPU engine serving a small model is overhead bound, not bandwidth bound: a step costs a fixed overhead plus a
cost per prefill token, per running sequence and per token of the running sequences' context
(``EngineProfile.step_per_*``, used by ``PerfModel`` in place of the roofline), and each request spends a fixed time
outside the steps (``request_frontend_s``: the API server's processing, added to TTFT). The five coefficients are
fitted by SciPy least squares with the simulator's own replay in the loop: each residual is log(the replay's
figure / the measured one) at a fitted (workload, rate) point, so queueing and the mixing of prefills into decode
steps at higher rates come from the replay's scheduler, not from the fit. The figures fitted are what the caller
gives (``Observation``): the engine's own TTFT/TPOT means (``bench_calibration``'s default) or the stored p50s.

The fitted coefficients travel with the measured profile as facts (``FACT_NAMES``);
``engine_profile_from_measured`` turns such a profile back into the simulator's ``EngineProfile``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from google.protobuf import json_format
from scipy.optimize import least_squares

from greenserve.profiler.method import resolve
from greenserve.profiler.sim_backend import simulate_point
from greenserve.simulator.engine_profile import DATA_FILE, EngineProfile, list_profiles, load_profile
from greenserve.v1 import common_pb2, profiler_pb2

__all__ = ["FACT_NAMES", "Observation", "StepFit", "engine_profile_from_file", "engine_profile_from_measured",
           "fit_step_model", "predict", "tiny_llama_cpu_profile", "with_fitted_facts"]

FACT_NAMES: tuple[str, ...] = ("step_overhead_s", "step_per_prefill_token_s", "step_per_sequence_s",
                               "step_per_context_token_s", "request_frontend_s")
"""The step model's coefficients, as facts of a measured profile and fields of ``EngineProfile``."""

# seconds: step overhead, per prefill token, per sequence, per context token, per request outside the steps
_X0 = np.array([1.5e-3, 2.5e-5, 2e-4, 1e-7, 1e-3])
_LOWER = np.array([1e-6, 1e-9, 1e-7, 0.0, 0.0])
_UPPER = np.array([0.1, 1e-2, 0.1, 1e-4, 1.0])

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


@dataclass(frozen=True)
class StepFit:
    """The fitted coefficients (seconds), the calibrated profile and the residuals at the fitted points."""

    coefficients: dict[str, float]
    profile: EngineProfile
    rms_relative_error: float
    points: int


def _spec(profile: common_pb2.Profile, rates: Sequence[float], seed: int) -> profiler_pb2.SweepSpec:
    """The simulator sweep that replays what ``profile`` measured: same workload, rates, window, warm-up, seed."""
    config = profile.config
    window = max((p.duration_s for p in profile.points), default=20.0) or 20.0
    return profiler_pb2.SweepSpec(
        backend=profiler_pb2.SWEEP_BACKEND_SIMULATOR, workload=config.workload, request_rates_per_s=list(rates),
        point_duration_s=round(window), seed=seed, slo=profile.slo,
        configs=[common_pb2.ProfileConfig(model=config.model, hardware=config.hardware, workload=config.workload)],
        method=common_pb2.ProfileMethod(warmup_s=profile.method.warmup_s or 4.0,
                                        stop_rule=common_pb2.LADDER_STOP_RULE_FULL_LADDER))


def predict(profile: common_pb2.Profile, engine: EngineProfile, rates: Iterable[float],
            seed: int = 11) -> dict[float, common_pb2.ProfilePoint]:
    """The simulator's points for ``profile``'s workload at ``rates`` on ``engine`` (the replay)."""
    rates = sorted(set(rates))
    spec = _spec(profile, rates, seed)
    method = resolve(spec)
    return {r: simulate_point(spec.configs[0], r, spec, method, engine) for r in rates}


@dataclass(frozen=True)
class Observation:
    """One measured figure of ``profile``'s workload at ``rate_per_s``: ``quantity`` is a ``ProfilePoint`` field the
    replay also fills (``ttft_p50_s``, ``tpot_p50_s``, ``ttft_mean_s``, ``tpot_mean_s``), ``value_s`` > 0."""

    profile: common_pb2.Profile
    rate_per_s: float
    quantity: str
    value_s: float


def fit_step_model(observations: Sequence[Observation], *, base: EngineProfile | None = None, seed: int = 11,
                   label: str = "measured profile") -> StepFit:
    """Least-squares fit of the step model to ``observations`` (the same engine, one profile per workload), the
    replay predicting each; residuals are log(predicted / measured), so that a figure 2x too high and one 2x too
    low weigh alike. ValueError when there is none or a measured value is not positive."""
    if not observations:
        raise ValueError("observations: no measured point to fit")
    for i, o in enumerate(observations):
        if not (o.value_s > 0 and math.isfinite(o.value_s)):
            raise ValueError(f"observations[{i}].value_s: {o.quantity} at {o.rate_per_s:g} req/s must be > 0")
    base = base or base_profile(observations[0].profile.config)
    profiles: list[common_pb2.Profile] = []
    for o in observations:
        if not any(o.profile is p for p in profiles):
            profiles.append(o.profile)

    def build(x: np.ndarray) -> EngineProfile:
        return with_coefficients(base, dict(zip(FACT_NAMES, (float(v) for v in x))), label)

    def residuals(x: np.ndarray) -> np.ndarray:
        engine = build(x)
        out = []
        for profile in profiles:
            mine = [o for o in observations if o.profile is profile]
            predicted = predict(profile, engine, {o.rate_per_s for o in mine}, seed)
            out += [math.log(getattr(predicted[o.rate_per_s], o.quantity) / o.value_s) for o in mine]
        return np.asarray(out)

    fit = least_squares(residuals, _X0, bounds=(_LOWER, _UPPER), x_scale=_X0 + 1e-8, loss="linear",
                        diff_step=0.05, max_nfev=200)
    r = residuals(fit.x)
    return StepFit(dict(zip(FACT_NAMES, (float(v) for v in fit.x))), build(fit.x), float(np.sqrt(np.mean(r ** 2))),
                   len(observations))


def with_fitted_facts(profile: common_pb2.Profile, fit: StepFit, citation: str) -> common_pb2.Profile:
    """A copy of the measured ``profile`` carrying the fitted coefficients as facts (others' facts kept)."""
    out = common_pb2.Profile()
    out.CopyFrom(profile)
    keep = [f for f in out.facts if f.name not in FACT_NAMES]
    del out.facts[:]
    out.facts.extend(keep)
    for name in FACT_NAMES:
        out.facts.add(name=name, value=fit.coefficients[name], citation=citation)
    return out


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
    except (OSError, UnicodeDecodeError, json_format.ParseError) as exc:
        raise ValueError(f"{field}: cannot read a profile from {path.name}: {exc}") from None
    return engine_profile_from_measured(profile, field)
