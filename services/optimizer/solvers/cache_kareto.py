"""Cache tiers per pool by Kareto's adaptive Pareto search (Algorithm 1, ``cache_pareto``): the ``cache_targets``
knob with ``--cache-solver kareto``.

For every pool that declares a cache limit (``max_cache_dram_bytes`` and/or ``max_cache_disk_bytes``) the search
runs over DRAM size x disk size, each from 0 to the pool's limit on the pool's ``cache_step_bytes`` grid (at most
``FINE_STEPS`` steps per axis); a tier the pool does not declare stays 0. Each point is scored by replaying a window
of the pool's traffic through the simulator (``greenserve.simulator.replay``), one engine of the pool's performance
profile with an LMCache DRAM and disk tier of those sizes:

* the window: ``window_s`` (600 s by default, as the cache profiles: conversations need minutes to reach a steady
  state; longer when the rate is low, at most MAX_REQUESTS requests) of the pool's own recorded traffic
  (``inputs.traffic``: the same hour yesterday, else last week, else the most recent hour with recorded accesses,
  from the cache-manager's access history and the forecaster's load history; ``traffic_history.py`` and
  ``replay_trace.py``), thinned by whole conversations and time-scaled to the pool's forecast rate for the first
  hour of the horizon, per engine (two significant digits: replays are cached and reused by later plans). A pool
  without recorded traffic replays GreenCache's multi-turn conversations at that rate instead, and the
  explanation says which was replayed. A recorded window shorter than ``window_s`` at the forecast rate is
  replayed whole. The first third of the window warms the caches and is not measured.
* the three objectives (Kareto Eq. 1-2): latency = mean TTFT of the measured requests (an incomplete one counts as
  the window length), throughput = measured requests completed per second, cost = carbon per hour of the pool:
  the replay's energy per request x the rate at the horizon's mean forecast CI and the PUE, plus the embodied
  carbon of the allocated DRAM and disk of every LMCache server (GreenCache Eq. 4 per tier).

The plan takes, among all evaluated points, the lowest-carbon one whose TTFT and TPOT attainment both meet the
pool's target (or, when none does, the best-attaining one and says so), for every hour of the horizon (one
configuration: no restart inside the plan). The Pareto set is kept in the solver's detail and summarised in the
explanation. The search stops at ``max_evaluations`` or ``time_limit_s`` (then the points scored so far are used).
With ``ttl_max_s`` > 0 (``--cache-kareto-ttl-max-s``) the second axis is the disk tier's TTL instead of its size
(Kareto's DRAM x TTL search): 0 (no TTL, the whole disk allocated) to ``ttl_max_s`` in 8 steps, the disk at the
pool's limit and elastic (idle entries leave after the TTL), its embodied carbon charged for what it held on average
over the replay (Kareto's Capacity x TTL cost; the warm-up third is in that average); the plan's ``ttl_s`` is the
chosen TTL, which the cache-manager applies pool-wide.

The disk medium: a pool that declares two or more disks (``Pool.disk_tiers``: medium, LMCache folder, largest size)
gets one such 2-D search per medium (the medium a categorical axis; each search has ``max_evaluations`` // media
evaluations, at least 4, and an equal share of the time left), the disk replayed at the medium's bandwidth
(``simulator.tiers.DISK_MEDIA``) and charged at its embodied rate (``CarbonParams.disk_rate``: an HDD TB 1/8
of an SSD TB). The points are merged with the medium as their tag (the no-disk points, the same replay on every
medium, once), the Pareto set is taken over all of them and the lowest-carbon point meeting the SLO wins; the plan's
target carries its ``disk_medium`` and ``disk_path`` and the explanation says why that medium (``media_text``). One
declared medium searches as an undeclared disk does, the target naming it.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np
from greenserve.common import carbon
from greenserve.common.carbon_params import CarbonParams
from greenserve.optimizer.planning import KnobPlan, PlanningInputs
from greenserve.optimizer.replay_trace import ReplayTrace
from greenserve.optimizer.solvers.cache_greencache import _size_text, pool_profile
from greenserve.optimizer.solvers.cache_pareto import (
    ScoredPoint,
    adaptive_search,
    grid_search,
    pareto_filter,
)
from greenserve.optimizer.solvers.keep_current import KeepCurrent
from greenserve.simulator.engine_profile import load_profile
from greenserve.simulator.perf_model import PerfModel
from greenserve.simulator.replay import replay
from greenserve.simulator.replay_fleet import EngineSpec, FleetConfig
from greenserve.simulator.workloads import Workload, multi_turn_workload
from greenserve.v1 import common_pb2

FINE_STEPS = 16  # at most this many fine steps per axis (the step is coarsened beyond)
START_STEPS = 2  # the coarse start grid: 0, half and the whole limit per axis
MEAN_TURNS = 4.0
SCORE_CACHE_SIZE = 4096
MAX_REQUESTS = 3000  # per replay (as the cache profiles): about 1 s each on the shared 2-core box at 8 requests/s


@dataclass(frozen=True)
class PointScore:
    """One replayed configuration of one engine."""

    latency_s: float
    throughput_per_s: float
    power_w: float  # idle + measured energy per request x rate (as the cache profiles' power)
    ttft_attainment: float
    tpot_attainment: float
    disk_mean_bytes: float = 0.0  # the disk tier's mean allocated size (its size, or what an elastic tier held)


def replay_workload(rate_per_s: float, window_s: float, seed: int = 7,
                    trace: ReplayTrace | None = None) -> tuple[Workload, float, str]:
    """What a point replays: the pool's recorded ``trace`` at ``rate_per_s`` (cut at ``window_s``), else
    multi-turn conversations at that rate; (workload, the window's length, how it was made)."""
    if trace is not None:
        return trace.workload(rate_per_s, window_s, seed)
    n_conversations = max(4, int(rate_per_s / MEAN_TURNS * window_s))
    workload = multi_turn_workload(n_conversations, rate_per_s / MEAN_TURNS, seed=seed, mean_turns=MEAN_TURNS)
    return workload, window_s, "synthetic multi-turn conversations"


_SCORES: OrderedDict[tuple, PointScore] = OrderedDict()  # the last SCORE_CACHE_SIZE scores, oldest first
_SCORES_LOCK = threading.Lock()


def score_point(profile: str, dram_bytes: int, disk_bytes: int, rate_per_s: float, window_s: float,
                ttft_slo_s: float, tpot_slo_s: float, seed: int = 7, disk_ttl_s: float = 0.0,
                trace: ReplayTrace | None = None, disk_medium: str = "") -> PointScore:
    """Replay ``window_s`` of the pool's recorded ``trace`` (else multi-turn conversations) at ``rate_per_s``
    through one engine with these tiers (a ``disk_ttl_s`` > 0 makes the disk tier elastic: idle entries leave
    after it); the last two thirds are measured. Deterministic (same arguments, same answer), so the last
    SCORE_CACHE_SIZE scores are kept for later plans, keyed by the trace's digest: a cache keyed by the trace itself
    would hold every recorded window it saw (about 1.7 MB per 5,000 requests)."""
    if disk_bytes <= 0:
        disk_medium = ""  # no disk tier: the medium changes nothing, so every medium shares the replay
    key = (profile, dram_bytes, disk_bytes, rate_per_s, window_s, ttft_slo_s, tpot_slo_s, seed, disk_ttl_s,
           trace.digest if trace is not None else "", disk_medium)
    with _SCORES_LOCK:
        hit = _SCORES.get(key)
        if hit is not None:
            _SCORES.move_to_end(key)
            return hit
    score = _replay_score(profile, dram_bytes, disk_bytes, rate_per_s, window_s, ttft_slo_s, tpot_slo_s, seed,
                          disk_ttl_s, trace, disk_medium)
    with _SCORES_LOCK:
        _SCORES[key] = score
        while len(_SCORES) > SCORE_CACHE_SIZE:
            _SCORES.popitem(last=False)
    return score


def _replay_score(profile: str, dram_bytes: int, disk_bytes: int, rate_per_s: float, window_s: float,
                  ttft_slo_s: float, tpot_slo_s: float, seed: int, disk_ttl_s: float,
                  trace: ReplayTrace | None, disk_medium: str = "") -> PointScore:
    model = PerfModel(load_profile(profile))
    per_token = max(model.profile.kv_bytes_per_token, 1.0)
    workload, window_s = replay_workload(rate_per_s, window_s, seed, trace)[:2]
    spec = EngineSpec(profile, dram_capacity_tokens=int(dram_bytes / per_token),
                      disk_capacity_tokens=int(disk_bytes / per_token), disk_ttl_s=disk_ttl_s,
                      disk_medium=disk_medium)
    result = replay(workload, FleetConfig((spec,), seed=seed))
    arrivals = np.asarray(result.arrival_s)
    measured = np.flatnonzero((arrivals >= window_s / 3.0) & (arrivals < window_s))
    disk_mean = float(disk_bytes)
    if disk_ttl_s > 0:  # Kareto's Capacity x TTL cost: what the elastic tier held on average over the replay
        disk_mean = result.tier_allocated_byte_seconds.get("disk", 0.0) / max(result.makespan_s, 1e-9)
    if len(measured) == 0:
        return PointScore(0.0, 0.0, model.power_w(0.0), 1.0, 1.0, disk_mean)
    done = result.completed[measured]
    ttft = np.where(done, np.nan_to_num(result.ttft_s[measured], nan=window_s), window_s)
    tpot = np.where(result.output_tokens[measured] <= 1, 0.0, np.nan_to_num(result.tpot_s[measured], nan=math.inf))
    energy = result.energy_j[measured][done]
    span = max(float(arrivals[measured].max() - arrivals[measured].min()), 1e-9)
    per_request_j = float(np.mean(energy)) if len(energy) else 0.0
    return PointScore(float(ttft.mean()), float(done.sum()) / span, float(model.power_w(0.0) + per_request_j * rate_per_s),
                      float(((ttft <= ttft_slo_s) & done).mean()), float(((tpot <= tpot_slo_s) & done).mean()),
                      disk_mean)


class _OutOfTime(Exception):
    pass


@dataclass
class PoolSearch:
    """The search of one pool: every scored point (sizes in bytes), its Pareto set and the choice."""

    pool: str
    points: list[ScoredPoint]
    pareto: list[ScoredPoint]
    attainment: dict[tuple[str, float, float], float]  # by (tag, x, y) of a point
    chosen: ScoredPoint
    meets_slo: bool
    rho: float
    rounds: int
    grid_points: int
    stopped: str  # "" or why the search stopped early
    seconds: float
    ttl_disk_bytes: int | None = None  # with the TTL axis: the disk size (y is then the disk tier's TTL, s)
    traffic: str = ""  # what the points replayed (the pool's recorded window, or the synthetic shape and why)
    media: tuple[DiskMedium, ...] = ()  # the declared disk media searched (empty: the profile's disk, undeclared)

    def attained(self, p: ScoredPoint) -> float:
        """The point's SLO attainment (the lower of TTFT's and TPOT's)."""
        return self.attainment[(p.tag, p.x, p.y)]

    def medium(self, p: ScoredPoint) -> DiskMedium | None:
        """The declared disk medium of a point (None: no disk tier, or no medium declared)."""
        return next((m for m in self.media if m.medium == p.tag), None) if p.tag else None

    def target(self, p: ScoredPoint) -> tuple[int, int, float, str]:
        """(DRAM bytes, disk bytes, TTL s, disk medium) of a point."""
        m = self.medium(p)
        if self.ttl_disk_bytes is not None:
            return int(p.x), m.limit_bytes if m else self.ttl_disk_bytes, float(p.y), p.tag
        return int(p.x), int(p.y), 0.0, p.tag

    def text(self, p: ScoredPoint) -> str:
        dram, disk, ttl, medium = self.target(p)
        return (f"DRAM {_size_text(dram)}, disk {_size_text(disk)}" + (f" on {medium}" if medium and disk else "")
                + (f" TTL {ttl:g} s" if ttl else ""))


@dataclass(frozen=True)
class DiskMedium:
    """A disk the pool declares for its L2 tier (``Pool.disk_tiers``): medium, LMCache folder, largest size."""

    medium: str
    path: str
    limit_bytes: int


def declared_media(pool: common_pb2.Pool) -> tuple[DiskMedium, ...]:
    """The pool's declared disk tiers, each with its limit (its max_bytes, else the pool's max_cache_disk_bytes)."""
    return tuple(DiskMedium(t.medium, t.path, int(t.max_bytes or pool.max_cache_disk_bytes))
                 for t in pool.disk_tiers)


def _axis(limit: int, step: int) -> tuple[float, float]:
    """(fine step, start step) of an axis 0..limit: ``n`` equal fine steps (the pool's step, at most FINE_STEPS of
    them, an even number when more than one) and the start grid 0, limit / 2, limit; a tier without a limit has the
    single point 0."""
    if limit <= 0:
        return 1.0, 1.0
    n = min(FINE_STEPS, max(1, limit // max(step or (1 << 30), 1)))
    if n > 1:
        n -= n % 2
    fine = limit / n
    return fine, fine * max(1, n // START_STEPS)


class KaretoSearch:
    """Kareto's adaptive Pareto search as the ``cache_targets`` solver (module docstring)."""

    knob = "cache_targets"
    name = "cache.kareto"
    wants_traffic_history = True  # the planner fetches each pool's recorded traffic into inputs.traffic

    def __init__(self, *, window_s: float = 600.0, max_evaluations: int = 32, time_limit_s: float = 8.0,
                 perf_threshold: float = 0.02, cost_threshold: float = 0.005, expand_threshold: float = 0.01,
                 ttl_max_s: float = 0.0) -> None:
        for field, value, lo in (("window_s", window_s, 60.0), ("time_limit_s", time_limit_s, 0.0)):
            if not (math.isfinite(value) and value > lo):
                raise ValueError(f"{field}: must be a finite number > {lo:g}")
        if not (math.isfinite(ttl_max_s) and ttl_max_s >= 0):
            raise ValueError("ttl_max_s: must be a finite number >= 0")
        self.ttl_max_s = ttl_max_s
        if max_evaluations < 4:
            raise ValueError("max_evaluations: must be >= 4")
        self.window_s = window_s
        self.max_evaluations = max_evaluations
        self.time_limit_s = time_limit_s
        self.thresholds = {"perf_threshold": perf_threshold, "cost_threshold": cost_threshold,
                           "expand_threshold": expand_threshold}

    def search_pool(self, inputs: PlanningInputs, pool: common_pb2.Pool, deadline: float, *,
                    full_grid: bool = False) -> PoolSearch | None:
        """The search of one pool (``full_grid``: every fine-grid point instead, for the bench's comparison)."""
        dram_limit, disk_limit = int(pool.max_cache_dram_bytes), int(pool.max_cache_disk_bytes)
        if (dram_limit <= 0 and disk_limit <= 0) or not pool.engines:
            return None
        started = time.perf_counter()
        profile = pool_profile(inputs, pool)
        n_engines = len(pool.engines)
        load = inputs.load.get(pool.name)
        # Two significant digits, so that later plans with nearly the same forecast reuse the replays.
        rate = float(f"{max((load.mean[0] if load else 0.0) / n_engines, 0.01):.2g}")
        window_s = min(max(self.window_s, 240 * 1.5 / rate), MAX_REQUESTS / rate)
        trace = inputs.traffic.get(pool.name)
        if trace is not None:
            _, replayed_s, how = trace.workload(rate, window_s)
            traffic = (f"replayed the pool's own traffic of {trace.label}: {len(trace.requests)} requests recorded "
                       f"at {trace.recorded_rate_per_s:.3g}/s, {trace.reused_fraction:.0%} of prompt tokens in "
                       f"shared prefixes, mean output {trace.mean_output_tokens:.0f} tokens ({trace.output_source}); "
                       f"at {rate:g} requests/s per engine: {how}, {replayed_s:.0f} s replayed")
        else:
            why = inputs.traffic_missing.get(pool.name, "the planner did not fetch it")
            traffic = (f"replayed GreenCache's synthetic multi-turn shape at {rate:g} requests/s per engine "
                       f"({window_s:.0f} s): no recorded traffic of the pool ({why})")
        hours = inputs.horizon_hours
        ci = float(np.mean([inputs.ci[pool.region].mean[h] for h in range(hours)])) if pool.region in inputs.ci \
            else 0.0
        slo = (pool.slo.ttft_s or 1.0, pool.slo.tpot_s or 0.2)
        rho = pool.slo.attainment_fraction
        attained: dict[tuple[str, float, float], float] = {}
        media = declared_media(pool)
        # One 2-D search (Algorithm 1) per declared medium, the medium a categorical axis: each gets an equal share of
        # the evaluation budget and of the time left; a pool without declared media searches its profile's disk.
        runs = media or (DiskMedium("", "", disk_limit),)
        ttl_axis = self.ttl_max_s > 0 and disk_limit > 0
        points: list[ScoredPoint] = []
        stops: list[str] = []
        rounds = grid_points = 0
        for k, m in enumerate(runs):
            share = (deadline - time.perf_counter()) / (len(runs) - k)
            budget = max(4, self.max_evaluations // len(runs))
            found, r, grid, stop = self._search_medium(
                m, dram_limit, ttl_axis, profile, rate, window_s, slo, ci, n_engines, trace, inputs, pool,
                attained, min(deadline, time.perf_counter() + share), budget, full_grid)
            points += found
            rounds = max(rounds, r)
            grid_points += grid
            if stop:
                stops.append(f"{m.medium}: {stop}" if m.medium and len(runs) > 1 else stop)
        if not ttl_axis:  # the no-disk points are the same replay whatever the medium: keep one of each
            unique: dict[tuple[str, float, float], ScoredPoint] = {}
            for p in points:
                unique.setdefault((p.tag, p.x, p.y), p)
            points = list(unique.values())
            grid_points -= (len(runs) - 1) * (round(dram_limit / _axis(dram_limit, pool.cache_step_bytes)[0]) + 1
                                              if dram_limit > 0 else 1)
        if not points:
            return None
        pareto = pareto_filter(points)
        ok = [p for p in points if attained[(p.tag, p.x, p.y)] >= rho]
        chosen = min(ok, key=lambda p: (p.cost, p.x + p.y)) if ok else \
            max(points, key=lambda p: (attained[(p.tag, p.x, p.y)], -p.cost))
        return PoolSearch(pool.name, points, pareto, attained, chosen, bool(ok), rho, rounds, grid_points,
                          "; ".join(stops), time.perf_counter() - started, disk_limit if ttl_axis else None, traffic,
                          media)

    def _search_medium(self, m: DiskMedium, dram_limit: int, ttl_axis: bool, profile: str, rate: float,
                       window_s: float, slo: tuple[float, float], ci: float, n_engines: int,
                       trace: ReplayTrace | None, inputs: PlanningInputs, pool: common_pb2.Pool,
                       attained: dict[tuple[str, float, float], float], deadline: float, budget: int,
                       full_grid: bool) -> tuple[list[ScoredPoint], int, int, str]:
        """Algorithm 1 over DRAM x disk size (or TTL) with the disk on medium ``m``: (points tagged with the medium,
        or untagged without a disk; rounds; the full grid's size; why it stopped early or "")."""
        disk_limit = m.limit_bytes
        scored: list[ScoredPoint] = []

        def tag(y: float) -> str:
            return m.medium if ttl_axis or y > 0 else ""

        def evaluate(x: float, y: float) -> tuple[float, float, float]:
            if time.perf_counter() > deadline:
                raise _OutOfTime
            if ttl_axis:  # y is the disk tier's TTL (0: none, the whole disk allocated), the disk at its limit
                s = score_point(profile, int(x), disk_limit, round(rate, 6), window_s, slo[0], slo[1], disk_ttl_s=y,
                                trace=trace, disk_medium=m.medium)
            else:
                s = score_point(profile, int(x), int(y), round(rate, 6), window_s, slo[0], slo[1], trace=trace,
                                disk_medium=m.medium)
            energy_kwh = s.power_w * n_engines * 3600.0 / 3.6e6
            cost = carbon.operational_g(energy_kwh=energy_kwh, ci_g_per_kwh=ci, pue=inputs.params.pue) + \
                n_engines * carbon.cache_tiers_embodied_g(dram_bytes=x, disk_bytes=s.disk_mean_bytes,
                                                          duration_s=3600.0, params=inputs.params,
                                                          disk_medium=m.medium)
            attained[(tag(y), x, y)] = min(s.ttft_attainment, s.tpot_attainment)
            scored.append(ScoredPoint(x, y, s.latency_s, s.throughput_per_s, cost, tag(y)))
            return s.latency_s, s.throughput_per_s, cost

        fx, cx = _axis(dram_limit, pool.cache_step_bytes)
        if ttl_axis:  # 8 fine TTL steps up to ttl_max_s
            fy, cy = self.ttl_max_s / 8, self.ttl_max_s / 2
            y_limit = self.ttl_max_s
        else:
            fy, cy = _axis(disk_limit, pool.cache_step_bytes)
            y_limit = disk_limit
        stopped, rounds = "", 0
        try:
            if full_grid:
                result = grid_search(evaluate, (0.0, float(dram_limit), fx), (0.0, float(y_limit), fy))
            else:
                result = adaptive_search(evaluate, x_start=(0.0, float(dram_limit), cx), y_start=(0.0, float(y_limit), cy),
                                         x_max=float(dram_limit), y_max=float(y_limit), x_fine_step=fx,
                                         y_fine_step=fy, max_evaluations=budget, **self.thresholds)
            points = [replace(p, tag=tag(p.y)) for p in result.points]
            rounds = result.rounds
            if result.stopped_by_budget:
                stopped = f"stopped at {budget} evaluations"
        except _OutOfTime:
            points = scored
            stopped = f"stopped by the {self.time_limit_s:g} s time limit" if len(declared_media(pool)) < 2 else \
                f"stopped by its share of the {self.time_limit_s:g} s time limit"
        grid = (round(dram_limit / fx) + 1 if dram_limit > 0 else 1) * (round(y_limit / fy) + 1 if y_limit > 0 else 1)
        return points, rounds, grid, stopped

    def solve(self, inputs: PlanningInputs) -> KnobPlan:
        started = time.perf_counter()
        deadline = started + self.time_limit_s
        hours = inputs.horizon_hours
        kept = KeepCurrent("cache_targets").solve(inputs).per_interval
        searches = []
        for pool in inputs.fleet.pools:
            s = self.search_pool(inputs, pool, deadline)
            if s is not None:
                searches.append(s)
        searched = {s.pool for s in searches}
        per_interval: list[list[common_pb2.CacheTarget]] = [
            [t for t in kept[h] if t.pool not in searched] for h in range(hours)]
        if not searches:
            return KnobPlan(per_interval, detail="no pool declares a cache limit (max_cache_dram/disk_bytes), or the "
                                                 "time limit ran out before a point was scored: sizes in force kept",
                            status="kept")
        lines, details = [], []
        for s in searches:
            c = s.chosen
            dram, disk, ttl, _ = s.target(c)
            medium = s.medium(c) or (s.media[0] if len(s.media) == 1 else None)
            for h in range(hours):
                per_interval[h].append(common_pb2.CacheTarget(
                    pool=s.pool, dram_bytes=dram, disk_bytes=disk, ttl_s=ttl,
                    disk_medium=medium.medium if medium else "", disk_path=medium.path if medium else ""))
            front = sorted(s.pareto, key=lambda p: p.cost)
            head = ", ".join(f"({s.text(p)}: TTFT {p.latency_s:.3f} s, {p.cost:.1f} g/h)" for p in front[:6])
            more = f" and {len(front) - 6} more" if len(front) > 6 else ""
            why = (f"the lowest-carbon point meeting the SLO (attainment {s.attained(c):.2f}, target "
                   f"{s.rho:.2f})" if s.meets_slo else
                   f"no point meets the SLO: the best-attaining one ({s.attained(c):.2f})")
            if len(s.media) > 1:
                why += f"; {media_text(s, inputs.params)}"
            lines.append(f"pool {s.pool}: Kareto search: {s.text(c)}, "
                         f"{c.cost:.1f} gCO2e/h, mean TTFT {c.latency_s:.3f} s: {why}; {len(s.points)} replays in "
                         f"{s.rounds} rounds (the full grid: {s.grid_points}){'; ' + s.stopped if s.stopped else ''}; "
                         f"Pareto set (sizes: TTFT, carbon) {head}{more}; {s.traffic}")
            details.append(f"{s.pool}{' (last: the disk medium)' if len(s.media) > 1 else ''}: " + "; ".join(
                f"{int(p.x)},{int(p.y)},{p.latency_s:.4f},{p.throughput:.4f},{p.cost:.3f}"
                + (f",{p.tag or 'none'}" if len(s.media) > 1 else "") for p in front)
                + f" [{s.seconds:.2f} s]")
        detail = (f"{len(searches)} pool(s), {sum(len(s.points) for s in searches)} replays, total "
                  f"{time.perf_counter() - started:.2f} s; Pareto sets (dram_bytes,disk_bytes or disk TTL s,ttft_s,"
                  f"requests_per_s,g_per_h): " + " | ".join(details))
        return KnobPlan(per_interval, explanation=lines, detail=detail)


def media_text(s: PoolSearch, params: CarbonParams) -> str:
    """Why the chosen point's disk medium (or none) among the pool's declared media, e.g. ``hdd: 88 % less embodied
    than nvme for 128.0 GiB, TTFT still within the SLO (0.95; nvme's best 31.2 g/h against 30.9 g/h)``."""
    c = s.chosen
    best: dict[str, ScoredPoint] = {}
    for p in s.points:
        if p.tag and s.attained(p) >= s.rho and (p.tag not in best or p.cost < best[p.tag].cost):
            best[p.tag] = p
    parts = [f"{m.medium} best {best[m.medium].cost:.1f} g/h ({s.text(best[m.medium])})" if m.medium in best else
             f"{m.medium}: no disk size meets the SLO" for m in s.media]
    searched = f"media searched: {', '.join(parts)}"
    if not c.tag:
        return f"no disk tier: on no medium does a disk save more than its embodied carbon; {searched}"
    if not s.meets_slo:
        return f"{c.tag}: the best-attaining medium; {searched}"
    others = [m.medium for m in s.media if m.medium != c.tag]
    dearest = max(others, key=lambda o: params.disk_rate(o)[0])
    rate = params.disk_rate(c.tag)[0] / params.disk_rate(dearest)[0] if params.disk_rate(dearest)[0] else 1.0
    if rate < 1.0:
        lead = f"{c.tag}: {1 - rate:.0%} less embodied per TB than {dearest}, TTFT still within the SLO"
    elif any(o in best for o in others):
        lead = f"{c.tag}: its faster reads save more carbon than the other media's lower embodied carbon"
    else:
        lead = f"{c.tag}: the only medium whose disk meets the SLO"
    return f"{lead} (attainment {s.attained(c):.2f}); {searched}"
