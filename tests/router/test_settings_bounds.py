"""Router flags without an upper bound must still be finite numbers, and the power and carbon-intensity
defaults are bounded like the figures RegisterEngine and the optimizer accept (found by an adversarial audit
of the router's flags: --default-busy-power-w inf or --fallback-ci-g-per-kwh inf started a router on which
every unary request then answered 500 and every stream broke off, the receipt's carbon model refusing the
non-finite figure per request; 1e308 W filled receipts with 1e301 g of carbon)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from greenserve.router.settings import RouterSettings
from pydantic import ValidationError

UNBOUNDED = ["plan_weight", "load_weight", "prefix_weight", "session_weight", "bounded_load_factor",
             "bounded_load_slack", "grpc_stream_messages_per_s", "affinity_weight", "affinity_queue_slack",
             "ci_refresh_s", "load_feed_interval_s", "access_feed_interval_s", "fallback_ci_g_per_kwh",
             "default_busy_power_w", "default_idle_power_w"]


@pytest.mark.parametrize("name", UNBOUNDED)
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_a_flag_must_be_a_finite_number(name: str, value: float) -> None:
    with pytest.raises(ValidationError, match=name):
        RouterSettings(**{name: value})


@pytest.mark.parametrize("name,value", [("default_busy_power_w", 1e6 + 1), ("default_idle_power_w", 1e308),
                                        ("fallback_ci_g_per_kwh", 1e4 + 1)])
def test_power_and_ci_defaults_are_bounded(name: str, value: float) -> None:
    with pytest.raises(ValidationError, match=name):
        RouterSettings(**{name: value})
    RouterSettings(**{name: value / 2 if value < 1e300 else 1e6})


def test_the_command_line_refuses_an_infinite_power(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "greenserve.router", "--default-busy-power-w", "inf",
                           "--http-port", "-1", "--port", "0", "--data-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "--default-busy-power-w" in proc.stderr and "Traceback" not in proc.stderr
