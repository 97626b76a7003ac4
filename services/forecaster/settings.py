"""Settings of greenserve-forecaster: its flags and GREENSERVE_* environment variables."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from greenserve.common.config import DependencyAddresses, ServiceSettings
from greenserve.forecaster.forecast_models import DEFAULT_MODEL, MODELS
from greenserve.forecaster.stream_load import DEFAULT_LATE_S


class ForecasterSettings(ServiceSettings, DependencyAddresses):
    """Flags and GREENSERVE_* env vars of greenserve-forecaster."""

    service_name: ClassVar[str] = "forecaster"

    forecast_model: str = Field(DEFAULT_MODEL, description=f"model of every series: {', '.join(MODELS)}")
    fit_history_hours: int = Field(336, ge=48, le=720, description="hours of history each fit uses (336: 14 days)")
    refit_interval_s: float = Field(3600.0, ge=1.0, description="re-tune (full refit) of each series this often")
    fit_workers: int = Field(1, ge=1, le=64, description="worker processes for fits and backtests")
    max_series: int = Field(1000, ge=1, le=100_000, description="series held (each up to about 2.7 MB with its "
                            "fitted model; a StreamLoad pool makes three): a write that would create one more is "
                            "refused with RESOURCE_EXHAUSTED")
    electricitymaps_url: str | None = Field(None, description="base URL of an Electricity Maps-shaped CI API")
    electricitymaps_token: str | None = Field(None, description="auth-token header value for that API")
    electricitymaps_zones: list[str] = Field(default_factory=list, description="zones to poll, e.g. DE,FR")
    electricitymaps_poll_s: float = Field(900.0, ge=1.0, description="poll interval of the CI API")
    stream_load_max_age_s: float = Field(
        7 * 86_400.0, ge=60.0, le=366 * 86_400.0,
        description="StreamLoad refuses a sample whose time is older than this by the greenserve clock")
    stream_load_max_ahead_s: float = Field(
        300.0, ge=0.0, le=86_400.0,
        description="StreamLoad refuses a sample whose time is further ahead of the greenserve clock than this "
        "(clock skew allowance; a far-future sample would open an hour that every later sample is older than)")
    stream_load_late_s: float = Field(
        DEFAULT_LATE_S, ge=0.0, le=3600.0,
        description="StreamLoad takes late samples of an hour up to this long after the hour ends (several router "
        "workers and replicas report; one may be behind another): the hour is stored once this grace has passed")
    load_holidays: str | None = Field(
        None, description="public holidays of the load series' users, e.g. US or DE (off days like weekends for "
        "the calendar members); CI series take them from their region (US-CAL-CISO: US-CA)")
