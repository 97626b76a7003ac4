"""Validation of a SweepSpec: every rule names the field it checks (INVALID_ARGUMENT), and what the machine lacks
(a trace file) is a FAILED_PRECONDITION. Nothing is stored before the whole spec passed."""

from __future__ import annotations

import math
from urllib.parse import urlparse

from greenserve.common.errors import FailedPrecondition, InvalidArgument
from greenserve.profiler import mode_config, sim_backend, workload_catalog
from greenserve.profiler.keys import check_config
from greenserve.profiler.method import resolve
from greenserve.v1 import common_pb2, profiler_pb2

MAX_POINTS = 100_000
MAX_POINT_DURATION_S = 3600.0
MAX_REQUESTS_PER_POINT = 1_000_000  # measured, and warm-up, requests of one point


def _finite_at_least(value: float, field: str, minimum: float = 0.0, maximum: float = math.inf) -> None:
    if not math.isfinite(value) or value < minimum or value > maximum:
        bound = f"in [{minimum:g}, {maximum:g}]" if math.isfinite(maximum) else f">= {minimum:g}"
        raise InvalidArgument(field, f"must be a finite number {bound}, got {value}")


def validate(spec: profiler_pb2.SweepSpec, field: str = "spec") -> None:
    """Raise InvalidArgument / FailedPrecondition naming the first bad field of ``spec``."""
    if spec.backend not in (profiler_pb2.SWEEP_BACKEND_ENGINE, profiler_pb2.SWEEP_BACKEND_SIMULATOR):
        raise InvalidArgument(f"{field}.backend", "must be SWEEP_BACKEND_ENGINE or SWEEP_BACKEND_SIMULATOR")
    if not spec.configs:
        raise InvalidArgument(f"{field}.configs", "a sweep needs at least one configuration")
    for i, config in enumerate(spec.configs):
        where = f"{field}.configs[{i}]"
        try:
            check_config(config, where)
            mode_config.check_mode(config, where)
            if spec.backend == profiler_pb2.SWEEP_BACKEND_SIMULATOR:
                sim_backend.check_config(config, where)
        except ValueError as exc:
            name, _, message = str(exc).partition(": ")
            raise InvalidArgument(name, message) from None
        if spec.backend == profiler_pb2.SWEEP_BACKEND_ENGINE and spec.engine_url and mode_config.is_mode_config(config):
            raise FailedPrecondition("an engine at spec.engine_url cannot be restarted in SpecDecode / DPD / DSD "
                                     "mode: leave engine_url empty so that the profiler starts an engine in each "
                                     "configuration's mode (its engine launcher), or use SWEEP_BACKEND_SIMULATOR",
                                     field=f"{where}.serving_mode")
    if not spec.request_rates_per_s:
        raise InvalidArgument(f"{field}.request_rates_per_s", "a sweep needs at least one request rate")
    previous = 0.0
    for i, rate in enumerate(spec.request_rates_per_s):
        where = f"{field}.request_rates_per_s[{i}]"
        if not math.isfinite(rate) or rate <= 0:
            raise InvalidArgument(where, f"must be a finite rate > 0 requests/s, got {rate}")
        if rate <= previous:
            raise InvalidArgument(where, "rates must be strictly ascending (the ladder climbs them in order)")
        previous = rate
    if len(spec.configs) * len(spec.request_rates_per_s) > MAX_POINTS:
        raise InvalidArgument(f"{field}.request_rates_per_s", f"at most {MAX_POINTS} points (configs x rates)")
    if spec.seed < 0:  # the workload samplers (numpy) take non-negative seeds only: else every point fails
        raise InvalidArgument(f"{field}.seed", f"must be >= 0, got {spec.seed}")
    if not spec.workload:
        raise InvalidArgument(f"{field}.workload", f"required; known: {', '.join(workload_catalog.WORKLOADS)}")
    try:
        workload_catalog.check_workload(spec.workload, spec.method.arrival or "poisson")
    except workload_catalog.WorkloadUnavailable as exc:
        raise FailedPrecondition(str(exc), field=f"{field}.workload") from None
    except ValueError as exc:
        bad = f"{field}.method.arrival" if "arrival" in str(exc) else f"{field}.workload"
        raise InvalidArgument(bad, str(exc)) from None
    if not spec.HasField("slo"):
        raise InvalidArgument(f"{field}.slo", "required (ttft_s, tpot_s, attainment_fraction)")
    _finite_at_least(spec.slo.ttft_s, f"{field}.slo.ttft_s", 1e-9)
    _finite_at_least(spec.slo.tpot_s, f"{field}.slo.tpot_s", 1e-9)
    _finite_at_least(spec.slo.attainment_fraction, f"{field}.slo.attainment_fraction", 1e-9, 1.0)
    _finite_at_least(spec.point_duration_s, f"{field}.point_duration_s", 0.0, MAX_POINT_DURATION_S)
    m = spec.method
    if m.stop_rule not in common_pb2.LadderStopRule.values():
        raise InvalidArgument(f"{field}.method.stop_rule", f"unknown value {m.stop_rule}")
    _finite_at_least(m.warmup_s, f"{field}.method.warmup_s", 0.0, MAX_POINT_DURATION_S)
    _finite_at_least(m.power_interval_s, f"{field}.method.power_interval_s", 0.0, 10.0)
    _finite_at_least(m.carbon_intensity_g_per_kwh, f"{field}.method.carbon_intensity_g_per_kwh", 0.0, 1e5)
    _finite_at_least(m.request_timeout_s, f"{field}.method.request_timeout_s", 0.0, MAX_POINT_DURATION_S)
    if m.requests_per_point > 1_000_000:
        raise InvalidArgument(f"{field}.method.requests_per_point", "at most 1,000,000")
    if m.cache_prefill_requests > 1_000_000:
        raise InvalidArgument(f"{field}.method.cache_prefill_requests", "at most 1,000,000")
    # Without requests_per_point a point's size is rate x duration: bounded as the explicit count is (the simulator
    # builds every request of a point in memory).
    method = resolve(spec)
    for i, rate in enumerate(spec.request_rates_per_s):
        measured, warmup = method.measured_requests(rate), method.warmup_requests(rate)
        if max(measured, warmup) > MAX_REQUESTS_PER_POINT:
            raise InvalidArgument(f"{field}.request_rates_per_s[{i}]",
                                  f"{rate:g} req/s makes {measured} measured and {warmup} warm-up requests per point "
                                  f"(at most {MAX_REQUESTS_PER_POINT:,} each): lower point_duration_s or "
                                  "method.warmup_s, or set method.requests_per_point")
    _finite_at_least(spec.engine_modelled_s_per_wall_s, f"{field}.engine_modelled_s_per_wall_s", 0.0, 1000.0)
    if spec.model_version and spec.backend != profiler_pb2.SWEEP_BACKEND_SIMULATOR:
        raise InvalidArgument(f"{field}.model_version", "a calibrated model version is for the SIMULATOR backend")
    if spec.backend == profiler_pb2.SWEEP_BACKEND_ENGINE:
        try:
            url = urlparse(spec.engine_url)
            url.port  # noqa: B018 - raises ValueError on a port out of 0..65535 or not a number
        except ValueError:  # e.g. "http://[::1" (Invalid IPv6 URL)
            raise InvalidArgument(f"{field}.engine_url", f"must be an http(s) base URL, got {spec.engine_url!r}") from None
        if spec.engine_url and (url.scheme not in ("http", "https") or not url.netloc):
            raise InvalidArgument(f"{field}.engine_url", f"must be an http(s) base URL, got {spec.engine_url!r}")
        if any(c.cache_dram_bytes or c.cache_disk_bytes for c in spec.configs) and not spec.cache_server_id:
            raise InvalidArgument(f"{field}.cache_server_id",
                                  "configurations with cache sizes need the cache-manager server to resize")
