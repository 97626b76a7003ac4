"""Calibrate the simulator's linear step model (a CPU engine) on a measured profile, and predict held-back rates.

A CPU engine serving a small model is overhead bound, not bandwidth bound: a step costs a fixed overhead plus a
cost per prefill token, per running sequence and per token of the running sequences' context
(``EngineProfile.step_per_*``, used by ``PerfModel`` in place of the roofline), and each request spends a fixed time
outside the steps (``request_frontend_s``: the API server's processing, added to TTFT). The five coefficients are
fitted by SciPy least squares with the simulator's own replay in the loop: each residual is log(the replay's
figure / the measured one) at a fitted (workload, rate) point, so queueing and the mixing of prefills into decode
steps at higher rates come from the replay's scheduler, not from the fit. The figures fitted are what the caller
gives (``Observation``): the engine's own TTFT/TPOT means (``bench_calibration``'s default) or the stored p50s.

The fitted coefficients travel with the measured profile as facts (``FACT_NAMES``); the simulator's
``engine_profile.engine_profile_from_measured`` turns such a profile back into an ``EngineProfile``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from greenserve.profiler.method import resolve
from greenserve.profiler.sim_backend import simulate_point
from greenserve.simulator.engine_profile import FACT_NAMES, EngineProfile, base_profile, with_coefficients
from greenserve.v1 import common_pb2, profiler_pb2

__all__ = ["Observation", "StepFit", "fit_step_model", "predict", "with_fitted_facts"]

# seconds: step overhead, per prefill token, per sequence, per context token, per request outside the steps
_X0 = np.array([1.5e-3, 2.5e-5, 2e-4, 1e-7, 1e-3])
_LOWER = np.array([1e-6, 1e-9, 1e-7, 0.0, 0.0])
_UPPER = np.array([0.1, 1e-2, 0.1, 1e-4, 1.0])

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
