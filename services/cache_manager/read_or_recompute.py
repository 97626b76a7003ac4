"""Read-or-recompute decision for a request's cached chunks (StoreLLM Algorithm 1 + Kareto's queue time).

Each chunk of the prompt that is cached in some tier can either be read from that tier (time `read_s`,
energy `read_energy_j`) or recomputed on the GPU (`recompute_s`, `recompute_energy_j`), from the profile.
We choose per chunk to minimise total energy subject to a delay limit (StoreLLM §3.4, Appendix D: a
bounded-knapsack DP over discretised time, `dp[i][j]` = least energy of the first i chunks within j
time steps).

Timing model. The fastest choice takes every chunk's quicker option: `T_fast = sum(min(read_s,
recompute_s))`. The request may take `delay_budget_s` more: `T_max = T_fast + delay_budget_s`. Kareto
(§3, Observations 2 and 4) notes that reads from a slow tier can be done while the request waits in the
queue; we credit the queue wait to the reads: a decision's time is `max(0, R - queue_wait_s) + C`, with R
the summed read time and C the summed recompute time. That limit is `R + C <= T_max + queue_wait_s`
together with `C <= T_max`; the DP runs over the first (one dimension, StoreLLM's form) and the second is
checked on its answer, tightening the capacity by the excess and re-solving when it fails (rare: the
optimum prefers reads, which are the cheap option in energy).

Step size. The DP runs over the time *added* to the fastest plan (a 0/1 knapsack: switching a chunk to
its slower, cheaper option adds |read_s - recompute_s|), discretised into `EPSILON_STEPS` = 2048 steps of
the slack (`eps = (T_max + queue_wait_s - T_fast) / 2048`, at least 1 µs). Added times are rounded UP to
whole steps, so a chosen plan never exceeds the limit in real time; the price is that up to n*eps of the
slack can go unused (`epsilon_s` in `Decision`). Only chunks whose slower option saves energy are items.
Cost: O(items * 2048) vectorised, ~3 numpy calls per item; for a 32k-token prompt in 256-token LMCache
chunks (128 chunks) well under a millisecond (`greenserve bench cache-eviction`, keys
`read_or_recompute_ms_p50/p99`).

Fast paths (exact, no DP): (1) the per-chunk least-energy choice already fits the limit -> it is optimal;
(2) reading is both no slower and no costlier than recomputing for every chunk -> read all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EPSILON_STEPS = 2048
MIN_EPSILON_S = 1e-6
READ, RECOMPUTE = 0, 1


@dataclass(frozen=True)
class Decision:
    """Per-chunk choice (READ or RECOMPUTE, prompt order) with its energy and time."""

    actions: np.ndarray  # int8, READ / RECOMPUTE
    energy_j: float
    time_s: float
    path: str  # "fast-min-energy", "fast-read-all", "dp", "fastest"
    epsilon_s: float = 0.0


def decision_time_s(actions: np.ndarray, read_s: np.ndarray, recompute_s: np.ndarray, queue_wait_s: float) -> float:
    """Time of a decision under the model above: max(0, R - queue_wait) + C."""
    read_total = float(read_s[actions == READ].sum())
    recompute_total = float(recompute_s[actions == RECOMPUTE].sum())
    return max(0.0, read_total - queue_wait_s) + recompute_total


def _finish(actions: np.ndarray, read_s: np.ndarray, read_e: np.ndarray, rec_s: np.ndarray, rec_e: np.ndarray,
            queue_wait_s: float, path: str, eps: float = 0.0) -> Decision:
    energy = float(np.where(actions == READ, read_e, rec_e).sum())
    return Decision(actions.astype(np.int8), energy, decision_time_s(actions, read_s, rec_s, queue_wait_s), path, eps)


def decide(read_s: np.ndarray, read_energy_j: np.ndarray, recompute_s: np.ndarray, recompute_energy_j: np.ndarray,
           *, delay_budget_s: float, queue_wait_s: float = 0.0, force_dp: bool = False) -> Decision:
    """Least-energy READ/RECOMPUTE per chunk within `T_fast + delay_budget_s` (see module doc).

    Inputs are per-chunk arrays in prompt order; all non-negative and finite (the caller validates).
    `force_dp` skips the fast paths (for tests and the benchmark).
    """
    read_s = np.asarray(read_s, dtype=np.float64)
    read_e = np.asarray(read_energy_j, dtype=np.float64)
    rec_s = np.asarray(recompute_s, dtype=np.float64)
    rec_e = np.asarray(recompute_energy_j, dtype=np.float64)
    n = len(read_s)
    if n == 0:
        return Decision(np.empty(0, dtype=np.int8), 0.0, 0.0, "fast-min-energy")
    fastest = np.where(read_s <= rec_s, READ, RECOMPUTE).astype(np.int8)
    t_max = float(np.minimum(read_s, rec_s).sum()) + delay_budget_s
    q = max(queue_wait_s, 0.0)

    def fits(actions: np.ndarray) -> bool:
        return decision_time_s(actions, read_s, rec_s, q) <= t_max + 1e-12

    if not force_dp:
        min_energy = np.where(read_e <= rec_e, READ, RECOMPUTE).astype(np.int8)
        if fits(min_energy):
            return _finish(min_energy, read_s, read_e, rec_s, rec_e, q, "fast-min-energy")
        if bool(np.all((read_s <= rec_s) & (read_e <= rec_e))):
            return _finish(np.zeros(n, dtype=np.int8), read_s, read_e, rec_s, rec_e, q, "fast-read-all")

    capacity_s = t_max + q
    for _ in range(8):
        actions, eps = _dp(read_s, read_e, rec_s, rec_e, capacity_s)
        if actions is None:
            break
        recompute_total = float(rec_s[actions == RECOMPUTE].sum())
        if recompute_total <= t_max + 1e-12 and fits(actions):
            return _finish(actions, read_s, read_e, rec_s, rec_e, q, "dp", eps)
        capacity_s -= max(recompute_total - t_max, eps)
        if capacity_s <= 0:
            break
    return _finish(fastest, read_s, read_e, rec_s, rec_e, q, "fastest")


def _dp(read_s: np.ndarray, read_e: np.ndarray, rec_s: np.ndarray, rec_e: np.ndarray,
        capacity_s: float) -> tuple[np.ndarray | None, float]:
    """StoreLLM Algorithm 1 as a 0/1 knapsack over the time added to the fastest plan.

    Least energy with summed time R + C <= capacity_s. Start from each chunk's faster option (time
    `T_fast`); switching chunk i to its slower option adds `|read_s - recompute_s|` seconds and saves
    `energy(fast) - energy(slow)` joules. Only chunks where the slower option saves energy are items, the
    knapsack capacity is `capacity_s - T_fast`, discretised into EPSILON_STEPS steps (added times rounded
    up, so a chosen plan never exceeds the limit). Same optimum as the DP over total time in the module
    doc, with the resolution spent on the slack only. None when even the fastest plan does not fit.
    """
    read_faster = read_s <= rec_s
    fast_time = np.where(read_faster, read_s, rec_s)
    slack = capacity_s - float(fast_time.sum())
    actions = np.where(read_faster, READ, RECOMPUTE).astype(np.int8)
    if slack < -1e-12:
        return None, 0.0
    saving = np.where(read_faster, read_e - rec_e, rec_e - read_e)  # energy saved by the slower option
    items = np.flatnonzero(saving > 0)
    eps = max(slack / EPSILON_STEPS, MIN_EPSILON_S)
    if not len(items) or slack <= 0:
        return actions, eps
    extra = np.abs(read_s - rec_s)[items]
    steps = int(np.floor(slack / eps + 1e-9))
    weights = np.ceil(extra / eps - 1e-9).astype(np.int64)
    values = saving[items]
    fit = weights <= steps
    items, weights, values = items[fit], weights[fit], values[fit]
    if not len(items):
        return actions, eps
    width = steps + 1
    dp = np.zeros(width, dtype=np.float64)  # dp[j] = most energy saved within j steps of added time
    take = np.zeros((len(items), width), dtype=np.bool_)
    for i in range(len(items)):
        w = int(weights[i])
        cand = dp[: width - w] + values[i]
        np.greater(cand, dp[w:], out=take[i, w:])
        np.maximum(dp[w:], cand, out=dp[w:])
    j = steps
    for i in range(len(items) - 1, -1, -1):
        if take[i, j]:
            c = int(items[i])
            actions[c] = RECOMPUTE if read_faster[c] else READ
            j -= int(weights[i])
    return actions, eps
