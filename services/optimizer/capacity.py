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
* **Prefix-cache hits**: a prediction may count prefix reuse (``prefix_hit_fraction``: the pool's measured fraction of
  prompt tokens found in a cache, e.g. over the last hour). That fraction only sets the conversation shape: the
  replay becomes multi-turn chat (``greenserve.simulator.workloads.multi_turn_workload``, each conversation with its
  own growing context) whose turns and user tokens make its prompts the pool's mean length and the reusable share of
  them, with unlimited memory, that fraction (``conversation_shape``). How much an engine really hits emerges from
  its own KV memory (the HBM of its GPU or MIG slice, plus a DRAM tier when given): an engine loaded with more live
  conversations than it can keep evicts their prefixes, hits less and serves less. The hit rate replayed at the capacity is in
  ``Capability.predicted_hit_fraction``. Callers round the measured rate down with ``hit_fraction_step``
  (conservative, and a handful of cached predictions per day). Without it (0, the default) no reuse is assumed.

Every capability says where it came from; the plan's explanation repeats it ("predicted by the simulator").
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from greenserve.simulator.engine_profile import DEFAULT_PROFILE, EngineProfile, list_profiles, load_profile
from greenserve.simulator.perf_model import PerfModel
from greenserve.simulator.replay import replay
from greenserve.simulator.replay_fleet import EngineSpec, FleetConfig
from greenserve.simulator.workloads import Workload, multi_turn_workload
from greenserve.v1 import common_pb2

PREDICTION_REQUESTS = 240
BISECT_STEPS = 9
DEFAULT_PROMPT_TOKENS = 1024
DEFAULT_OUTPUT_TOKENS = 256
HIT_FRACTION_STEP = 0.05  # measured hit rates are rounded down to this step before predicting
MAX_HIT_FRACTION = 0.9  # never assume more of the prompt cached than this
# Conversation replays (prefix reuse): the evaluation's chat traffic (multi-turn, 30 s think time, 256-token hash
# blocks); the mean turns per conversation are picked from CONVERSATION_TURNS to match the measured reuse.
THINK_TIME_S = 30.0
CONVERSATION_BLOCK_TOKENS = 256
CONVERSATION_TURNS = (1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0)
CONVERSATION_WINDOW_S = 600.0  # measured window after one conversation lifetime of warm-up: long enough for the KV
# memory to fill and for cache pressure (running sequences crowding out cached prefixes, so fewer hits and more
# prefill) to show; a 240 s window missed it and put an HBM-only engine's capacity 28 % above what a 600 s replay carries
SHAPE_SAMPLE_CONVERSATIONS = 300  # conversations sampled to fit a shape (no replay: cheap)
SHAPE_PROMPT_TOLERANCE = 0.15  # a fitted shape's mean prompt within 15 % of the pool's


@dataclass(frozen=True)
class Capability:
    """One engine's SLO capacity and power model for one pool."""

    capacity_requests_per_s: float
    idle_power_w: float
    energy_per_request_j: float  # dynamic energy of one request on top of idle power
    source: str  # "measured", "published", "predicted"
    detail: str  # profile key or simulator profile name
    predicted_hit_fraction: float = 0.0  # prompt tokens found in a cache tier at the capacity (conversation replays)
    # (rate per s, attainment, dynamic J per request) of every replay the prediction ran, by rate: what the engine
    # does below and above its capacity (predictions only; empty for stored profiles)
    curve: tuple[tuple[float, float, float], ...] = ()

    def power_w(self, rate_per_s: float) -> float:
        return self.idle_power_w + self.energy_per_request_j * max(0.0, rate_per_s)

    def attainment(self, rate_per_s: float, target: float) -> float:
        """Expected attainment at ``rate_per_s``. With a prediction's ``curve``: the replayed attainment
        interpolated in rate (made non-increasing in rate: the replays' sampling noise must not promise more at a
        higher load), and beyond the highest rate replayed falling as that rate / ``rate_per_s``. Without one (a
        stored profile): the target up to capacity, then falling as capacity / rate."""
        if self.curve:
            rates = [c[0] for c in self.curve]
            shaped = np.minimum.accumulate([c[1] for c in self.curve])
            if rate_per_s <= rates[0]:
                return float(shaped[0])
            if rate_per_s >= rates[-1]:
                return float(shaped[-1] * rates[-1] / rate_per_s)
            return float(np.interp(rate_per_s, rates, shaped))
        if rate_per_s <= self.capacity_requests_per_s or rate_per_s <= 0:
            return target
        return target * self.capacity_requests_per_s / rate_per_s

    def energy_per_request_at_j(self, rate_per_s: float) -> float:
        """Dynamic energy of one request at ``rate_per_s`` per engine: the prediction's replays interpolated in rate
        (fewer requests per second batch less, so each costs more), else the figure at capacity."""
        rates, energies = self._energy_points
        if not rates:
            return self.energy_per_request_j
        return float(np.interp(rate_per_s, rates, energies))

    @functools.cached_property
    def _energy_points(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        points = [(c[0], c[2]) for c in self.curve if math.isfinite(c[2]) and c[2] > 0]
        return tuple(p[0] for p in points), tuple(p[1] for p in points)


def simulator_profile_name(simulator_model: str, hardware: str) -> tuple[str, bool]:
    """``"<model>@<hardware>"`` when the simulator knows it; else the closest known one and False. Closest, among
    the model's profiles, the same GPU (``A100-80GB`` of its slices); then the same family (``A100`` of
    ``A100-40GB``); then the same maker's line (``H`` of ``H200``); then any single GPU; then any: at each step a
    MIG slice for a slice and a whole GPU for a GPU, so that a slice of a GPU with no
    stored profile never takes the model's first profile by name (an A100-40GB slice as ``2xL40``: two GPUs' idle
    power for one slice)."""
    known = list_profiles()
    wanted = f"{simulator_model}@{hardware}"
    if wanted in known:
        return wanted, True
    same_model = sorted((p for p in known if p.split("@")[0] == simulator_model), key=lambda p: (len(p), p))
    if not same_model:
        return DEFAULT_PROFILE, False
    whole = hardware.split("-MIG-")[0]
    family = whole.split("-")[0]
    mig = "-MIG-" in hardware

    def rank(name: str) -> tuple[int, int]:
        hw = name.split("@", 1)[1]
        hw_whole = hw.split("-MIG-")[0]
        single = not hw[:1].isdigit()  # not "2xL40"
        closeness = (0 if hw_whole == whole else 1 if hw_whole.split("-")[0] == family
                     else 2 if single and hw[:1] == family[:1] else 3 if single else 4)
        return closeness, 0 if ("-MIG-" in hw) == mig else 1

    return min(same_model, key=rank), False


def hit_fraction_step(fraction: float) -> float:
    """A measured prefix-hit fraction as predictions take it: rounded down to ``HIT_FRACTION_STEP``, within
    [0, ``MAX_HIT_FRACTION``]; 0 for a missing (NaN) rate."""
    if not math.isfinite(fraction) or fraction <= 0:
        return 0.0
    steps = math.floor(min(fraction, MAX_HIT_FRACTION) / HIT_FRACTION_STEP + 1e-9)
    return round(steps * HIT_FRACTION_STEP, 6)


def _poisson(rate_per_s: float, prompt: int, output: int, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_per_s, PREDICTION_REQUESTS)
    arrivals = np.cumsum(gaps).tolist()
    return Workload(f"poisson@{rate_per_s:g}", arrivals, [prompt] * PREDICTION_REQUESTS, [output] * PREDICTION_REQUESTS)


def reusable_fraction(work: Workload) -> float:
    """Prompt tokens of ``work`` whose leading blocks an earlier request already carried / prompt tokens: the hit
    fraction an engine with unlimited memory would see."""
    seen: set[int] = set()
    reused = 0
    for blocks in work.block_hashes:
        n = 0
        for b in blocks:
            if b not in seen:
                break
            n += 1
        reused += n * work.hash_block_tokens
        seen.update(blocks)
    return reused / max(1, sum(work.prompt_tokens))


def _conversations(rate_per_s: float, shape: tuple[float, float], output: int, seed: int,
                   n_conversations: int) -> Workload:
    turns, user = shape
    return multi_turn_workload(n_conversations, rate_per_s / turns, seed=seed, mean_turns=turns,
                               mean_user_tokens=user, mean_output_tokens=output, think_time_s=THINK_TIME_S,
                               block_tokens=CONVERSATION_BLOCK_TOKENS)


def _mean_prompt(shape: tuple[float, float], output: int) -> float:
    work = _conversations(1.0, shape, output, 0, SHAPE_SAMPLE_CONVERSATIONS)
    return sum(work.prompt_tokens) / max(1, len(work.prompt_tokens))


@lru_cache(maxsize=64)
def conversation_shape(fraction: float, prompt: int = DEFAULT_PROMPT_TOKENS,
                       output: int = DEFAULT_OUTPUT_TOKENS) -> tuple[float, float]:
    """(mean turns per conversation, mean new user tokens per turn) of chat whose prompts average ``prompt`` tokens
    and of which, with unlimited memory, the share closest to ``fraction`` is reusable (an earlier turn's
    context); ties go to fewer turns. Turns come from ``CONVERSATION_TURNS``; the user tokens are fitted linearly
    (the mean prompt grows linearly with them) to the prompt mean."""
    best, best_gap = (CONVERSATION_TURNS[0], float(prompt)), math.inf
    for turns in CONVERSATION_TURNS:
        p_lo, p_hi = _mean_prompt((turns, 100.0), output), _mean_prompt((turns, 600.0), output)
        if p_hi <= p_lo:
            continue
        user = min(max(100.0 + (prompt - p_lo) * 500.0 / (p_hi - p_lo), 8.0), 4096.0)
        work = _conversations(1.0, (turns, user), output, 0, SHAPE_SAMPLE_CONVERSATIONS)
        mean_prompt = sum(work.prompt_tokens) / max(1, len(work.prompt_tokens))
        if abs(mean_prompt - prompt) > SHAPE_PROMPT_TOLERANCE * prompt:
            continue  # this many turns cannot make prompts this short (or long)
        gap = abs(reusable_fraction(work) - fraction)
        if gap < best_gap - 1e-9:
            best, best_gap = (turns, round(user, 1)), gap
    return best


def _replay_conversations(profile: str | EngineProfile, rate: float, slo: tuple[float, float], output: int,
                          shape: tuple[float, float], dram_bytes: int) -> tuple[float, float, float]:
    """(attainment, dynamic energy per request, hit fraction) of the requests arriving in a measured window after
    a warm-up of one conversation lifetime, at ``rate`` requests/s on one engine with its own KV memory."""
    warm_s = shape[0] * THINK_TIME_S
    window_s = max(CONVERSATION_WINDOW_S, PREDICTION_REQUESTS / rate)
    n_conv = max(2, math.ceil(rate / shape[0] * (warm_s + window_s)))
    work = _conversations(rate, shape, output, 7, n_conv)
    built = profile if isinstance(profile, EngineProfile) else load_profile(profile)
    dram_tokens = int(dram_bytes / max(built.kv_bytes_per_token, 1.0)) if dram_bytes > 0 else 0
    result = replay(work, FleetConfig((EngineSpec(profile, dram_capacity_tokens=dram_tokens),), seed=7))
    arrival = np.asarray(result.arrival_s)
    measured = (arrival >= warm_s) & (arrival < warm_s + window_s)
    if not measured.any():
        measured = np.ones_like(arrival, dtype=bool)
    done = result.completed
    ttft = np.nan_to_num(result.ttft_s, nan=math.inf)
    tpot = np.where(result.output_tokens <= 1, 0.0, np.nan_to_num(result.tpot_s, nan=math.inf))
    ok = (ttft <= slo[0]) & (tpot <= slo[1]) & done
    both = float(ok[measured].mean())
    sel = measured & done
    energy = float(np.nanmean(result.energy_j[sel])) if sel.any() else math.nan
    hits = (result.hit_hbm_tokens + result.hit_dram_tokens + result.hit_disk_tokens)[measured].sum()
    return both, energy, float(hits / max(1, result.prompt_tokens[measured].sum()))


def _attainment_and_energy(profile: str | EngineProfile, rate: float, slo: tuple[float, float], prompt: int,
                           output: int, shape: tuple[float, float] | None = None,
                           dram_bytes: int = 0) -> tuple[float, float, float]:
    """(attainment, energy per request, hit fraction); ``shape``: multi-turn conversations of that shape."""
    if shape is not None:
        return _replay_conversations(profile, rate, slo, output, shape, dram_bytes)
    result = replay(_poisson(rate, prompt, output, seed=7), FleetConfig((EngineSpec(profile),), seed=7))
    both = result.slo_attainment(slo[0], slo[1])["both"]
    done = result.completed
    energy = float(np.nanmean(result.energy_j[done])) if done.any() else math.nan
    return both, energy, 0.0


@lru_cache(maxsize=512)
def predict(profile: str | EngineProfile, ttft_s: float, tpot_s: float, target: float, prompt: int,
            output: int, prefix_hit_fraction: float = 0.0, dram_bytes: int = 0) -> Capability:
    """Simulator prediction (see the module docstring); deterministic. ``profile`` is a name of the simulator's
    data file or a built ``EngineProfile`` (e.g. one scaled to a MIG slice the file has no profile for);
    ``prefix_hit_fraction``: the measured share of prompts found in a cache (``hit_fraction_step``), which sets
    the conversations' shape; ``dram_bytes``: a DRAM cache tier per engine (conversation replays only)."""
    if not 0.0 <= prefix_hit_fraction < 1.0:
        raise ValueError(f"prefix_hit_fraction: must be in [0, 1), got {prefix_hit_fraction}")
    if dram_bytes < 0:
        raise ValueError(f"dram_bytes: must be >= 0, got {dram_bytes}")
    model = PerfModel(profile if isinstance(profile, EngineProfile) else load_profile(profile))
    label = profile.name if isinstance(profile, EngineProfile) else profile
    ttft0, tpot0 = model.unloaded_request_s(prompt, output)
    e2e0 = ttft0 + tpot0 * max(output - 1, 0)
    idle_w = model.power_w(0.0)
    if ttft0 > ttft_s or tpot0 > tpot_s:  # not even one request alone meets the SLO
        return Capability(0.0, idle_w, 0.0, "predicted", f"{label}: unloaded TTFT {ttft0:.3f} s / TPOT "
                          f"{tpot0:.4f} s miss the SLO")
    shape = conversation_shape(prefix_hit_fraction, prompt, output) if prefix_hit_fraction > 0 else None

    seen: dict[float, tuple[float, float]] = {}

    def run(rate: float) -> tuple[float, float, float]:
        ok, energy, hit = _attainment_and_energy(profile, rate, (ttft_s, tpot_s), prompt, output, shape, dram_bytes)
        seen[rate] = (ok, energy)
        return ok, energy, hit

    lo, hi = 0.0, max(1.0 / max(e2e0, 1e-3), 0.05)
    energy_lo, hit_lo = math.nan, 0.0
    # Grow hi until the SLO breaks, then bisect.
    for _ in range(12):
        ok, energy, hit = run(hi)
        if ok < target:
            break
        lo, energy_lo, hit_lo = hi, energy, hit
        hi *= 2.0
    for _ in range(BISECT_STEPS):
        mid = (lo + hi) / 2.0
        ok, energy, hit = run(mid)
        if ok >= target:
            lo, energy_lo, hit_lo = mid, energy, hit
        else:
            hi = mid
    if math.isnan(energy_lo):
        _, energy_lo, hit_lo = run(max(lo, hi / 4.0))
    if shape is not None:
        label = (f"{label}, conversations of {shape[0]:g} turns ({prefix_hit_fraction:.0%} of prompts reusable), "
                 f"{hit_lo:.0%} hit in its KV memory at capacity")
    curve = tuple((rate, ok, energy) for rate, (ok, energy) in sorted(seen.items()))
    return Capability(lo, idle_w, energy_lo if math.isfinite(energy_lo) else 0.0, "predicted", label,
                      hit_lo if shape is not None else 0.0, curve)


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
