"""Calibration recovers known parameters from synthetic measured points."""

from __future__ import annotations

import numpy as np
import pytest
from greenserve.simulator.calibration import (
    DecodePoint,
    PowerPoint,
    PrefillPoint,
    calibrate,
)
from greenserve.simulator.engine_profile import DEFAULT_PROFILE, load_profile
from greenserve.simulator.perf_model import PerfModel


def test_recovers_known_parameters_from_noisy_synthetic_points() -> None:
    base = load_profile(DEFAULT_PROFILE)
    truth = base.with_overrides(prefill_mfu=0.31, decode_mbu=0.58, step_overhead_s=0.0072, idle_w=71.0, max_w=377.0)
    model = PerfModel(truth)
    rng = np.random.default_rng(7)
    def noise() -> float:
        return 1.0 + rng.normal(0, 0.003)

    prefill = [PrefillPoint(n, model.prefill_time_s(n) * noise()) for n in (256, 512, 1024, 2048, 4096, 8192)]
    decode = [DecodePoint(b, b * ctx, model.decode_step_time_s(b, b * ctx) * noise())
              for b in (1, 4, 16, 64) for ctx in (500, 2000)]
    power = [PowerPoint(u, model.power_w(u) * noise()) for u in (0.0, 0.25, 0.5, 0.75, 1.0)]
    report = calibrate(base, prefill=prefill, decode=decode, power=power, label="synthetic test points")
    got = report.profile
    assert got.prefill_mfu == pytest.approx(0.31, rel=0.03)
    assert got.decode_mbu == pytest.approx(0.58, rel=0.03)
    assert got.step_overhead_s == pytest.approx(0.0072, rel=0.1)
    assert got.idle_w == pytest.approx(71.0, rel=0.03)
    assert got.max_w == pytest.approx(377.0, rel=0.03)
    assert got.calibrated_from == "synthetic test points"
    assert "calibrated" in got.sources["prefill_mfu"]
    assert report.rms_relative_error["decode"] < 0.01
    # the datasheet part is untouched
    assert got.peak_flops == base.peak_flops and got.name == base.name


def test_only_constrained_parameters_move() -> None:
    base = load_profile(DEFAULT_PROFILE)
    truth = PerfModel(base.with_overrides(idle_w=90.0, max_w=350.0))
    report = calibrate(base, power=[PowerPoint(u, truth.power_w(u)) for u in (0.0, 1.0)])
    assert set(report.fitted) == {"idle_w", "max_w"}
    assert report.profile.prefill_mfu == base.prefill_mfu
    assert report.profile.idle_w == pytest.approx(90.0, rel=1e-4)


def test_bad_points_are_rejected() -> None:
    base = load_profile(DEFAULT_PROFILE)
    with pytest.raises(ValueError, match="prefill"):
        calibrate(base)
    with pytest.raises(ValueError, match="decode"):
        calibrate(base, decode=[DecodePoint(0, 10, 0.01)])
    with pytest.raises(ValueError, match="power"):
        calibrate(base, power=[PowerPoint(1.5, 100.0)])
