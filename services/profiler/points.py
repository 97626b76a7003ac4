"""One measurement point from per-request latencies: the same arithmetic for the engine and simulator backends.

Attainment counts every offered request: a request that failed or never finished misses both targets
(GreenCache Eq. 6's two constraints are reported apart, then together). A one-token request has no TPOT and
meets the TPOT target trivially. Energy per request and per token are the window's energy (mean power x the
span from the first measured arrival to the last measured completion) shared over what completed, so idle
power in the window is charged to the requests, as GreenLLM's per-token carbon (Eq. 3, operational part) does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from greenserve.common import carbon
from greenserve.common.carbon_units import energy_kwh_from_j
from greenserve.v1 import common_pb2

DEFAULT_CI_G_PER_KWH = 261.0  # GreenLLM Sec. V-A: CISO grid default


@dataclass
class RequestSamples:
    """Per measured request; NaN latencies where the request did not complete."""

    arrival_s: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    output_tokens: np.ndarray
    prompt_tokens: np.ndarray

    @property
    def completed(self) -> np.ndarray:
        return np.isfinite(self.e2e_s)


KV_CONNECTOR_STATES = {"none": common_pb2.KV_CONNECTOR_STATE_NONE, "working": common_pb2.KV_CONNECTOR_STATE_WORKING,
                       "unknown": common_pb2.KV_CONNECTOR_STATE_UNKNOWN,
                       "degraded": common_pb2.KV_CONNECTOR_STATE_DEGRADED}


@dataclass
class PointExtras:
    """What the backend measured besides latencies."""

    power_w: float = math.nan
    power_source: str = ""
    cache_hit_fraction: float = math.nan
    mean_batch_size: float = math.nan
    kv_connector: str = ""  # engine_metrics.kv_connector_verdict of the window; empty: not measured


def _pct(values: np.ndarray, q: float) -> float:
    v = values[np.isfinite(values)]
    return float(np.percentile(v, q)) if len(v) else math.nan


def summarize(rate_per_s: float, samples: RequestSamples, slo: common_pb2.Slo, extras: PointExtras, *,
              ci_g_per_kwh: float = DEFAULT_CI_G_PER_KWH) -> common_pb2.ProfilePoint:
    """The ProfilePoint of one rate. Quantities that could not be measured stay 0 (proto default) and the
    point's ``requests``/``failed_requests`` say how many requests it stands on."""
    n = len(samples.e2e_s)
    done = samples.completed
    n_done = int(done.sum())
    ok_ttft = np.nan_to_num(samples.ttft_s, nan=math.inf) <= slo.ttft_s
    tpot = np.where(samples.output_tokens <= 1, 0.0, np.nan_to_num(samples.tpot_s, nan=math.inf))
    ok_tpot = (tpot <= slo.tpot_s) & done
    both = ok_ttft & ok_tpot & done
    point = common_pb2.ProfilePoint(request_rate_per_s=rate_per_s, requests=n, failed_requests=n - n_done)
    if n:
        point.slo_attainment_fraction = float(both.mean())
        point.ttft_slo_attainment_fraction = float((ok_ttft & done).mean())
        point.tpot_slo_attainment_fraction = float(ok_tpot.mean())
    point.below_slo_target = bool(n == 0 or point.slo_attainment_fraction < slo.attainment_fraction)
    point.kv_connector_state = KV_CONNECTOR_STATES.get(extras.kv_connector, common_pb2.KV_CONNECTOR_STATE_UNSPECIFIED)
    values = {
        "ttft_p50_s": _pct(samples.ttft_s, 50), "ttft_p90_s": _pct(samples.ttft_s, 90),
        "ttft_p99_s": _pct(samples.ttft_s, 99), "tpot_p50_s": _pct(samples.tpot_s, 50),
        "tpot_p90_s": _pct(samples.tpot_s, 90), "tpot_p99_s": _pct(samples.tpot_s, 99),
        "e2e_p50_s": _pct(samples.e2e_s, 50), "e2e_p95_s": _pct(samples.e2e_s, 95),
        "e2e_p99_s": _pct(samples.e2e_s, 99),
        "ttft_mean_s": float(np.nanmean(samples.ttft_s)) if np.isfinite(samples.ttft_s).any() else math.nan,
        "tpot_mean_s": float(np.nanmean(samples.tpot_s)) if np.isfinite(samples.tpot_s).any() else math.nan,
        "cache_hit_fraction": extras.cache_hit_fraction, "mean_batch_size": extras.mean_batch_size,
    }
    span = math.nan
    if n_done:
        start = float(np.min(samples.arrival_s))
        end = float(np.max((samples.arrival_s + samples.e2e_s)[done]))
        span = max(end - start, 1e-9)
        out_tokens = float(samples.output_tokens[done].sum())
        values["throughput_requests_per_s"] = n_done / span
        values["throughput_output_tokens_per_s"] = out_tokens / span
        values["duration_s"] = span
        if math.isfinite(extras.power_w):
            energy_j = extras.power_w * span
            values["power_w"] = extras.power_w
            values["energy_per_request_kwh"] = energy_kwh_from_j(energy_j=energy_j / n_done)
            if out_tokens:
                values["energy_per_output_token_j"] = energy_j / out_tokens
                values["carbon_per_output_token_g"] = carbon.operational_g(
                    energy_kwh=energy_kwh_from_j(energy_j=energy_j / out_tokens), ci_g_per_kwh=ci_g_per_kwh)
            point.power_source = extras.power_source
    for name, value in values.items():
        if value is not None and math.isfinite(value):
            setattr(point, name, max(float(value), 0.0))
    return point
