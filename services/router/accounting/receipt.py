"""The carbon receipt of one request, and the carbon intensity (CI) in force per region.

Energy: each engine draws ``P(n)`` watts while ``n`` requests are in flight on it (the engine's
registered idle/busy power, linear in n up to the saturation count; busy power alone when idle power is
unknown; defaults in ``data/router_defaults.toml``). A request is charged its fair share,
``E = integral of P(n(t)) / n(t) dt`` over its lifetime: the per-engine accumulator in engines.py makes
this an O(1) difference of two readings. The mean batch size over the request, for the embodied share
(GreenLLM Eq. 1), is ``integral of n dt / e2e``.

Carbon comes from the shared model, ``greenserve.common.carbon.request_carbon`` (GreenLLM Eq. 1-3):
operational ``E x PUE x CI`` and amortised embodied carbon of the engine's platform divided by the mean
batch size. CI is the forecaster's current value for the pool's region, refreshed in the background
(never fetched on the request path); until it answers, the cited fallback is used.
"""

from __future__ import annotations

import asyncio
import logging
import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import grpc
from greenserve.common import carbon
from greenserve.common.tasks import cancel_and_wait
from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc, router_pb2
from opentelemetry.metrics import NoOpMeter

log = logging.getLogger("greenserve.router.accounting.receipt")


def load_router_defaults() -> dict[str, Any]:
    """The cited defaults of ``data/router_defaults.toml``."""
    text = resources.files("greenserve.router").joinpath("data", "router_defaults.toml").read_text("utf-8")
    return tomllib.loads(text)


@dataclass(frozen=True)
class CarbonSettings:
    """What the receipt needs besides the measurement.

    ``embodied_g_per_s``: the platform's amortised embodied carbon per second of use, from the shared model
    (``Platform.amortised_embodied_g``) once: GreenLLM Eq. 1 is linear in the request's duration, and
    evaluating it per request (validating every component's figures each time) was ~10 us of a request's
    CPU. ``pue`` is checked once here, as ``carbon.operational_g`` would check it per request."""

    params: carbon.CarbonParams
    platform: carbon.Platform
    saturation_requests: int
    slo_ttft_s: float
    slo_tpot_s: float
    embodied_g_per_s: float = field(init=False)
    pue: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "embodied_g_per_s", self.platform.amortised_embodied_g(duration_s=1.0))
        pue = float(self.params.pue)
        if not (math.isfinite(pue) and pue >= 1.0):
            raise ValueError(f"pue must be finite and >= 1, got {self.params.pue!r}")
        object.__setattr__(self, "pue", pue)


@dataclass
class Measurement:
    """What the request path measured for one request."""

    engine_id: str
    pool: str
    ttft_s: float
    e2e_s: float
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    energy_j: float
    busy_slot_s: float
    ci_g_per_kwh: float
    plan_version: int


@dataclass(frozen=True)
class Receipt:
    """A computed receipt; ``to_proto`` and ``to_json`` give its two wire forms."""

    m: Measurement
    tpot_s: float
    energy_kwh: float
    operational_g: float
    embodied_g: float
    slo_met: bool

    @property
    def total_g(self) -> float:
        return self.operational_g + self.embodied_g

    def to_proto(self) -> router_pb2.CarbonReceipt:
        m = self.m
        return router_pb2.CarbonReceipt(
            engine_id=m.engine_id, pool=m.pool, ttft_s=m.ttft_s, tpot_s=self.tpot_s, e2e_s=m.e2e_s,
            prompt_tokens=m.prompt_tokens, cached_prompt_tokens=m.cached_prompt_tokens,
            completion_tokens=m.completion_tokens, energy_kwh=self.energy_kwh, ci_g_per_kwh=m.ci_g_per_kwh,
            carbon=common_pb2.CarbonBreakdown(
                operational_g=self.operational_g, embodied_compute_g=self.embodied_g, embodied_storage_g=0.0,
                total_g=self.total_g, energy_kwh=self.energy_kwh, ci_g_per_kwh=m.ci_g_per_kwh,
            ),
            plan_version=m.plan_version, slo_met=self.slo_met,
        )

    def to_json(self) -> dict[str, Any]:
        """The ``greenserve`` object of HTTP responses (field names as in the proto)."""
        m = self.m
        return {
            "engine_id": m.engine_id, "pool": m.pool, "ttft_s": round(m.ttft_s, 6), "tpot_s": round(self.tpot_s, 6),
            "e2e_s": round(m.e2e_s, 6), "prompt_tokens": m.prompt_tokens,
            "cached_prompt_tokens": m.cached_prompt_tokens, "completion_tokens": m.completion_tokens,
            "energy_kwh": self.energy_kwh, "ci_g_per_kwh": m.ci_g_per_kwh,
            "carbon": {"operational_g": self.operational_g, "embodied_compute_g": self.embodied_g,
                       "embodied_storage_g": 0.0, "total_g": self.total_g},
            "plan_version": m.plan_version, "slo_met": self.slo_met,
        }

    def headers(self) -> dict[str, str]:
        """Response headers carrying the receipt (for non-streamed responses)."""
        return {
            "x-greenserve-engine": self.m.engine_id,
            "x-greenserve-plan-version": str(self.m.plan_version),
            "x-greenserve-ttft-s": f"{self.m.ttft_s:.6f}",
            "x-greenserve-energy-kwh": f"{self.energy_kwh:.9g}",
            "x-greenserve-ci-g-per-kwh": f"{self.m.ci_g_per_kwh:.6g}",
            "x-greenserve-carbon-g": f"{self.total_g:.9g}",
            "x-greenserve-operational-g": f"{self.operational_g:.9g}",
            "x-greenserve-embodied-g": f"{self.embodied_g:.9g}",
            "x-greenserve-slo-met": "true" if self.slo_met else "false",
        }


def compute_receipt(m: Measurement, settings: CarbonSettings, slo: common_pb2.Slo | None = None) -> Receipt:
    """Energy, carbon and SLO verdict of one measured request."""
    tpot = (m.e2e_s - m.ttft_s) / (m.completion_tokens - 1) if m.completion_tokens > 1 else 0.0
    energy_kwh = max(0.0, m.energy_j) / carbon.J_PER_KWH
    mean_batch = max(1.0, m.busy_slot_s / m.e2e_s) if m.e2e_s > 0 else 1.0
    duration_s = max(0.0, m.e2e_s)
    ci = max(0.0, m.ci_g_per_kwh)
    if not math.isfinite(duration_s + energy_kwh + ci + mean_batch):
        # the shared model raises its own ValueError naming the non-finite input
        carbon.request_carbon(duration_s=duration_s, energy_kwh=energy_kwh, ci_g_per_kwh=ci,
                              mean_batch_size=mean_batch, platform=settings.platform, pue=settings.pue)
    # carbon.request_carbon's two terms (GreenLLM Eq. 1-2) with the per-second embodied rate computed once
    # (CarbonSettings); test_receipt_matches_the_shared_carbon_model checks they agree
    operational_g = energy_kwh * settings.pue * ci
    embodied_g = duration_s * settings.embodied_g_per_s / mean_batch
    ttft_slo = slo.ttft_s if slo is not None and slo.ttft_s > 0 else settings.slo_ttft_s
    tpot_slo = slo.tpot_s if slo is not None and slo.tpot_s > 0 else settings.slo_tpot_s
    slo_met = m.ttft_s <= ttft_slo and tpot <= tpot_slo
    return Receipt(m, tpot, energy_kwh, operational_g, embodied_g, slo_met)


class ReceiptMetrics:
    """OTel instruments for what a user watches per request.

    The request path only appends one tuple to a list (``record``); every ``interval_s`` a background
    task hands them to the instruments in slices of ``slice_items`` (``flush`` does it at once, at
    stop). The OTel SDK validates and copies the
    attributes on every call (~30 us per request for six instruments), which was the largest single
    cost of a request's bookkeeping; batching keeps every value and takes it off the request path.
    With a no-op meter (telemetry.py: no metric reader, nothing would ever read the values) nothing is
    queued at all: the flush still cost ~20 us of CPU per request (microbenchmark, 2 engines)."""

    def __init__(self, meter: Any, interval_s: float = 1.0, max_pending: int = 100_000) -> None:
        self.requests = meter.create_counter("greenserve.router.requests", unit="{request}",
                                             description="requests served through the router")
        self.ttft = meter.create_histogram("greenserve.router.ttft", unit="s", description="time to first token")
        self.tpot = meter.create_histogram("greenserve.router.tpot", unit="s", description="time per output token")
        self.carbon = meter.create_histogram("greenserve.router.carbon_per_request", unit="g",
                                             description="gCO2e per request (operational + embodied)")
        self.energy = meter.create_histogram("greenserve.router.energy_per_request", unit="kWh",
                                             description="energy attributed to a request")
        self.carbon_total = meter.create_counter("greenserve.router.carbon", unit="g",
                                                 description="gCO2e of all requests")
        self.plan_version = meter.create_gauge("greenserve.router.plan_version", unit="1",
                                               description="plan version in force") \
            if hasattr(meter, "create_gauge") else None
        self.enabled = not isinstance(meter, NoOpMeter)
        self.interval_s = interval_s
        self.max_pending = max_pending
        self.slice_items = 32
        self.dropped = 0
        self._pending: list[tuple[tuple[str, str, str], float, float, int, float, float, int]] = []
        self._attrs: dict[tuple[str, str, str], dict[str, str]] = {}
        self._task: asyncio.Task[None] | None = None

    def record(self, receipt: Receipt, protocol: str) -> None:
        """Queues one request's values (request path: one tuple append)."""
        if not self.enabled:
            return
        m = receipt.m
        if len(self._pending) >= self.max_pending:
            self.dropped += 1
            return
        self._pending.append(((m.pool, m.engine_id, protocol), m.ttft_s, receipt.tpot_s, m.completion_tokens,
                              receipt.total_g, receipt.energy_kwh, m.plan_version))

    def flush(self) -> int:
        """Records the queued values in the OTel instruments; returns how many."""
        pending, self._pending = self._pending, []
        self._record(pending)
        return len(pending)

    def _record(self, pending: list[tuple[tuple[str, str, str], float, float, int, float, float, int]]) -> None:
        attrs_of = self._attrs
        counts: dict[tuple[str, str, str], list[float]] = {}
        for key, ttft_s, tpot_s, tokens, total_g, energy_kwh, _ in pending:
            attrs = attrs_of.get(key)
            if attrs is None:
                attrs = attrs_of[key] = {"pool": key[0], "engine": key[1], "protocol": key[2]}
            self.ttft.record(ttft_s, attrs)
            if tokens > 1:
                self.tpot.record(tpot_s, attrs)
            self.carbon.record(total_g, attrs)
            self.energy.record(energy_kwh, attrs)
            c = counts.get(key)
            if c is None:
                c = counts[key] = [0.0, 0.0]
            c[0] += 1
            c[1] += total_g
        for key, (n, grams) in counts.items():
            self.requests.add(n, attrs_of[key])
            self.carbon_total.add(grams, attrs_of[key])
        if pending and self.plan_version is not None:
            self.plan_version.set(pending[-1][6])

    def start(self) -> None:
        if self.enabled:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="receipt-metrics")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        self.flush()

    async def _run(self) -> None:
        # In slices, yielding to the event loop between them: one second of requests at 500/s took
        # 11-18 ms to record at once, a stall every request in flight would feel (measured).
        while True:
            await asyncio.sleep(self.interval_s)
            pending, self._pending = self._pending, []
            for i in range(0, len(pending), self.slice_items):
                try:
                    self._record(pending[i : i + self.slice_items])
                except Exception:  # telemetry must never stop routing
                    log.exception("receipt metrics flush failed")
                await asyncio.sleep(0)


class CarbonIntensityCache:
    """CI per region from the forecaster, refreshed in the background every ``refresh_s``."""

    def __init__(self, fallback_g_per_kwh: float, channel: grpc.aio.Channel | None, refresh_s: float = 60.0) -> None:
        self.fallback = fallback_g_per_kwh
        self.values: dict[str, float] = {}
        self.regions: set[str] = set()
        self.refresh_s = refresh_s
        self.failures = 0
        self._stub = forecaster_pb2_grpc.ForecasterServiceStub(channel) if channel is not None else None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def get(self, region: str) -> float:
        value = self.values.get(region)
        if value is not None:
            return value
        if region and region not in self.regions:
            self.regions.add(region)
            self._wake.set()
        return self.fallback

    def start(self) -> None:
        if self._stub is not None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="ci-refresh")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def refresh_once(self) -> None:
        assert self._stub is not None
        for region in sorted(self.regions):
            try:
                reply = await self._stub.GetCurrentCarbonIntensity(
                    forecaster_pb2.GetCurrentCarbonIntensityRequest(region=region), timeout=2.0)
                value = reply.carbon_intensity.ci_g_per_kwh
                if value >= 0:
                    self.values[region] = value
            except grpc.aio.AioRpcError:
                self.failures += 1

    async def _run(self) -> None:
        while True:
            if self.regions:
                await self.refresh_once()
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.refresh_s)
            except TimeoutError:
                pass
