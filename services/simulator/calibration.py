"""Fit a profile's efficiency and power parameters to measured points (SciPy least squares).

The datasheet numbers (peak FLOP/s, bandwidth, memory) stay fixed; what a measurement can pin down are the
achieved efficiencies and the power envelope:

* ``prefill_mfu`` and ``step_overhead_s`` from TTFT points (uncached tokens, batch size, cached tokens -> s),
* ``decode_mbu`` (and the overhead again) from TPOT points (batch size, total context tokens -> s),
* ``idle_w`` and ``max_w`` from power points (utilisation -> W), e.g. pynvml samples at known load.

Residuals are relative (``model / observed - 1``) so that a 20 ms TPOT and a 2 s TTFT weigh alike. The result
is a new ``EngineProfile`` whose ``calibrated_from`` names the data and whose ``sources`` say "calibrated".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from greenserve.simulator.engine_profile import EngineProfile
from greenserve.simulator.perf_model import PerfModel
from scipy.optimize import least_squares

__all__ = ["CalibrationReport", "DecodePoint", "PowerPoint", "PrefillPoint", "calibrate"]


@dataclass(frozen=True)
class PrefillPoint:
    """A measured prefill: ``uncached_tokens`` computed in one step (``batch_size`` sequences) took ``time_s``."""

    uncached_tokens: int
    time_s: float
    batch_size: int = 1
    cached_tokens: int = 0


@dataclass(frozen=True)
class DecodePoint:
    """A measured decode step: ``batch_size`` sequences with ``total_context_tokens`` took ``time_s``."""

    batch_size: int
    total_context_tokens: int
    time_s: float


@dataclass(frozen=True)
class PowerPoint:
    """A measured engine power draw ``power_w`` at ``utilisation`` in [0, 1]."""

    utilisation: float
    power_w: float


@dataclass(frozen=True)
class CalibrationReport:
    """The calibrated profile, the fitted values and the fit quality (RMS relative error per kind)."""

    profile: EngineProfile
    fitted: dict[str, float]
    rms_relative_error: dict[str, float] = field(default_factory=dict)


_FITTABLE = ("prefill_mfu", "decode_mbu", "step_overhead_s", "idle_w", "max_w")
_BOUNDS = {"prefill_mfu": (1e-3, 1.0), "decode_mbu": (1e-3, 1.0), "step_overhead_s": (0.0, 1.0),
           "idle_w": (0.0, 1e5), "max_w": (0.0, 1e5)}


def _validate(points: Sequence[object], kind: type, name: str) -> None:
    for p in points:
        if not isinstance(p, kind):
            raise ValueError(f"{name}: every point must be a {kind.__name__}")
    if name == "prefill":
        for p in points:
            if p.uncached_tokens < 1 or p.batch_size < 1 or p.cached_tokens < 0 or not p.time_s > 0:  # type: ignore[attr-defined]
                raise ValueError("prefill: uncached_tokens and batch_size must be >= 1, time_s > 0")
    elif name == "decode":
        for p in points:
            if p.batch_size < 1 or p.total_context_tokens < 0 or not p.time_s > 0:  # type: ignore[attr-defined]
                raise ValueError("decode: batch_size must be >= 1, total_context_tokens >= 0, time_s > 0")
    else:
        for p in points:
            if not 0.0 <= p.utilisation <= 1.0 or not p.power_w > 0:  # type: ignore[attr-defined]
                raise ValueError("power: utilisation must be in [0, 1] and power_w > 0")


def calibrate(profile: EngineProfile, *, prefill: Sequence[PrefillPoint] = (), decode: Sequence[DecodePoint] = (),
              power: Sequence[PowerPoint] = (), label: str = "measured profile") -> CalibrationReport:
    """Fit the parameters the given points constrain and return a new profile.

    TTFT points fit ``prefill_mfu`` (+ overhead), TPOT points ``decode_mbu`` (+ overhead), power points
    ``idle_w`` and ``max_w``. With no points of a kind, its parameters keep their data-file values.
    Raises ``ValueError`` when no points are given or a point is out of range.
    """
    _validate(prefill, PrefillPoint, "prefill")
    _validate(decode, DecodePoint, "decode")
    _validate(power, PowerPoint, "power")
    if not (prefill or decode or power):
        raise ValueError("prefill: give at least one measured point (prefill, decode or power)")

    names: list[str] = []
    if prefill:
        names.append("prefill_mfu")
    if decode:
        names.append("decode_mbu")
    if prefill or decode:
        names.append("step_overhead_s")
    if power:
        names += ["idle_w", "max_w"]
    x0 = np.array([getattr(profile, n) for n in names], dtype=np.float64)
    lo = np.array([_BOUNDS[n][0] for n in names])
    hi = np.array([_BOUNDS[n][1] for n in names])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
    scale = np.where(x0 > 0, x0, 1e-3)

    def build(x: np.ndarray) -> EngineProfile:
        values = dict(zip(names, (float(v) for v in x)))
        if "max_w" in values and values["max_w"] < values.get("idle_w", profile.idle_w):
            values["max_w"] = values.get("idle_w", profile.idle_w)
        return profile.with_overrides(**values)

    def residuals(x: np.ndarray) -> np.ndarray:
        model = PerfModel(build(x))
        res = [model.prefill_time_s(p.uncached_tokens, p.batch_size, p.cached_tokens) / p.time_s - 1.0 for p in prefill]
        res += [model.decode_step_time_s(p.batch_size, p.total_context_tokens) / p.time_s - 1.0 for p in decode]
        res += [model.power_w(p.utilisation) / p.power_w - 1.0 for p in power]
        return np.asarray(res, dtype=np.float64)

    fit = least_squares(residuals, x0, bounds=(lo, hi), x_scale=scale, method="trf", xtol=1e-12, ftol=1e-12,
                        gtol=1e-12, max_nfev=2000)
    fitted = dict(zip(names, (float(v) for v in fit.x)))
    calibrated = build(fit.x)
    sources = dict(calibrated.sources)
    for n in names:
        sources[n] = f"calibrated by least squares to {label}"
    calibrated = calibrated.with_overrides(calibrated_from=label, sources=sources)
    r = residuals(fit.x)
    n_pre, n_dec = len(prefill), len(decode)
    rms: dict[str, float] = {}
    for kind, part in (("prefill", r[:n_pre]), ("decode", r[n_pre:n_pre + n_dec]), ("power", r[n_pre + n_dec:])):
        if len(part):
            rms[kind] = float(np.sqrt(np.mean(part ** 2)))
    return CalibrationReport(calibrated, fitted, rms)
