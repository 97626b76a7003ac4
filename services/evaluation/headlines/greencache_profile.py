"""GreenCache's profile, by replay (GreenCache Sec. 5.2): cache size x request rate -> TTFT and TPOT attainment and
the server's power, each point a replay of the simulator on one engine with the SSD tier preloaded so that the token
hit rate is GreenCache's (``greencache_setting.hit_rate``); and the sustainable rate the day's peak is scaled to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from greenserve.evaluation.headlines.greencache_setting import (
    BLOCK_TOKENS,
    MAX_TB,
    OURS_WORKLOAD,
    PROFILE,
    RHO,
    TPOT_SLO_S,
    TTFT_SLO_S,
    WorkloadShape,
    hit_rate,
)
from greenserve.simulator.replay import replay
from greenserve.simulator.replay_fleet import EngineSpec, FleetConfig
from greenserve.simulator.workloads import Workload, multi_turn_workload

__all__ = ["CacheSizeProfile", "build_profile", "profile_from_size", "prompt_stats", "sustainable_rate"]


@dataclass(frozen=True)
class _Turns:
    """Conversation turns to draw requests from: prompt, output and the previous turn's prompt (the context
    LMCache saved at that turn's prefill, which this turn can reuse)."""

    prompt: np.ndarray
    output: np.ndarray
    prev_prompt: np.ndarray


@lru_cache(maxsize=4)
def _turns(seed: int, shape: WorkloadShape) -> _Turns:
    conv = multi_turn_workload(3000, 1.0, seed=seed, mean_turns=shape.mean_turns,
                               mean_user_tokens=shape.mean_user_tokens, mean_output_tokens=shape.mean_output_tokens,
                               block_tokens=BLOCK_TOKENS)
    last: dict[int, int] = {}
    prompt, output, prev = [], [], []
    order = np.argsort(conv.arrival_s, kind="stable")
    for i in order:
        sid = conv.session_ids[i]
        p = conv.prompt_tokens[i]
        # a truncated (8k) prompt changed its prefix: nothing of the previous turn is reusable
        before = last.get(sid, 0)
        prompt.append(p)
        output.append(conv.output_tokens[i])
        prev.append(before if p < 8192 else 0)
        last[sid] = p
    return _Turns(np.asarray(prompt), np.asarray(output), np.asarray(prev))


def _workload(rate_per_s: float, n: int, size_tb: float, seed: int,
              shape: WorkloadShape | None = None) -> tuple[Workload, list[int]]:
    """``n`` turns drawn at random (GreenCache: a random conversation's next turn), Poisson arrivals at
    ``rate_per_s``; each request's previous-turn context is on the SSD with the probability that makes the token
    hit rate ``hit_rate(size_tb)``. Block ids are unique per request, so the only hits are the preloaded ones.
    Returns the workload and the blocks to preload on the disk tier."""
    turns = _turns(1, shape or OURS_WORKLOAD)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(turns.prompt), size=n)
    prompt, output, prev = turns.prompt[pick], turns.output[pick], turns.prev_prompt[pick]
    reusable = (prev // BLOCK_TOKENS) * BLOCK_TOKENS
    target = hit_rate(size_tb) * float(prompt.sum())
    q = min(1.0, target / float(reusable.sum())) if reusable.sum() > 0 else 0.0
    hit = rng.random(n) < q
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, size=n))
    hashes: list[tuple[int, ...]] = []
    preload: list[int] = []
    next_id = 1
    for i in range(n):
        blocks = int(prompt[i]) // BLOCK_TOKENS
        ids = tuple(range(next_id, next_id + blocks))
        next_id += blocks
        hashes.append(ids)
        if hit[i]:
            preload.extend(ids[: int(reusable[i]) // BLOCK_TOKENS])
    work = Workload(f"greencache-turns-{rate_per_s:g}rps", arrivals.tolist(), prompt.tolist(), output.tolist(),
                    hashes, BLOCK_TOKENS)
    return work, preload


@dataclass(frozen=True)
class _Point:
    ttft_ok: float
    tpot_ok: float
    power_w: float
    hit_rate: float


def _point(size_tb: float, rate_per_s: float, n: int, seed: int, shape: WorkloadShape | None = None) -> _Point:
    work, preload = _workload(rate_per_s, n, size_tb, seed, shape)
    # room for the preloaded contexts and every prompt written through during the replay: nothing is evicted, so
    # the hit rate is the one the preload sets (the cache size acts through it and through the SSD's carbon)
    capacity = (len(preload) + sum(len(h) for h in work.block_hashes) + 1) * BLOCK_TOKENS
    spec = EngineSpec(PROFILE, disk_capacity_tokens=capacity, prefix_caching=False, reuse_rule="always")
    result = replay(work, FleetConfig((spec,), seed=seed), initial_contents=[{"disk": preload}])
    warm = np.asarray(result.arrival_s) >= work.arrival_s[0] + 0.2 * work.duration_s  # drop the first fifth
    done = result.completed[warm]
    ttft = np.nan_to_num(result.ttft_s[warm], nan=math.inf)
    tpot = np.where(result.output_tokens[warm] <= 1, 0.0, np.nan_to_num(result.tpot_s[warm], nan=math.inf))
    power = result.fleet_energy_j / result.makespan_s if result.makespan_s > 0 else 0.0
    hits = float(result.hit_disk_tokens.sum()) / float(result.prompt_tokens.sum())
    return _Point(float(((ttft <= TTFT_SLO_S) & done).mean()), float(((tpot <= TPOT_SLO_S) & done).mean()),
                  float(power), hits)


@dataclass(frozen=True)
class CacheSizeProfile:
    sizes_tb: tuple[int, ...]
    rates_per_s: tuple[float, ...]
    points: tuple[tuple[_Point, ...], ...]  # [size][rate]

    def at(self, k: int, rate_per_s: float) -> tuple[float, float, float]:
        """(TTFT attainment, TPOT attainment, power W) of size index ``k`` at ``rate_per_s`` (linear in rate)."""
        row = self.points[k]
        r = self.rates_per_s
        return (float(np.interp(rate_per_s, r, [p.ttft_ok for p in row])),
                float(np.interp(rate_per_s, r, [p.tpot_ok for p in row])),
                float(np.interp(rate_per_s, r, [p.power_w for p in row])))


def build_profile(rates_per_s: tuple[float, ...], *, sizes_tb: tuple[int, ...], requests: int,
                  seed: int = 7, shape: WorkloadShape | None = None) -> CacheSizeProfile:
    points = tuple(tuple(_point(s, r, requests, seed, shape) for r in rates_per_s) for s in sizes_tb)
    if sizes_tb != tuple(range(MAX_TB + 1)):  # interpolate the missing 1 TB sizes (smooth in the hit rate)
        full_sizes = tuple(range(MAX_TB + 1))
        pts = []
        for size in full_sizes:
            row = []
            for c in range(len(rates_per_s)):
                vals = [[getattr(points[i][c], f) for i in range(len(sizes_tb))]
                        for f in ("ttft_ok", "tpot_ok", "power_w", "hit_rate")]
                row.append(_Point(*(float(np.interp(size, sizes_tb, v)) for v in vals)))
            pts.append(tuple(row))
        return CacheSizeProfile(full_sizes, rates_per_s, tuple(pts))
    return CacheSizeProfile(sizes_tb, rates_per_s, points)


def sustainable_rate(*, requests: int, seed: int = 7, lo: float = 0.05, hi: float = 4.0,
                     shape: WorkloadShape | None = None, resolution: float = 0.02) -> float:
    """Highest prompt rate at which the full cache (16 TB) still meets both SLOs for 90 % of requests (bisection
    on the replay to ``resolution`` prompts/s): the peak the Azure shape is scaled to (GreenCache Sec. 6.1)."""
    def ok(rate: float) -> bool:
        p = _point(MAX_TB, rate, requests, seed, shape)
        return p.ttft_ok >= RHO and p.tpot_ok >= RHO
    if not ok(lo):
        return lo
    while hi - lo > resolution:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo



def profile_from_size(profile: CacheSizeProfile, min_tb: int) -> CacheSizeProfile:
    """The profile without the sizes below ``min_tb`` (GreenCache's sweeps start at 1 TB: Sec. 3.1.3)."""
    keep = [i for i, s in enumerate(profile.sizes_tb) if s >= min_tb]
    return CacheSizeProfile(tuple(profile.sizes_tb[i] for i in keep), profile.rates_per_s, tuple(profile.points[i] for i in keep))


def prompt_stats(shape: WorkloadShape) -> dict[str, float]:
    p = _turns(1, shape).prompt
    return {"mean_tokens": round(float(p.mean())), "p90_tokens": round(float(np.percentile(p, 90))),
            "share_over_1000_tokens": round(float((p > 1000).mean()), 3)}
