"""The result of one replay (``replay.replay``): per-request arrays, fleet totals and what is derived from them.

``ReplayResult`` holds each request's TTFT, TPOT, end-to-end and queueing time, prefix-cache hit tokens by tier,
recomputed tokens, energy and KV-transfer time, and the fleet's energy, busy time and tier usage; it derives
percentiles, SLO attainment, a JSON-ready summary and carbon: per request and in total (GreenCache Eq. 2/4,
GreenLLM Eq. 1 via ``greenserve.common.carbon``) or over the whole period (GreenLLM Sec. V-A).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from greenserve.simulator.tiers import allocated_byte_seconds, storage_embodied_g

if TYPE_CHECKING:
    from greenserve.simulator.replay import _Sim

__all__ = ["ReplayResult", "finish_replay"]

INF = math.inf


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
        ``carbon_params.CarbonParams``) the embodied carbon of the allocated DRAM and disk tiers (GreenCache Eq. 4) is
        added to the total (``storage_embodied_g`` per tier).
        """
        from greenserve.common import carbon as cm
        from greenserve.common.carbon_units import energy_kwh_from_j
        from greenserve.common.embodied_carbon import ComponentSpec, Platform, PlatformItem

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
            spec = ComponentSpec(kind="gpu", model="engine", embodied_g=embodied_g_per_engine, lifetime_s=lifetime_s)
            platform = Platform((PlatformItem(spec, 1),))
        for i in np.flatnonzero(self.completed):
            e_kwh = energy_kwh_from_j(energy_j=float(self.energy_j[i]))
            if platform is None:
                per_request[i] = cm.operational_g(energy_kwh=e_kwh, ci_g_per_kwh=float(ci[i]), pue=pue)
            else:
                bd = cm.request_carbon(duration_s=float(self.e2e_s[i]), energy_kwh=e_kwh, ci_g_per_kwh=float(ci[i]),
                                       mean_batch_size=max(1.0, float(self.engine_mean_batch[self.engine[i]])),
                                       platform=platform, pue=pue)
                per_request[i] = bd.operational_g
                embodied[i] = bd.embodied_g
        idle_j = self.fleet_energy_j - float(np.nansum(self.energy_j))
        idle_g = cm.operational_g(energy_kwh=energy_kwh_from_j(energy_j=max(idle_j, 0.0)),
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


def finish_replay(sim: _Sim) -> ReplayResult:
    """Charge each engine's idle time to the replay's end and gather ``sim``'s per-request and fleet figures."""
    end = sim.now
    for e in sim.engines:
        if e.on and e.state == 0:
            e.energy_idle_j += e.idle_w * max(0.0, end - e.idle_since)
    arr = np.asarray(sim.arrival, dtype=np.float64)
    first = np.asarray(sim.t_first, dtype=np.float64)
    fin = np.asarray(sim.t_finish, dtype=np.float64)
    out = np.asarray(sim.output, dtype=np.int64)
    rej = np.asarray(sim.rejected, dtype=bool)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (fin - first) / np.maximum(out - 1, 1), np.nan)
    energy = np.asarray(sim.energy, dtype=np.float64)
    energy[~np.isfinite(fin)] = np.nan
    eng_energy = np.array([e.energy_active_j + e.energy_idle_j for e in sim.engines])
    busy = np.array([e.busy_s for e in sim.engines])
    mean_batch = np.array([e.batch_time_sum / e.busy_s if e.busy_s > 0 else 0.0 for e in sim.engines])
    start = float(arr[0]) if len(arr) else 0.0
    # a profile's per-request time outside the engine's steps (EngineProfile.request_frontend_s), by engine
    frontend = np.array([e.pm.profile.request_frontend_s for e in sim.engines])
    eng_of = np.asarray(sim.eng_of, dtype=np.int64)
    if frontend.any():
        lat = np.where(eng_of >= 0, frontend[np.clip(eng_of, 0, None)], 0.0)
        first, fin = first + lat, fin + lat
    return ReplayResult(
        workload=sim.w.name,
        arrival_s=arr,
        prompt_tokens=np.asarray(sim.prompt, dtype=np.int64),
        output_tokens=out,
        engine=np.asarray(sim.eng_of, dtype=np.int64),
        ttft_s=first - arr,
        tpot_s=tpot,
        e2e_s=fin - arr,
        queue_s=np.asarray(sim.t_admit, dtype=np.float64) - arr,
        hit_hbm_tokens=np.asarray(sim.hit_h, dtype=np.int64),
        hit_dram_tokens=np.asarray(sim.hit_d, dtype=np.int64),
        hit_disk_tokens=np.asarray(sim.hit_k, dtype=np.int64),
        skipped_reload_tokens=np.asarray(sim.skipped, dtype=np.int64),
        recomputed_tokens=np.asarray(sim.recomputed, dtype=np.int64),
        energy_j=energy,
        kv_transfer_s=np.asarray(sim.xfer, dtype=np.float64),
        rejected=rej,
        makespan_s=max(0.0, end - start),
        fleet_energy_j=float(eng_energy.sum()),
        engine_energy_j=eng_energy,
        engine_busy_s=busy,
        engine_mean_batch=mean_batch,
        data_version=sim.engines[0].pm.profile.data_version,
        profiles=[e.pm.profile.name for e in sim.engines],
        events=sim.events,
        tier_block_seconds={name: sum(e.tiers.block_seconds(name, end) for e in sim.engines)
                            for name in ("dram", "disk")},
        tier_allocated_byte_seconds={
            name: sum(allocated_byte_seconds(getattr(e.tiers, name), e.pm._kv_bytes_per_token, end,
                                             max(0.0, end - start)) for e in sim.engines)
            for name in ("dram", "disk")},
        tier_contents=[e.tiers.contents() for e in sim.engines],
    )
