"""What one engine can do for a pool: its SLO capacity (requests per second it serves while the pool's SLO holds at
the pool's attainment target) and its power as a function of load, from a stored profile or a simulator prediction.

* **Stored profiles** (the profiler's measured or published points): the capacity is the highest profiled rate whose
  percentiles meet the pool's SLO (the percentile that matches the attainment target: p90 for 0.9, p99 for 0.99; or
  the point's own attainment when its SLO is the pool's), and power is a least-squares line through the points'
  ``power_w`` against rate (idle power + energy per request).
* **Predictions**: without a profile, the simulator (``greenserve.simulator``) replays Poisson arrivals of the pool's
  mean request shape through one engine of the variant's performance model and bisects the rate where attainment
  falls below the target; idle power and the energy per request come from the same replays. Predictions are cached
  per (performance profile, SLO, request shape), so a fleet of identical engines costs one search.
* **Prefix-cache hits**: a prediction may count the pool's expected fraction of prompt tokens found in the engine's
  prefix cache (``prefix_hit_fraction``, e.g. the hit rate measured over the last hour): each replayed request then
  shares that leading fraction of its prompt's KV blocks with the others, so the simulator's HBM prefix cache skips
  their prefill (the first request computes them; attention still reads the whole context, and each request still
  reserves KV for its whole prompt). Callers round the measured rate down with ``hit_fraction_step`` (conservative,
  and a handful of cached predictions per day). Without it (0, the default) no prefix reuse is assumed.

Every capability says where it came from; the plan's explanation repeats it ("predicted by the simulator").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from greenserve.simulator.perf_model import DEFAULT_PROFILE, EngineProfile, PerfModel, list_profiles, load_profile
from greenserve.simulator.replay import EngineSpec, FleetConfig, replay
from greenserve.simulator.workloads import Workload
from greenserve.v1 import common_pb2

PREDICTION_REQUESTS = 240
BISECT_STEPS = 9
DEFAULT_PROMPT_TOKENS = 1024
DEFAULT_OUTPUT_TOKENS = 256
PREFIX_BLOCK_TOKENS = 16  # vLLM's KV block: the granularity of a prefix-cache hit
HIT_FRACTION_STEP = 0.05  # measured hit rates are rounded down to this step before predicting
MAX_HIT_FRACTION = 0.9  # never assume more of the prompt cached than this


@dataclass(frozen=True)
class Capability:
    """One engine's SLO capacity and power model for one pool."""

    capacity_requests_per_s: float
    idle_power_w: float
    energy_per_request_j: float  # dynamic energy of one request on top of idle power
    source: str  # "measured", "published", "predicted"
    detail: str  # profile key or simulator profile name

    def power_w(self, rate_per_s: float) -> float:
        return self.idle_power_w + self.energy_per_request_j * max(0.0, rate_per_s)

    def attainment(self, rate_per_s: float, target: float) -> float:
        """Expected attainment at ``rate_per_s``: the target up to capacity, then falling as capacity / rate."""
        if rate_per_s <= self.capacity_requests_per_s or rate_per_s <= 0:
            return target
        return target * self.capacity_requests_per_s / rate_per_s


def simulator_profile_name(simulator_model: str, hardware: str) -> tuple[str, bool]:
    """``"<model>@<hardware>"`` when the simulator knows it; else the closest known one and False."""
    known = list_profiles()
    wanted = f"{simulator_model}@{hardware}"
    if wanted in known:
        return wanted, True
    same_model = [p for p in known if p.split("@")[0] == simulator_model]
    whole = hardware.split("-MIG-")[0]
    for name in same_model:
        if name.split("@")[1] == whole:
            return name, False
    if same_model:
        return same_model[0], False
    return DEFAULT_PROFILE, False


def hit_fraction_step(fraction: float) -> float:
    """A measured prefix-hit fraction as predictions take it: rounded down to ``HIT_FRACTION_STEP``, within
    [0, ``MAX_HIT_FRACTION``]; 0 for a missing (NaN) rate."""
    if not math.isfinite(fraction) or fraction <= 0:
        return 0.0
    steps = math.floor(min(fraction, MAX_HIT_FRACTION) / HIT_FRACTION_STEP + 1e-9)
    return round(steps * HIT_FRACTION_STEP, 6)


def _poisson(rate_per_s: float, prompt: int, output: int, seed: int, prefix_hit_fraction: float = 0.0) -> Workload:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_per_s, PREDICTION_REQUESTS)
    arrivals = np.cumsum(gaps).tolist()
    shared = min(int(prefix_hit_fraction * prompt) // PREFIX_BLOCK_TOKENS, max(prompt - 1, 0) // PREFIX_BLOCK_TOKENS)
    hashes = [tuple(range(1, shared + 1))] * PREDICTION_REQUESTS if shared > 0 else []
    return Workload(f"poisson@{rate_per_s:g}", arrivals, [prompt] * PREDICTION_REQUESTS, [output] * PREDICTION_REQUESTS,
                    block_hashes=hashes, hash_block_tokens=PREFIX_BLOCK_TOKENS)


def _attainment_and_energy(profile: str, rate: float, slo: tuple[float, float], prompt: int, output: int,
                           prefix_hit_fraction: float = 0.0) -> tuple[float, float]:
    result = replay(_poisson(rate, prompt, output, seed=7, prefix_hit_fraction=prefix_hit_fraction),
                    FleetConfig((EngineSpec(profile),), seed=7))
    both = result.slo_attainment(slo[0], slo[1])["both"]
    done = result.completed
    energy = float(np.nanmean(result.energy_j[done])) if done.any() else math.nan
    return both, energy


@lru_cache(maxsize=512)
def predict(profile: str | EngineProfile, ttft_s: float, tpot_s: float, target: float, prompt: int,
            output: int, prefix_hit_fraction: float = 0.0) -> Capability:
    """Simulator prediction (see the module docstring); deterministic. ``profile`` is a name of the simulator's
    data file or a built ``EngineProfile`` (e.g. one scaled to a MIG slice the file has no profile for);
    ``prefix_hit_fraction``: the share of each prompt found in the prefix cache (``hit_fraction_step``)."""
    if not 0.0 <= prefix_hit_fraction < 1.0:
        raise ValueError(f"prefix_hit_fraction: must be in [0, 1), got {prefix_hit_fraction}")
    model = PerfModel(profile if isinstance(profile, EngineProfile) else load_profile(profile))
    label = profile.name if isinstance(profile, EngineProfile) else profile
    ttft0, tpot0 = model.unloaded_request_s(prompt, output)
    e2e0 = ttft0 + tpot0 * max(output - 1, 0)
    idle_w = model.power_w(0.0)
    if ttft0 > ttft_s or tpot0 > tpot_s:  # not even one request alone meets the SLO
        return Capability(0.0, idle_w, 0.0, "predicted", f"{label}: unloaded TTFT {ttft0:.3f} s / TPOT "
                          f"{tpot0:.4f} s miss the SLO")
    lo, hi = 0.0, max(1.0 / max(e2e0, 1e-3), 0.05)
    energy_lo = math.nan
    # Grow hi until the SLO breaks, then bisect.
    for _ in range(12):
        ok, energy = _attainment_and_energy(profile, hi, (ttft_s, tpot_s), prompt, output, prefix_hit_fraction)
        if ok < target:
            break
        lo, energy_lo = hi, energy
        hi *= 2.0
    for _ in range(BISECT_STEPS):
        mid = (lo + hi) / 2.0
        ok, energy = _attainment_and_energy(profile, mid, (ttft_s, tpot_s), prompt, output, prefix_hit_fraction)
        if ok >= target:
            lo, energy_lo = mid, energy
        else:
            hi = mid
    if math.isnan(energy_lo):
        _, energy_lo = _attainment_and_energy(profile, max(lo, hi / 4.0), (ttft_s, tpot_s), prompt, output,
                                             prefix_hit_fraction)
    if prefix_hit_fraction > 0:
        label = f"{label}, {prefix_hit_fraction:.0%} of each prompt prefix-cached"
    return Capability(lo, idle_w, energy_lo if math.isfinite(energy_lo) else 0.0, "predicted", label)


def _percentile_for(target: float) -> str:
    return "p50" if target <= 0.5 else "p90" if target <= 0.9 else "p99"


def from_profile(profile: common_pb2.Profile, slo: common_pb2.Slo) -> Capability | None:
    """Capability from stored points; None when no point meets the SLO or the points lack power."""
    points = sorted(profile.points, key=lambda p: p.request_rate_per_s)
    if not points:
        return None
    same_slo = (profile.HasField("slo") and math.isclose(profile.slo.ttft_s, slo.ttft_s, rel_tol=0.01)
                and math.isclose(profile.slo.tpot_s, slo.tpot_s, rel_tol=0.01))
    q = _percentile_for(slo.attainment_fraction)
    capacity = 0.0
    for p in points:
        if same_slo and p.slo_attainment_fraction > 0:
            ok = p.slo_attainment_fraction >= slo.attainment_fraction
        else:
            ok = getattr(p, f"ttft_{q}_s") <= slo.ttft_s and getattr(p, f"tpot_{q}_s") <= slo.tpot_s
        if not ok:
            break
        capacity = max(capacity, min(p.request_rate_per_s, p.throughput_requests_per_s or p.request_rate_per_s))
    rates = np.array([p.request_rate_per_s for p in points if p.power_w > 0])
    power = np.array([p.power_w for p in points if p.power_w > 0])
    if len(rates) >= 2 and np.ptp(rates) > 0:
        slope, intercept = np.polyfit(rates, power, 1)
        idle_w, per_request_j = max(float(intercept), 0.0), max(float(slope), 0.0)
    elif len(rates) == 1:
        idle_w, per_request_j = 0.0, float(power[0] / rates[0]) if rates[0] > 0 else 0.0
    else:
        energy = [p.energy_per_request_kwh * 3.6e6 for p in points if p.energy_per_request_kwh > 0]
        if not energy:
            return None
        idle_w, per_request_j = 0.0, float(np.mean(energy))
    source = {common_pb2.PROFILE_SOURCE_MEASURED: "measured", common_pb2.PROFILE_SOURCE_PUBLISHED: "published",
              common_pb2.PROFILE_SOURCE_SIMULATED: "simulated"}.get(profile.source, "stored")
    return Capability(capacity, idle_w, per_request_j, source, f"{profile.config_key} v{profile.version}")
