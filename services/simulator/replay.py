"""Discrete-event trace replay of an LLM serving fleet in virtual time.

A fleet is a list of engines (each a ``PerfModel`` with its own KV block pool, HBM prefix cache and optional
LMCache DRAM (L1) / disk (L2) tiers), a routing policy, an optional autoscaler and, for prefill/decode
disaggregation, a KV-transfer link. ``replay(workload, fleet)`` returns per-request results and fleet totals.

How an engine is simulated (vLLM V1 continuous batching with chunked prefill):

* A **mixed step** runs whenever requests wait: FCFS from the queue head, each request is admitted if its
  KV reservation (prompt + output, rounded up to blocks) fits the block pool and ``max_num_seqs`` allows,
  its cached prefix is looked up (HBM, then DRAM, then disk) and the read-or-recompute rule of
  ``PerfModel.plan_prefix_reuse`` decides which tiers to reload (Kareto Sec. 3.3, StoreLLM Sec. 3.4); then up
  to ``max_num_batched_tokens`` prefill tokens (minus one per decoding sequence) are computed in the step,
  together with one decode token for every running sequence.
* Between batch-composition changes the engine is in a **decode run**: the time of ``n`` decode steps with a
  fixed batch is a closed-form sum (step time is piecewise linear in the growing context), so a run to the
  next completion is one event, not one per token. A request routed to an engine in a decode run cuts the
  run at the end of the step in progress.
* Bookkeeping is lazy and O(1) per event: a per-engine decode-step counter gives every running request's
  remaining tokens (finish heap keyed by target step), context sums and energy per sequence are running
  accumulators.

Energy: a step's energy is ``power_w(utilisation) x duration``; it is shared by the step's tokens (a
decoding sequence counts one token, a prefill chunk its tokens). Idle engines draw idle power, switched-off
(autoscaled) engines nothing. Carbon per request comes from ``greenserve.common.carbon``.

Simplifications (documented in docs/simulator.md): the full KV reservation is taken at admission (vLLM
allocates on demand and preempts; here nothing is preempted); a decode run's energy uses the utilisation
at its middle context; prefix caching is at the trace's hash-block granularity; LMCache tiers are
write-through at prefill completion and evict by LRU, FIFO or LCS (tiers.py); generated tokens are not cached (LMCache
``save_decode_cache`` default false).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from greenserve.simulator.perf_model import (
    DEFAULT_PROFILE,
    REUSE_RULES,
    EngineProfile,
    PerfModel,
    SpecDecodeConfig,
    load_profile,
)
from greenserve.simulator.replay_routing import (
    LeastLoaded,
    PrefixAffinity,
    RoundRobin,
    RoutingPolicy,
    WeightedRandom,
    make_policy,
)
from greenserve.simulator.tiers import (
    DISK_MEDIA,
    PrefixTiers,
    TierSpec,
    allocated_byte_seconds,
    storage_embodied_g,
)
from greenserve.simulator.workloads import Workload

__all__ = [
    "AutoscaleConfig",
    "EngineSpec",
    "FleetConfig",
    "LeastLoaded",
    "PrefixAffinity",
    "ReplayResult",
    "RoundRobin",
    "RoutingPolicy",
    "WeightedRandom",
    "make_policy",
    "replay",
]

INF = math.inf
_EV_STEP, _EV_TRANSFER, _EV_AUTOSCALE, _EV_READY = 0, 1, 2, 3


# -----------------------------------------------------------------------------------------------------
# Configuration
# -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineSpec:
    """One engine of the fleet.

    ``dram_capacity_tokens`` / ``disk_capacity_tokens``: LMCache L1 / L2 capacity in tokens (0 = tier off).
    ``role``: ``"both"`` (normal), ``"prefill"`` or ``"decode"`` (PD disaggregation).
    ``spec``: speculative decoding on this engine (draft on the same GPU or, disaggregated, elsewhere).
    ``prefix_caching``: vLLM automatic prefix caching in HBM (default on in vLLM V1).
    ``dram_policy`` / ``disk_policy``: eviction of each LMCache tier, ``LRU``, ``FIFO`` or ``LCS`` (tiers.py).
    ``disk_ttl_s`` / ``disk_group_ttls_s``: idle TTLs making the disk tier elastic (tiers.py; LRU only).
    ``disk_medium``: ``nvme``, ``sata-ssd`` or ``hdd`` (tiers.DISK_MEDIA) for the disk's bandwidth and
    latency; empty: the profile's.
    ``reuse_rule``: the read-or-recompute rule for DRAM/disk hits (``perf_model.REUSE_RULES``): ``latency``
    (default), ``always`` (LMCache: load every hit), ``energy`` (StoreLLM: read whenever it saves energy and
    the TTFT stays within ``reuse_delay_budget_s``).
    """

    profile: EngineProfile | str = DEFAULT_PROFILE
    dram_capacity_tokens: int = 0
    disk_capacity_tokens: int = 0
    role: str = "both"
    spec: SpecDecodeConfig | None = None
    prefix_caching: bool = True
    dram_policy: str = "LRU"
    disk_policy: str = "LRU"
    disk_ttl_s: float = 0.0
    disk_group_ttls_s: Mapping[int, float] | None = None
    disk_group_depth: int = 0
    disk_medium: str = ""
    reuse_rule: str = "latency"
    reuse_delay_budget_s: float = math.inf

    def resolved_profile(self) -> EngineProfile:
        """The profile object (loading it by name if needed), with the disk medium's bandwidth if one is named."""
        profile = self.profile if isinstance(self.profile, EngineProfile) else load_profile(self.profile)
        if self.disk_medium:
            bw, lat = DISK_MEDIA[self.disk_medium]
            profile = dataclasses.replace(profile, disk_bandwidth_bytes_per_s=bw, disk_latency_s=lat)
        return profile

    def tier_specs(self) -> tuple[TierSpec, TierSpec]:
        """The LMCache DRAM and disk tiers (ValueError naming the field when one is invalid)."""
        return (TierSpec(self.dram_capacity_tokens, self.dram_policy),
                TierSpec(self.disk_capacity_tokens, self.disk_policy, self.disk_ttl_s, self.disk_group_ttls_s,
                         self.disk_group_depth))


@dataclass(frozen=True)
class AutoscaleConfig:
    """Threshold autoscaler over the fleet: every ``interval_s`` it compares outstanding requests per active
    engine with the thresholds, switches one engine on (routable after ``cold_start_s``) or drains one."""

    min_engines: int = 1
    interval_s: float = 60.0
    scale_up_outstanding: float = 16.0
    scale_down_outstanding: float = 2.0
    cold_start_s: float = 60.0
    initial_engines: int | None = None

    def __post_init__(self) -> None:
        if self.min_engines < 1:
            raise ValueError("min_engines: must be >= 1")
        if self.interval_s <= 0 or self.cold_start_s < 0:
            raise ValueError("interval_s: must be > 0 (cold_start_s >= 0)")
        if self.scale_down_outstanding >= self.scale_up_outstanding:
            raise ValueError("scale_down_outstanding: must be below scale_up_outstanding")


@dataclass(frozen=True)
class FleetConfig:
    """Engines, routing policy (name or object), optional autoscaler, PD link and seed."""

    engines: tuple[EngineSpec, ...]
    policy: Any = "least_loaded"
    autoscale: AutoscaleConfig | None = None
    kv_link_bandwidth_bytes_per_s: float = 2e9
    kv_link_latency_s: float = 0.0005
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.engines:
            raise ValueError("engines: a fleet needs at least one engine")
        roles = {e.role for e in self.engines}
        if not roles <= {"both", "prefill", "decode"}:
            raise ValueError(f"role: must be 'both', 'prefill' or 'decode', got {sorted(roles)}")
        if ("prefill" in roles) != ("decode" in roles):
            raise ValueError("role: a disaggregated fleet needs both prefill and decode engines")
        if "both" in roles and "prefill" in roles:
            raise ValueError("role: do not mix 'both' engines with prefill/decode engines")
        if self.kv_link_bandwidth_bytes_per_s <= 0:
            raise ValueError("kv_link_bandwidth_bytes_per_s: must be > 0")
        for e in self.engines:
            if e.dram_capacity_tokens < 0 or e.disk_capacity_tokens < 0:
                raise ValueError("dram_capacity_tokens: tier capacities must be >= 0")
            if e.disk_medium and e.disk_medium not in DISK_MEDIA:
                raise ValueError(f"disk_medium: must be one of {sorted(DISK_MEDIA)} or empty, got {e.disk_medium!r}")
            if e.reuse_rule not in REUSE_RULES:
                raise ValueError(f"reuse_rule: must be one of {', '.join(REUSE_RULES)}, got {e.reuse_rule!r}")
            if not e.reuse_delay_budget_s > 0:
                raise ValueError("reuse_delay_budget_s: must be > 0")
            e.tier_specs()

    @classmethod
    def uniform(cls, n: int, profile: EngineProfile | str = DEFAULT_PROFILE, *, policy: Any = "least_loaded",
                dram_capacity_tokens: int = 0, disk_capacity_tokens: int = 0, **kwargs: Any) -> FleetConfig:
        """``n`` identical engines."""
        if n < 1:
            raise ValueError("n: must be >= 1")
        spec = EngineSpec(profile, dram_capacity_tokens, disk_capacity_tokens)
        return cls(tuple(spec for _ in range(n)), policy, **kwargs)


# -----------------------------------------------------------------------------------------------------
# Engine
# -----------------------------------------------------------------------------------------------------


class _Engine:
    """Mutable state of one simulated engine (hot path: plain attributes, no properties)."""

    __slots__ = (
        "A",
        "B",
        "S",
        "base_sum",
        "batch_time_sum",
        "block",
        "busy_s",
        "c1",
        "cap_tokens",
        "decoded_tokens",
        "draft_mem_w",
        "draft_span_w",
        "energy_active_j",
        "energy_idle_j",
        "fin_heap",
        "fpt",
        "hash_tokens",
        "hbm_cap_blocks",
        "idle_since",
        "idle_w",
        "idx",
        "line_cache",
        "m1",
        "max_batched",
        "max_seqs",
        "mem_w",
        "n_prefilling",
        "o",
        "on",
        "outstanding",
        "planned",
        "pm",
        "prefilled_tokens",
        "prefix_caching",
        "reuse_budget",
        "reuse_rule",
        "reserved",
        "role",
        "routable",
        "run_c0",
        "run_end",
        "run_n",
        "run_t0",
        "span_w",
        "spec",
        "state",
        "step_extra",
        "steps",
        "tiers",
        "version",
        "w0",
        "waiting",
    )

    def __init__(self, idx: int, spec: EngineSpec, hash_tokens: int, on: bool) -> None:
        profile = spec.resolved_profile()
        pm = PerfModel(profile)
        self.idx = idx
        self.pm = pm
        self.role = spec.role
        self.spec = spec.spec
        self.prefix_caching = spec.prefix_caching
        self.reuse_rule = spec.reuse_rule
        self.reuse_budget = spec.reuse_delay_budget_s
        self.waiting: deque[int] = deque()
        self.state = 0  # 0 idle, 1 mixed step, 2 decode run
        self.version = 0
        self.S = 0
        self.B = 0
        self.base_sum = 0
        self.fin_heap: list[tuple[int, int]] = []
        self.reserved = 0
        self.cap_tokens = pm.kv_cache_tokens()
        self.block = profile.block_size_tokens
        self.outstanding = 0
        self.A = 0.0
        self.energy_active_j = 0.0
        self.energy_idle_j = 0.0
        self.idle_since = 0.0
        self.busy_s = 0.0
        self.run_t0 = self.run_end = 0.0
        self.run_n = 0
        self.run_c0 = 0
        self.planned: list[tuple[int, int]] = []
        self.step_extra = 0.0
        self.tiers = PrefixTiers(hash_tokens, *spec.tier_specs())
        self.hash_tokens = hash_tokens
        self.hbm_cap_blocks = self.cap_tokens // hash_tokens
        self.max_seqs = profile.max_num_seqs
        self.max_batched = profile.max_num_batched_tokens
        self.n_prefilling = 0
        self.on = on
        self.routable = on
        # step-time lines: t(C) = max(w0 + m1 C, o + B fpt + c1 C)
        self.o = pm._overhead_s  # the profile's step overhead plus, on a PCIe TP engine, the all-reduce latencies
        self.w0 = pm._overhead_s + pm._weight_read_s
        self.m1 = pm._kv_bytes_per_token / pm._decode_rate
        self.fpt = pm._flops_per_token / pm._decode_compute_rate
        self.c1 = pm._attn_coeff / pm._decode_compute_rate
        self.line_cache: dict[int, tuple[float, float]] = {}
        self.idle_w = profile.idle_w
        self.span_w = profile.max_w - profile.idle_w
        self.mem_w = profile.memory_power_weight
        # DSD: the draft runs on a GPU of its own, charged its own power: its idle draw whenever the engine is on,
        # its activity during the draft's share of each round; the target's GPU is active only while it verifies.
        self.draft_span_w = self.draft_mem_w = 0.0
        if self.spec is not None and self.spec.disaggregated:
            draft = self.spec.draft
            self.idle_w += draft.idle_w
            self.draft_span_w = draft.max_w - draft.idle_w
            self.draft_mem_w = draft.memory_power_weight
        self.decoded_tokens = 0
        self.prefilled_tokens = 0
        self.steps = 0
        self.batch_time_sum = 0.0

    # -- prefix cache (tiers.py) ----------------------------------------------------------------------
    def cached_prefix_blocks(self, hashes: tuple[int, ...]) -> int:
        return self.tiers.cached_prefix_blocks(hashes)

    def lookup(self, hashes: tuple[int, ...], now: float) -> tuple[int, int, int]:
        return self.tiers.lookup(hashes, now)

    def store(self, hashes: tuple[int, ...], now: float) -> None:
        free = (self.cap_tokens - self.reserved) // self.hash_tokens if self.prefix_caching else None
        self.tiers.store(hashes, free, now)

    # -- decode-run timing ----------------------------------------------------------------------------
    def _lines(self, B: int) -> tuple[float, float, float, float]:
        """(mem intercept, mem slope, compute intercept, compute slope) of the per-step time vs context."""
        if self.spec is None:
            return self.w0, self.m1, self.o + B * self.fpt, self.c1
        line = self.line_cache.get(B)
        if line is None:
            pm = self.pm
            lo = pm.spec_decode_tpot_s(self.spec, B, 0)
            hi = pm.spec_decode_tpot_s(self.spec, B, B * 4096)
            line = (lo, (hi - lo) / (B * 4096))
            self.line_cache[B] = line
        return line[0], line[1], -INF, 0.0

    def run_time(self, k: int, C0: int, B: int) -> float:
        """Seconds of ``k`` decode steps of a fixed batch of ``B`` starting at total context ``C0``."""
        if k <= 0:
            return 0.0
        m0, m1, c0, c1 = self._lines(B)
        # sum_{j=j0}^{j1-1} (a + b (C0 + j B)) = n (a + b C0) + b B (j1(j1-1) - j0(j0-1)) / 2
        if c0 == -INF:
            return k * (m0 + m1 * C0) + m1 * B * (k * (k - 1)) * 0.5
        if m1 > c1:
            cstar = (c0 - m0) / (m1 - c1)  # memory line above compute for C >= cstar
            js = math.ceil((cstar - C0) / B) if cstar > C0 else 0
            js = 0 if js < 0 else (min(js, k))
            comp = js * (c0 + c1 * C0) + c1 * B * (js * (js - 1)) * 0.5
            n = k - js
            mem = n * (m0 + m1 * C0) + m1 * B * (k * (k - 1) - js * (js - 1)) * 0.5
            return comp + mem
        # compute slope >= memory slope (not seen with real profiles): take the larger line at both ends
        a = max(m0 + m1 * C0, c0 + c1 * C0)
        b = max(m1, c1)
        return k * a + b * B * (k * (k - 1)) * 0.5

    def utilisation_at(self, B: int, C: float) -> float:
        m0, m1, c0, c1 = self._lines(B)
        mem = m0 + m1 * C - self.o
        comp = c0 + c1 * C - self.o if c0 != -INF else 0.0
        step = max(comp, mem)
        if step <= 0:
            return 1.0
        u = comp / step + self.mem_w * (1.0 - comp / step)
        return min(u, 1.0)


# -----------------------------------------------------------------------------------------------------
# Results
# -----------------------------------------------------------------------------------------------------


@dataclass
class ReplayResult:
    """Per-request arrays (NaN where a request did not complete) and fleet totals of one replay."""

    workload: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    engine: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    queue_s: np.ndarray
    hit_hbm_tokens: np.ndarray
    hit_dram_tokens: np.ndarray
    hit_disk_tokens: np.ndarray
    skipped_reload_tokens: np.ndarray
    recomputed_tokens: np.ndarray
    energy_j: np.ndarray
    kv_transfer_s: np.ndarray
    rejected: np.ndarray
    makespan_s: float
    fleet_energy_j: float
    engine_energy_j: np.ndarray
    engine_busy_s: np.ndarray
    engine_mean_batch: np.ndarray
    data_version: str
    profiles: list[str] = field(default_factory=list)
    events: int = 0
    # LMCache tiers' time-integral of size over the replay, block-seconds summed over engines ("dram", "disk"):
    # an elastic (TTL) disk tier's cost is its average size, block_seconds / makespan_s.
    tier_block_seconds: dict[str, float] = field(default_factory=dict)
    # Bytes x seconds of storage allocated per tier (tiers.allocated_byte_seconds): what carbon() charges.
    tier_allocated_byte_seconds: dict[str, float] = field(default_factory=dict)
    # Each engine's prefix-cache contents at the end ({"hbm", "dram", "disk"}: block ids, oldest first): pass them
    # as replay(..., initial_contents=) to start a later replay where this one ended.
    tier_contents: list[dict[str, tuple[int, ...]]] = field(default_factory=list)

    @property
    def completed(self) -> np.ndarray:
        return ~self.rejected & np.isfinite(self.e2e_s)

    def percentiles(self, values: np.ndarray, qs: Sequence[float] = (50, 90, 99)) -> dict[str, float]:
        """``{"p50": ..., ...}`` of the finite values (NaN when none)."""
        v = values[np.isfinite(values)]
        if len(v) == 0:
            return {f"p{q:g}": math.nan for q in qs}
        pct = np.percentile(v, qs)
        return {f"p{q:g}": float(x) for q, x in zip(qs, pct)}

    def slo_attainment(self, ttft_slo_s: float, tpot_slo_s: float) -> dict[str, float]:
        """Fractions of all requests meeting the TTFT SLO, the TPOT SLO, and both (rejected = missed).
        Single-token requests have no TPOT and meet the TPOT SLO trivially."""
        if ttft_slo_s <= 0 or tpot_slo_s <= 0:
            raise ValueError("ttft_slo_s: SLOs must be > 0")
        n = len(self.ttft_s)
        if n == 0:
            return {"ttft": math.nan, "tpot": math.nan, "both": math.nan}
        ok_t = np.nan_to_num(self.ttft_s, nan=INF) <= ttft_slo_s
        tp = np.where(self.output_tokens <= 1, 0.0, np.nan_to_num(self.tpot_s, nan=INF))
        ok_p = (tp <= tpot_slo_s) & self.completed
        return {"ttft": float(ok_t.mean()), "tpot": float(ok_p.mean()), "both": float((ok_t & ok_p).mean())}

    def carbon(self, ci_g_per_kwh: Sequence[float] | float, *, ci_step_s: float = 3600.0, pue: float = 1.0,
               embodied_g_per_engine: float = 0.0, lifetime_s: float = 5 * 365 * 24 * 3600.0,
               storage_params: Any = None) -> dict[str, Any]:
        """Operational (+ optional amortised embodied) carbon per request and in total.

        ``ci_g_per_kwh``: a constant or a series (one value per ``ci_step_s`` from the replay's time 0);
        each request's energy is charged at the CI of its arrival step (GreenCache Eq. 2 via
        ``greenserve.common.carbon.operational_g``). Embodied: ``greenserve.common.carbon.request_carbon``
        with the engine's mean batch size (GreenLLM Eq. 1) when ``embodied_g_per_engine`` > 0.
        Idle energy is charged to the fleet total at the mean CI. With ``storage_params`` (a
        ``carbon.CarbonParams``) the embodied carbon of the allocated DRAM and disk tiers (GreenCache Eq. 4) is
        added to the total (``storage_embodied_g`` per tier).
        """
        from greenserve.common import carbon as cm

        series = np.atleast_1d(np.asarray(ci_g_per_kwh, dtype=np.float64))
        if series.size == 0 or not np.isfinite(series).all() or (series < 0).any():
            raise ValueError("ci_g_per_kwh: must be finite, non-negative and not empty")
        if ci_step_s <= 0:
            raise ValueError("ci_step_s: must be > 0")
        slot = np.minimum((self.arrival_s // ci_step_s).astype(np.int64), series.size - 1)
        ci = series[slot]
        per_request = np.zeros(len(self.arrival_s))
        embodied = np.zeros(len(self.arrival_s))
        platform = None
        if embodied_g_per_engine > 0:
            spec = cm.ComponentSpec(kind="gpu", model="engine", embodied_g=embodied_g_per_engine, lifetime_s=lifetime_s)
            platform = cm.Platform((cm.PlatformItem(spec, 1),))
        for i in np.flatnonzero(self.completed):
            e_kwh = cm.energy_kwh_from_j(energy_j=float(self.energy_j[i]))
            if platform is None:
                per_request[i] = cm.operational_g(energy_kwh=e_kwh, ci_g_per_kwh=float(ci[i]), pue=pue)
            else:
                bd = cm.request_carbon(duration_s=float(self.e2e_s[i]), energy_kwh=e_kwh, ci_g_per_kwh=float(ci[i]),
                                       mean_batch_size=max(1.0, float(self.engine_mean_batch[self.engine[i]])),
                                       platform=platform, pue=pue)
                per_request[i] = bd.operational_g
                embodied[i] = bd.embodied_g
        idle_j = self.fleet_energy_j - float(np.nansum(self.energy_j))
        idle_g = cm.operational_g(energy_kwh=cm.energy_kwh_from_j(energy_j=max(idle_j, 0.0)),
                                  ci_g_per_kwh=float(series.mean()), pue=pue)
        storage = storage_embodied_g(self.tier_allocated_byte_seconds, storage_params) if storage_params else {}
        total = float(per_request.sum() + embodied.sum() + idle_g + sum(storage.values()))
        return {"per_request_operational_g": per_request, "per_request_embodied_g": embodied,
                "idle_operational_g": idle_g, "storage_embodied_g": storage, "total_g": total,
                "mean_request_g": float((per_request + embodied)[self.completed].mean()) if self.completed.any() else math.nan}

    def period_carbon(self, ci_g_per_kwh: float, gpu_embodied_g_per_engine: Sequence[float], *,
                      lifetime_s: float = 5 * 365 * 24 * 3600.0, pue: float = 1.0) -> dict[str, float]:
        """GreenLLM's accounting (Sec. V-A, Eq. 1-3): over the whole replay, the fleet's energy (idle included:
        a new GPU waiting for an old one is charged) at ``ci_g_per_kwh``, and each engine's GPUs' embodied carbon
        (``gpu_embodied_g_per_engine``: one figure per engine, the sum of its GPUs', e.g. A100 + T4 for a DSD
        pair) amortised over the makespan: Eq. 1 summed over an engine's requests is ``t x C_e / LT`` where
        ``t`` = the requests' time / mean batch, the engine's busy time; the idle time is charged too.
        ``per_token_g``: the total over the output tokens of the completed requests."""
        if len(gpu_embodied_g_per_engine) != len(self.engine_energy_j):
            raise ValueError("gpu_embodied_g_per_engine: one figure per engine of the fleet")
        if not math.isfinite(ci_g_per_kwh) or ci_g_per_kwh < 0:
            raise ValueError("ci_g_per_kwh: must be finite and >= 0")
        if lifetime_s <= 0:
            raise ValueError("lifetime_s: must be > 0")
        operational = self.fleet_energy_j / 3.6e6 * pue * ci_g_per_kwh
        embodied = float(sum(gpu_embodied_g_per_engine)) * self.makespan_s / lifetime_s
        tokens = int(self.output_tokens[self.completed].sum())
        return {"operational_g": operational, "embodied_g": embodied, "total_g": operational + embodied,
                "output_tokens": tokens,
                "per_token_g": (operational + embodied) / tokens if tokens else math.nan}

    def summary(self, ttft_slo_s: float | None = None, tpot_slo_s: float | None = None) -> dict[str, Any]:
        """JSON-ready aggregates: counts, throughput, TTFT/TPOT/e2e percentiles, hit tokens, energy."""
        done = self.completed
        n_done = int(done.sum())
        out_tokens = int(self.output_tokens[done].sum())
        span = self.makespan_s if self.makespan_s > 0 else math.nan
        prompt_total = int(self.prompt_tokens[done].sum())
        out: dict[str, Any] = {
            "workload": self.workload,
            "requests": len(self.arrival_s),
            "completed": n_done,
            "rejected": int(self.rejected.sum()),
            "makespan_s": self.makespan_s,
            "throughput_requests_per_s": n_done / span if n_done else 0.0,
            "throughput_output_tokens_per_s": out_tokens / span if n_done else 0.0,
            "ttft_s": self.percentiles(self.ttft_s),
            "tpot_s": self.percentiles(self.tpot_s),
            "e2e_s": self.percentiles(self.e2e_s),
            "mean_ttft_s": float(np.nanmean(self.ttft_s)) if n_done else math.nan,
            "mean_tpot_s": float(np.nanmean(self.tpot_s)) if np.isfinite(self.tpot_s).any() else math.nan,
            "hit_tokens": {"hbm": int(self.hit_hbm_tokens.sum()), "dram": int(self.hit_dram_tokens.sum()),
                           "disk": int(self.hit_disk_tokens.sum())},
            "prompt_tokens": prompt_total,
            "token_hit_rate": float((self.hit_hbm_tokens.sum() + self.hit_dram_tokens.sum()
                                     + self.hit_disk_tokens.sum()) / prompt_total) if prompt_total else 0.0,
            "fleet_energy_j": self.fleet_energy_j,
            "mean_request_energy_j": float(np.nanmean(self.energy_j[done])) if n_done else math.nan,
            "data_version": self.data_version,
        }
        if ttft_slo_s is not None and tpot_slo_s is not None:
            out["slo_attainment"] = self.slo_attainment(ttft_slo_s, tpot_slo_s)
        return out


# -----------------------------------------------------------------------------------------------------
# The simulation
# -----------------------------------------------------------------------------------------------------


class _Sim:
    """One replay run (use ``replay``); exposed to routing policies as ``sim`` (``engines``, ``hashes``)."""

    def __init__(self, workload: Workload, fleet: FleetConfig) -> None:
        self.w = workload
        self.fleet = fleet
        self.hashes = workload.block_hashes
        n_eng = len(fleet.engines)
        initial = n_eng
        if fleet.autoscale is not None:
            initial = fleet.autoscale.initial_engines or fleet.autoscale.min_engines
            initial = max(fleet.autoscale.min_engines, min(initial, n_eng))
        self.engines = [_Engine(i, spec, workload.hash_block_tokens, i < initial) for i, spec in enumerate(fleet.engines)]
        self.policy = make_policy(fleet.policy, fleet.seed)
        self.disagg = any(e.role != "both" for e in self.engines)
        n = len(workload)
        self.n = n
        self.arrival = workload.arrival_s
        self.prompt = workload.prompt_tokens
        self.output = workload.output_tokens
        nan = math.nan
        self.t_first = [nan] * n
        self.t_finish = [nan] * n
        self.t_admit = [nan] * n
        self.eng_of = [-1] * n
        self.done = [0] * n
        self.need = [0] * n
        self.s_start = [0] * n
        self.a_start = [0.0] * n
        self.energy = [0.0] * n
        self.hit_h = [0] * n
        self.hit_d = [0] * n
        self.hit_k = [0] * n
        self.skipped = [0] * n
        self.recomputed = [0] * n
        self.xfer = [0.0] * n
        self.admitted = [False] * n
        self.pd_ready = [False] * n
        self.rejected = [False] * n
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.events = 0
        self.now = 0.0
        self.link_free = 0.0
        self.kv_bytes = [e.pm._kv_bytes_per_token for e in self.engines]

    # -- event plumbing -------------------------------------------------------------------------------
    def push(self, t: float, kind: int, a: int, b: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def run(self) -> None:
        heap = self.heap
        arrival = self.arrival
        n = self.n
        i = 0
        auto = self.fleet.autoscale
        if auto is not None and n:
            self.push(arrival[0] + auto.interval_s, _EV_AUTOSCALE, 0, 0)
        pop = heapq.heappop
        while True:
            t_arr = arrival[i] if i < n else INF
            if heap and heap[0][0] <= t_arr:
                t, _, kind, a, b = pop(heap)
                self.now = t
                self.events += 1
                if kind == _EV_STEP:
                    eng = self.engines[a]
                    if b == eng.version:
                        self.step_end(eng, t)
                elif kind == _EV_TRANSFER:
                    self.deliver_prefilled(b, t)
                elif kind == _EV_AUTOSCALE:
                    self.autoscale(t)
                    if i < n or any(e.outstanding for e in self.engines):
                        self.push(t + auto.interval_s, _EV_AUTOSCALE, 0, 0)  # type: ignore[union-attr]
                elif kind == _EV_READY:
                    eng = self.engines[a]
                    if eng.on:
                        eng.routable = True
            elif i < n:
                self.now = t_arr
                self.events += 1
                self.route(i, t_arr)
                i += 1
            else:
                break

    # -- arrivals and routing -------------------------------------------------------------------------
    def candidates(self, role: str) -> list[int]:
        c = [e.idx for e in self.engines if e.routable and (e.role == "both" or e.role == role)]
        if not c:  # every engine draining: use any engine that is on
            c = [e.idx for e in self.engines if e.on and (e.role == "both" or e.role == role)]
        if not c:
            c = [e.idx for e in self.engines if e.role == "both" or e.role == role]
        return c

    def route(self, r: int, now: float) -> None:
        cands = self.candidates("prefill")
        e = self.policy.choose(self, r, cands) if len(cands) > 1 else cands[0]
        self.enqueue(self.engines[e], r, now)

    def enqueue(self, eng: _Engine, r: int, now: float) -> None:
        self.eng_of[r] = eng.idx
        eng.waiting.append(r)
        eng.outstanding += 1
        if not eng.on:
            eng.on = True
            eng.idle_since = now
        if eng.state == 0:
            eng.energy_idle_j += eng.idle_w * (now - eng.idle_since)
            self.schedule(eng, now)
        elif eng.state == 2:
            self.cut_run(eng, now)

    def cut_run(self, eng: _Engine, now: float) -> None:
        """End the current decode run at the end of the step in progress at ``now``."""
        elapsed = now - eng.run_t0
        n = eng.run_n
        if n <= 1:
            return
        B, C0 = eng.B, eng.run_c0
        lo, hi = 1, n
        while lo < hi:
            mid = (lo + hi) >> 1
            if eng.run_time(mid, C0, B) >= elapsed:
                hi = mid
            else:
                lo = mid + 1
        if lo < n:
            eng.run_n = lo
            eng.run_end = eng.run_t0 + eng.run_time(lo, C0, B)
            eng.version += 1
            self.push(eng.run_end, _EV_STEP, eng.idx, eng.version)

    # -- scheduling -----------------------------------------------------------------------------------
    def schedule(self, eng: _Engine, now: float) -> None:
        """Start the engine's next step (mixed prefill step, decode run) or make it idle."""
        waiting = eng.waiting
        B = eng.B
        if waiting:
            budget = eng.max_batched - B
            planned: list[tuple[int, int]] = []
            flops = 0.0
            prefill_ctx = 0
            extra = 0.0
            seqs = B + eng.n_prefilling
            prompt, output, done = self.prompt, self.output, self.done
            rejected_now: list[int] = []
            joined = False
            pm = eng.pm
            for r in waiting:
                if not self.admitted[r]:
                    need = -(-(prompt[r] + output[r]) // eng.block) * eng.block
                    if need > eng.cap_tokens:
                        rejected_now.append(r)
                        continue
                    if eng.reserved + need > eng.cap_tokens or seqs >= eng.max_seqs:
                        break
                    self.admit(eng, r, need, now)
                    seqs += 1
                    if self.pd_ready[r]:
                        joined = True
                        continue
                    extra += self.step_extra_tmp
                elif self.pd_ready[r]:
                    continue
                if budget <= 0:
                    break
                remaining = prompt[r] - done[r]
                chunk = min(budget, remaining)
                flops += pm.prefill_flops(chunk, 1, done[r])
                prefill_ctx += done[r]
                planned.append((r, chunk))
                budget -= chunk
                if chunk < remaining:
                    break
            for r in rejected_now:
                waiting.remove(r)
                self.rejected[r] = True
                eng.outstanding -= 1
            if joined:
                # pre-filled (PD) requests joined the decode batch directly; drop them from the queue
                for r in [r for r in waiting if self.pd_ready[r] and self.admitted[r]]:
                    waiting.remove(r)
                B = eng.B
            if planned:
                eng.planned = planned
                tok = sum(c for _, c in planned)
                # one forward pass over the chunks and the decode batch: the performance model's step cost
                mem_s, comp_s = pm.step_parts_s(flops, prefill_ctx, B, eng.base_sum + B * eng.S)
                dt = eng.o + max(comp_s, mem_s) + extra
                u = pm.step_utilisation(mem_s, comp_s)
                energy = (eng.idle_w + eng.span_w * u) * dt
                eng.energy_active_j += energy
                share = energy / (tok + B)
                en = self.energy
                for r, c in planned:
                    en[r] += share * c
                if B:
                    eng.A += share
                    eng.decoded_tokens += B
                eng.prefilled_tokens += tok
                eng.busy_s += dt
                eng.steps += 1
                eng.batch_time_sum += (B + len(planned)) * dt
                eng.state = 1
                eng.version += 1
                self.push(now + dt, _EV_STEP, eng.idx, eng.version)
                return
        if B:
            n = eng.fin_heap[0][0] - eng.S
            n = max(n, 1)
            C0 = eng.base_sum + B * eng.S
            eng.run_t0 = now
            eng.run_n = n
            eng.run_c0 = C0
            eng.run_end = now + eng.run_time(n, C0, B)
            eng.state = 2
            eng.version += 1
            self.push(eng.run_end, _EV_STEP, eng.idx, eng.version)
            return
        eng.state = 0
        eng.idle_since = now
        eng.planned = []

    step_extra_tmp = 0.0

    def admit(self, eng: _Engine, r: int, need: int, now: float) -> None:
        """Reserve KV, look the prefix up in the tiers and apply the read-or-recompute rule."""
        self.admitted[r] = True
        self.need[r] = need
        eng.reserved += need
        self.t_admit[r] = now
        self.step_extra_tmp = 0.0
        if self.pd_ready[r]:
            # KV arrived over the link: join the decode batch at the current step
            self.join_decode(eng, r)
            return
        eng.n_prefilling += 1
        hashes = self.hashes[r] if self.hashes else ()
        if not hashes:
            return
        ht = eng.hash_tokens
        nh, nd, nk = eng.lookup(hashes, now)
        p = self.prompt[r]
        cap = p - 1  # the last prompt token is always computed
        h_tok = min(nh * ht, cap)
        d_tok = min(nd * ht, cap - h_tok)
        k_tok = min(nk * ht, cap - h_tok - d_tok)
        if d_tok or k_tok:
            plan = eng.pm.plan_prefix_reuse(h_tok, d_tok, k_tok, p, now - self.arrival[r], eng.reuse_rule,
                                            eng.reuse_budget)
            d_tok, k_tok = plan.used_dram_tokens, plan.used_disk_tokens
            self.skipped[r] = plan.skipped_tokens
            self.step_extra_tmp = plan.load_s
        self.hit_h[r], self.hit_d[r], self.hit_k[r] = h_tok, d_tok, k_tok
        self.done[r] = h_tok + d_tok + k_tok

    def join_decode(self, eng: _Engine, r: int) -> None:
        S = eng.S
        self.s_start[r] = S
        self.a_start[r] = eng.A
        eng.base_sum += self.prompt[r] + 1 - S
        eng.B += 1
        heapq.heappush(eng.fin_heap, (S + self.output[r] - 1, r))

    def finish(self, eng: _Engine, r: int, now: float) -> None:
        self.t_finish[r] = now
        self.energy[r] += eng.A - self.a_start[r]
        eng.reserved -= self.need[r]
        eng.B -= 1
        eng.base_sum -= self.prompt[r] + 1 - self.s_start[r]
        eng.outstanding -= 1

    def step_end(self, eng: _Engine, now: float) -> None:
        if eng.state == 2:
            n, B = eng.run_n, eng.B
            dt = now - eng.run_t0
            u = eng.utilisation_at(B, eng.run_c0 + B * n * 0.5)
            if eng.draft_span_w:  # DSD: each GPU busy for its own share of the rounds
                draft_s, verify_s, link_s = eng.pm.spec_decode_round_parts_s(
                    eng.spec, B, int(eng.run_c0 + B * n * 0.5))
                rnd = draft_s + verify_s + link_s
                energy = (eng.idle_w + (eng.span_w * u * verify_s + eng.draft_span_w * eng.draft_mem_w * draft_s)
                          / rnd) * dt
            else:
                energy = (eng.idle_w + eng.span_w * u) * dt
            eng.energy_active_j += energy
            eng.A += energy / B
            eng.S += n
            eng.decoded_tokens += B * n
            eng.busy_s += dt
            eng.steps += n
            eng.batch_time_sum += B * dt
        else:
            if eng.B:
                eng.S += 1
        S = eng.S
        fh = eng.fin_heap
        while fh and fh[0][0] <= S:
            _, r = heapq.heappop(fh)
            self.finish(eng, r, now)
        if eng.state == 1:
            waiting = eng.waiting
            done, prompt, output = self.done, self.prompt, self.output
            for r, c in eng.planned:
                done[r] += c
                if done[r] >= prompt[r]:
                    if waiting and waiting[0] == r:
                        waiting.popleft()
                    else:
                        waiting.remove(r)
                    eng.n_prefilling -= 1
                    self.recomputed[r] = prompt[r] - self.hit_h[r] - self.hit_d[r] - self.hit_k[r]
                    self.t_first[r] = now
                    if self.hashes:
                        h = self.hashes[r]
                        if h:
                            eng.store(h, now)
                    if eng.role == "prefill":
                        eng.reserved -= self.need[r]
                        eng.outstanding -= 1
                        self.start_transfer(eng, r, now)
                    elif output[r] <= 1:
                        self.t_finish[r] = now
                        eng.reserved -= self.need[r]
                        eng.outstanding -= 1
                    else:
                        self.join_decode(eng, r)
            eng.planned = []
        self.schedule(eng, now)

    # -- disaggregation -------------------------------------------------------------------------------
    def start_transfer(self, eng: _Engine, r: int, now: float) -> None:
        nbytes = self.prompt[r] * self.kv_bytes[eng.idx]
        start = max(self.link_free, now)
        dur = self.fleet.kv_link_latency_s + nbytes / self.fleet.kv_link_bandwidth_bytes_per_s
        self.link_free = start + dur
        self.xfer[r] = start + dur - now
        self.push(start + dur, _EV_TRANSFER, eng.idx, r)

    def deliver_prefilled(self, r: int, now: float) -> None:
        self.pd_ready[r] = True
        self.admitted[r] = False
        cands = self.candidates("decode")
        engines = self.engines
        e = min(cands, key=lambda j: (engines[j].outstanding, j))
        self.enqueue(engines[e], r, now)

    # -- autoscaling ----------------------------------------------------------------------------------
    def autoscale(self, now: float) -> None:
        auto = self.fleet.autoscale
        assert auto is not None
        active = [e for e in self.engines if e.routable]
        load = sum(e.outstanding for e in active) / max(len(active), 1)
        if load > auto.scale_up_outstanding:
            for e in self.engines:
                if not e.on:
                    e.on = True
                    e.idle_since = now + auto.cold_start_s
                    e.state = 0
                    self.push(now + auto.cold_start_s, _EV_READY, e.idx, 0)
                    return
        elif load < auto.scale_down_outstanding and len(active) > auto.min_engines:
            victim = active[-1]
            victim.routable = False
        for e in self.engines:  # drained engines switch off
            if e.on and not e.routable and e.outstanding == 0 and e.state == 0:
                e.energy_idle_j += e.idle_w * max(0.0, now - e.idle_since)
                e.on = False

    # -- result ---------------------------------------------------------------------------------------
    def result(self) -> ReplayResult:
        end = self.now
        for e in self.engines:
            if e.on and e.state == 0:
                e.energy_idle_j += e.idle_w * max(0.0, end - e.idle_since)
        arr = np.asarray(self.arrival, dtype=np.float64)
        first = np.asarray(self.t_first, dtype=np.float64)
        fin = np.asarray(self.t_finish, dtype=np.float64)
        out = np.asarray(self.output, dtype=np.int64)
        rej = np.asarray(self.rejected, dtype=bool)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(out > 1, (fin - first) / np.maximum(out - 1, 1), np.nan)
        energy = np.asarray(self.energy, dtype=np.float64)
        energy[~np.isfinite(fin)] = np.nan
        eng_energy = np.array([e.energy_active_j + e.energy_idle_j for e in self.engines])
        busy = np.array([e.busy_s for e in self.engines])
        mean_batch = np.array([e.batch_time_sum / e.busy_s if e.busy_s > 0 else 0.0 for e in self.engines])
        start = float(arr[0]) if len(arr) else 0.0
        return ReplayResult(
            workload=self.w.name,
            arrival_s=arr,
            prompt_tokens=np.asarray(self.prompt, dtype=np.int64),
            output_tokens=out,
            engine=np.asarray(self.eng_of, dtype=np.int64),
            ttft_s=first - arr,
            tpot_s=tpot,
            e2e_s=fin - arr,
            queue_s=np.asarray(self.t_admit, dtype=np.float64) - arr,
            hit_hbm_tokens=np.asarray(self.hit_h, dtype=np.int64),
            hit_dram_tokens=np.asarray(self.hit_d, dtype=np.int64),
            hit_disk_tokens=np.asarray(self.hit_k, dtype=np.int64),
            skipped_reload_tokens=np.asarray(self.skipped, dtype=np.int64),
            recomputed_tokens=np.asarray(self.recomputed, dtype=np.int64),
            energy_j=energy,
            kv_transfer_s=np.asarray(self.xfer, dtype=np.float64),
            rejected=rej,
            makespan_s=max(0.0, end - start),
            fleet_energy_j=float(eng_energy.sum()),
            engine_energy_j=eng_energy,
            engine_busy_s=busy,
            engine_mean_batch=mean_batch,
            data_version=self.engines[0].pm.profile.data_version,
            profiles=[e.pm.profile.name for e in self.engines],
            events=self.events,
            tier_block_seconds={name: sum(e.tiers.block_seconds(name, end) for e in self.engines)
                                for name in ("dram", "disk")},
            tier_allocated_byte_seconds={
                name: sum(allocated_byte_seconds(getattr(e.tiers, name), e.pm._kv_bytes_per_token, end,
                                                 max(0.0, end - start)) for e in self.engines)
                for name in ("dram", "disk")},
            tier_contents=[e.tiers.contents() for e in self.engines],
        )


def replay(workload: Workload, fleet: FleetConfig,
           initial_contents: Sequence[Mapping[str, Sequence[int]]] | None = None) -> ReplayResult:
    """Replay ``workload`` through ``fleet`` in virtual time; deterministic for the fleet's seed.

    ``initial_contents``: one mapping per engine of the prefix-cache blocks it holds at the start (as a previous
    result's ``tier_contents``; the block ids must be the workload's), so that state carries from one replay to
    the next; an engine's tiers keep what their capacities hold (``PrefixTiers.preload``)."""
    if not isinstance(workload, Workload):
        raise TypeError("workload: must be a Workload")
    if not isinstance(fleet, FleetConfig):
        raise TypeError("fleet: must be a FleetConfig")
    sim = _Sim(workload, fleet)
    if initial_contents is not None:
        if len(initial_contents) != len(sim.engines):
            raise ValueError(f"initial_contents: one mapping per engine ({len(sim.engines)}), "
                             f"got {len(initial_contents)}")
        start = float(workload.arrival_s[0]) if len(workload) else 0.0
        for eng, contents in zip(sim.engines, initial_contents):
            eng.tiers.preload(contents, eng.hbm_cap_blocks if eng.prefix_caching else None, start)
    sim.run()
    return sim.result()
