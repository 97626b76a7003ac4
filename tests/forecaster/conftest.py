"""Helpers of the forecaster tests: the data fixtures (slices of public datasets, data/SOURCE.md) and synthetic
hourly series."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from greenserve.forecaster.backtest import limit_native_threads

limit_native_threads(1)

DAY0_S = 1_704_067_200  # 2024-01-01T00:00:00Z


#: Small slices of each public CSV layout the ingestion code reads, and synthetic files where a dataset carries no
#: licence that allows redistribution (data/SOURCE.md says which): the tests run on a clone alone.
FIXTURES_DIR = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return FIXTURES_DIR


def daily_series(days: int, *, base: float = 200.0, amplitude: float = 60.0, noise: float = 0.0,
                 seed: int = 0) -> np.ndarray:
    """Hourly values with a daily cycle (optionally noisy), starting at 00:00."""
    t = np.arange(days * 24)
    rng = np.random.default_rng(seed)
    return base + amplitude * np.sin(2 * np.pi * t / 24) + rng.normal(0, noise, len(t))
