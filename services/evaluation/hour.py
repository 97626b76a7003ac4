"""One pool's hour replayed through the simulator, with the state the pool carries from hour to hour.

The day is replayed as back-to-back windows (``window_s`` of traffic standing for each hour), and what a real
fleet carries across an hour boundary is carried from one window to the next:

* **Cache contents.** Every engine's HBM prefix cache, LMCache DRAM and disk contents at the end of a window are
  where the next window starts (``replay(..., initial_contents=)``). An engine the plan stops weighting keeps its
  contents (it idles); when it is weighted again it starts from them.
* **Conversations in flight.** Turns of the window's conversations that arrive after the window's end are the first
  arrivals of the next window (times shifted by the window), so a conversation that straddles the boundary finds
  its history in the cache the previous hour filled.
* **Resizes restart the DRAM tier.** LMCache fixes its L1 size at start: a new DRAM size is a controlled restart
  (``cache_manager/resize.py``) and the L1 comes back empty, so an engine whose cache size changes starts the hour
  with an empty DRAM tier (its HBM prefix cache and disk tier are kept) and warms up again: charged as the misses
  (recomputed prefill, its energy and latency) the replay measures.
* **Warm start.** The first hour starts from a window of the same traffic replayed before it under its plan (the
  previous evening is not part of the day), so that hour 0 is not charged a cold start no other hour pays.

Not carried: requests queued or running at the window's end (each window's replay runs its requests to completion).

Routing is the router's (``ConversationAffinity``): a conversation's turns go to one engine chosen by weighted
rendezvous hashing with the plan's weights, so the history a turn left in that engine's caches is there for the next.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from greenserve.simulator.engine_profile import EngineProfile, load_profile
from greenserve.simulator.mode_configs import SpecDecodeConfig
from greenserve.simulator.replay import replay
from greenserve.simulator.replay_fleet import EngineSpec, FleetConfig
from greenserve.simulator.workloads import Workload, multi_turn_workload

MEAN_TURNS = 4.0
# Block and conversation ids of hour h are offset by (h + 1) x ID_STRIDE so that two hours never share an id by
# chance (multi_turn_workload numbers both from 1 for every seed); the shared system prompt's ids (negative) stay.
ID_STRIDE = 1 << 40

Row = tuple[float, int, int, tuple[int, ...], int]  # arrival (s from the window's start), prompt, output, blocks, conv


@dataclass
class PoolState:
    """What one pool carries into its next hour."""

    contents: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)  # engine id -> tier -> blocks
    tail: list[Row] = field(default_factory=list)  # turns due after the last window, times from its end
    cache_bytes: int | None = None  # DRAM size per engine in force (None: nothing yet)
    spec: SpecDecodeConfig | None | bool = False  # speculative decoding in force (False: nothing yet)
    engines: frozenset[str] | None = None  # engine ids running (None: nothing yet)


def restart_changed(state: PoolState, engine_ids: list[str]) -> int:
    """A new set of engines (a MIG layout change: an instance's id names its GPU, slice and variant): engines no
    longer running are gone with their caches, the new ones start empty; returns how many started."""
    ids = frozenset(engine_ids)
    started = 0
    if state.engines is not None and ids != state.engines:
        started = len(ids - state.engines)
        state.contents = {eid: held for eid, held in state.contents.items() if eid in ids}
    state.engines = ids
    return started


@dataclass(frozen=True)
class HourOutcome:
    ttft_fraction: float
    tpot_fraction: float
    both_fraction: float
    requests_measured: int
    dynamic_energy_per_request_j: float  # above the engines' idle power
    prefix_hit_fraction: float  # prompt tokens found in some cache tier / prompt tokens
    cache_restarts: int  # engines whose DRAM tier restarted empty for a new size this hour
    engine_restarts: int = 0  # engines restarted for a new serving mode (HBM and DRAM caches empty)
    requests_by_engine: dict[str, int] = field(default_factory=dict)  # the window's requests each engine served


def hour_rows(rate_per_s: float, window_s: float, seed: int, hour: int) -> list[Row]:
    """The conversations that start in the window (GreenCache's multi-turn chat at ``rate_per_s`` requests/s),
    with ids unique to ``hour``; turns may fall after the window (they are the next window's tail)."""
    n_conv = max(2, int(rate_per_s / MEAN_TURNS * window_s))
    work = multi_turn_workload(n_conv, rate_per_s / MEAN_TURNS, seed=seed, mean_turns=MEAN_TURNS)
    offset = (hour + 1) * ID_STRIDE
    return [(float(t), int(p), int(o), tuple(b + offset if b > 0 else b for b in blocks), int(s) + offset)
            for t, p, o, blocks, s in zip(work.arrival_s, work.prompt_tokens, work.output_tokens, work.block_hashes,
                                          work.session_ids)]


def split_window(rows: list[Row], window_s: float) -> tuple[list[Row], list[Row]]:
    """(turns inside the window, sorted; turns after it with times shifted to the next window)."""
    inside = sorted((r for r in rows if r[0] < window_s), key=lambda r: r[0])
    after = [(r[0] - window_s, *r[1:]) for r in rows if r[0] >= window_s]
    return inside, after


def _workload(rows: list[Row], block_tokens: int) -> Workload:
    return Workload("evaluation-hour", [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                    [r[3] for r in rows], block_tokens, [r[4] for r in rows])


_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of ``x``."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class ConversationAffinity:
    """The router's routing in the replay (router/routing/policy.py): every turn of a conversation goes to the engine that
    weighted rendezvous hashing of its conversation picks (score ``w / -ln(u)``, ``u`` from the conversation and the
    engine), each engine winning a share of conversations proportional to its plan weight; an engine more than
    ``load_slack`` requests above the least loaded candidate is passed over for the next in the conversation's
    order (bounded loads)."""

    __slots__ = ("load_slack", "salts", "weights")

    def __init__(self, weights: list[float], engine_salts: list[int], load_slack: int = 8) -> None:
        self.weights = weights
        self.salts = engine_salts
        self.load_slack = load_slack

    def choose(self, sim: Any, r: int, candidates: list[int]) -> int:
        key = sim.w.session_ids[r] if sim.w.session_ids else r
        engines = sim.engines
        least = min(engines[e].outstanding for e in candidates)
        # highest score first: w / -ln(u), i.e. the lowest w / ln(u)
        order = sorted(candidates, key=lambda e: self.weights[e] / math.log((_mix64(key ^ self.salts[e]) + 0.5)
                                                                            / 2.0 ** 64))
        for e in order:
            if self.weights[e] > 0 and engines[e].outstanding <= least + self.load_slack:
                return e
        return min(candidates, key=lambda e: (engines[e].outstanding, e))


def replay_hour(profile: str, engine_ids: list[str], rate_per_s: float, weights: dict[str, float], cache_bytes: int,
                ttft_s: float, tpot_s: float, seed: int, hour: int, window_s: float, state: PoolState,
                block_tokens: int = 256, spec: SpecDecodeConfig | None = None,
                engine_profiles: dict[str, EngineProfile] | None = None) -> HourOutcome:
    """Replays one pool's window from ``state`` and leaves in ``state`` what the next window starts from; ``spec``:
    the engines run speculative decoding (a SpecDecode serving mode). A change of mode restarts the engines: their
    HBM prefix cache and LMCache DRAM come back empty. ``engine_profiles``: a profile per engine id (MIG instances,
    each its variant on its slice) instead of ``profile`` for all."""
    used = [eid for eid in engine_ids if weights.get(eid, 0.0) > 0] or list(engine_ids)
    whole = load_profile(profile)
    profiles = {eid: (engine_profiles or {}).get(eid, whole) for eid in engine_ids}
    restarts = engine_restarts = 0
    if state.cache_bytes is not None and cache_bytes != state.cache_bytes:
        for eid in engine_ids:  # every engine's LMCache restarts at the new size: its L1 comes back empty
            held = state.contents.get(eid)
            if held is not None:
                state.contents[eid] = {**held, "dram": ()}
            restarts += 1
    state.cache_bytes = cache_bytes
    if state.spec is not False and state.spec != spec:  # engines restarted in the new mode
        for eid in engine_ids:
            held = state.contents.get(eid)
            if held is not None:
                state.contents[eid] = {**held, "hbm": (), "dram": ()}
        engine_restarts = len(engine_ids)
    state.spec = spec
    new_rows = hour_rows(rate_per_s, window_s, seed, hour) if rate_per_s > 0 else []
    inside, after = split_window(state.tail + new_rows, window_s)
    state.tail = after
    if not inside:
        return HourOutcome(1.0, 1.0, 1.0, 0, 0.0, 0.0, restarts, engine_restarts)
    work = _workload(inside, block_tokens)
    specs = tuple(EngineSpec(profiles[eid], dram_capacity_tokens=int(cache_bytes / max(
        profiles[eid].kv_bytes_per_token, 1.0)), spec=spec) for eid in used)
    policy = ConversationAffinity([max(weights.get(eid, 1.0), 1e-9) for eid in used],
                                  [_mix64(zlib.crc32(eid.encode())) for eid in used])
    result = replay(work, FleetConfig(specs, policy=policy, seed=seed),
                    initial_contents=[state.contents.get(eid, {}) for eid in used])
    for eid, held in zip(used, result.tier_contents):
        state.contents[eid] = held
    ttft = np.nan_to_num(result.ttft_s, nan=math.inf)
    tpot = np.where(result.output_tokens <= 1, 0.0, np.nan_to_num(result.tpot_s, nan=math.inf))
    done = result.completed
    ok_t = (ttft <= ttft_s) & done
    ok_p = (tpot <= tpot_s) & done
    # the dynamic energy (above idle) per request: the hour charges every engine's idle power separately
    idle_j = sum(profiles[eid].idle_w for eid in used) * result.makespan_s
    dynamic_j = max(0.0, result.fleet_energy_j - idle_j) / len(inside)
    hits = result.hit_hbm_tokens.sum() + result.hit_dram_tokens.sum() + result.hit_disk_tokens.sum()
    served = np.bincount(np.asarray(result.engine, dtype=np.int64), minlength=len(used))
    return HourOutcome(float(ok_t.mean()), float(ok_p.mean()), float((ok_t & ok_p).mean()), len(inside),
                       dynamic_j,
                       float(hits / max(1, result.prompt_tokens.sum())), restarts, engine_restarts,
                       {eid: int(n) for eid, n in zip(used, served)})


def warm_start(profile: str, engine_ids: list[str], rate_per_s: float, weights: dict[str, float], cache_bytes: int,
               seed: int, window_s: float, state: PoolState, spec: SpecDecodeConfig | None = None,
               engine_profiles: dict[str, EngineProfile] | None = None) -> None:
    """Fills ``state`` with a window of the first hour's traffic replayed before it (ids of hour -1)."""
    replay_hour(profile, engine_ids, rate_per_s, weights, cache_bytes, math.inf, math.inf, seed + 7919, -1,
                window_s, state, spec=spec, engine_profiles=engine_profiles)
