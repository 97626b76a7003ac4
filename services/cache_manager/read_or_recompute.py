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

Step size. Times are discretised into `EPSILON_STEPS` = 2048 steps of the capacity (`eps = (T_max +
queue_wait_s) / 2048`, at least 1 µs). Each chunk's time is rounded UP to whole steps, so a chosen plan
never exceeds the limit in real time; the price is that up to n*eps of slack can go unused (reported as
`rounded_s` in `Decision`). Cost: O(n * 2048) vectorised; for a 32k-token prompt in 256-token LMCache
chunks (128 chunks) this is ~1 ms (`greenserve bench cache-eviction --read-recompute-only`).

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


def _finish(actions: np.ndarray, read_s, read_e, rec_s, rec_e, queue_wait_s: float, path: str, eps: float = 0.0) -> Decision:
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
    """StoreLLM Algorithm 1: least energy with summed (rounded-up) time <= capacity; None if infeasible."""
    n = len(read_s)
    eps = max(capacity_s / EPSILON_STEPS, MIN_EPSILON_S)
    steps = int(np.floor(capacity_s / eps + 1e-9))
    w_read = np.ceil(read_s / eps - 1e-9).astype(np.int64)
    w_rec = np.ceil(rec_s / eps - 1e-9).astype(np.int64)
    width = steps + 1
    inf = np.inf
    # dp[j] = least energy of the chunks so far using at most j steps.
    dp = np.zeros(width, dtype=np.float64)
    choice = np.zeros((n, width), dtype=np.bool_)  # True = recompute
    a = np.empty(width, dtype=np.float64)
    b = np.empty(width, dtype=np.float64)
    for i in range(n):
        wr, wc = int(w_read[i]), int(w_rec[i])
        a.fill(inf)
        b.fill(inf)
        if wr < width:
            a[wr:] = dp[: width - wr] + read_e[i]
        if wc < width:
            b[wc:] = dp[: width - wc] + rec_e[i]
        take_rec = b < a
        choice[i] = take_rec
        dp = np.where(take_rec, b, a)
    if not np.isfinite(dp[steps]):
        return None, eps
    actions = np.zeros(n, dtype=np.int8)
    j = steps
    for i in range(n - 1, -1, -1):
        if choice[i, j]:
            actions[i] = RECOMPUTE
            j -= int(w_rec[i])
        else:
            actions[i] = READ
            j -= int(w_read[i])
    return actions, eps
