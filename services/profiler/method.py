"""The sweep method with its defaults filled in (GreenLLM Sec. V-A, GreenCache Sec. 5.2)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from greenserve.profiler.points import DEFAULT_CI_G_PER_KWH
from greenserve.v1 import common_pb2, profiler_pb2

DEFAULT_ENGINE_WARMUP_S = 20.0  # GreenLLM: 20 s warm-up before each 2-minute run
DEFAULT_POINT_DURATION_S = 120.0  # GreenLLM: 2-minute profiling runs
DEFAULT_POWER_INTERVAL_S = 0.2  # GreenLLM: pynvml every 200 ms
DEFAULT_REQUEST_TIMEOUT_S = 120.0
SIMULATOR_WARMUP_FRACTION = 0.1


@dataclass(frozen=True)
class Method:
    warmup_s: float
    point_duration_s: float
    requests_per_point: int
    power_interval_s: float
    stop_below_target: bool
    cache_prefill_requests: int
    ci_g_per_kwh: float
    arrival: str
    request_timeout_s: float

    def measured_requests(self, rate_per_s: float) -> int:
        """Requests measured at a rate: the method's count, else rate x window (at least 1)."""
        if self.requests_per_point:
            return self.requests_per_point
        return max(1, math.ceil(rate_per_s * self.point_duration_s))

    def warmup_requests(self, rate_per_s: float) -> int:
        return math.ceil(rate_per_s * self.warmup_s)

    def prefill_requests(self, rate_per_s: float, config: common_pb2.ProfileConfig) -> int:
        """Requests sent before the warm-up to fill the cache (GreenCache measures on a cache filled first): the
        method's count, else one measurement window's worth for a configuration with a cache size, else none."""
        if self.cache_prefill_requests:
            return self.cache_prefill_requests
        if config.cache_dram_bytes or config.cache_disk_bytes:
            return self.measured_requests(rate_per_s)
        return 0


def resolve(spec: profiler_pb2.SweepSpec) -> Method:
    """Defaults applied to the spec's method (the spec itself was validated)."""
    m = spec.method
    duration = spec.point_duration_s or DEFAULT_POINT_DURATION_S
    if m.warmup_s:
        warmup = m.warmup_s
    elif spec.backend == profiler_pb2.SWEEP_BACKEND_SIMULATOR:
        warmup = SIMULATOR_WARMUP_FRACTION * duration
    else:
        warmup = DEFAULT_ENGINE_WARMUP_S
    return Method(
        warmup_s=warmup,
        point_duration_s=duration,
        requests_per_point=m.requests_per_point,
        power_interval_s=m.power_interval_s or DEFAULT_POWER_INTERVAL_S,
        stop_below_target=m.stop_rule != common_pb2.LADDER_STOP_RULE_FULL_LADDER,
        cache_prefill_requests=m.cache_prefill_requests,
        ci_g_per_kwh=m.carbon_intensity_g_per_kwh or DEFAULT_CI_G_PER_KWH,
        arrival=m.arrival or "poisson",
        request_timeout_s=m.request_timeout_s or DEFAULT_REQUEST_TIMEOUT_S,
    )


def as_proto(method: Method) -> common_pb2.ProfileMethod:
    """The method as stored with a profile (defaults made explicit)."""
    return common_pb2.ProfileMethod(
        warmup_s=method.warmup_s, requests_per_point=method.requests_per_point,
        power_interval_s=method.power_interval_s,
        stop_rule=(common_pb2.LADDER_STOP_RULE_STOP_BELOW_TARGET if method.stop_below_target
                   else common_pb2.LADDER_STOP_RULE_FULL_LADDER),
        cache_prefill_requests=method.cache_prefill_requests, carbon_intensity_g_per_kwh=method.ci_g_per_kwh,
        arrival=method.arrival, request_timeout_s=method.request_timeout_s)
