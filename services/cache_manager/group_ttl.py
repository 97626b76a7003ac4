"""ROI-aware group TTLs (Kareto §4.3, Algorithm 2, Eq. 3).

Requests are grouped by prefix-tree subtree: the subtree root is the first block below the prefix that
every request of the window shares (in the Mooncake trace all requests share block 0, so the root is the
second block). The K subtrees with the most reuse events are groups 0..K-1; all others form the residual
group K.

For a group g with inter-arrival times A_g (time between consecutive accesses of the same block, over the
window) and |B_g| unique blocks:

    H_g(t) = |{d in A_g : d <= t}|                 hits a TTL t keeps
    C_g(t) = |B_g| * t + sum_{d in A_g} min(t, d)  storage cost, block-seconds

H_g is a step function; for SLSQP we use its piecewise-linear interpolation through the sorted
inter-arrival times (continuous, exact at the sample points), with its slope as the gradient. C_g is
piecewise linear already (slope |B_g| + |{d > t}|).

Algorithm 2: per group the ROI-optimal TTL t_g = argmax H_g(t)/C_g(t) over the sample points; scale all
by alpha = B / sum C_g(t_g) to meet the budget B; multi-start SLSQP (scipy.optimize.minimize, method
"SLSQP") from that point and floor(sqrt(K))+1 random perturbations of it, maximising sum H_g(t_g) subject
to sum C_g(t_g) <= B, t >= 0; keep the best. `time_budget_s` bounds the wall time: starts beyond it are
skipped (the scaled ROI point is always evaluated).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

RESIDUAL = "residual"


@dataclass(frozen=True)
class GroupStats:
    """Inter-arrival times (sorted, seconds) and unique-block count of one group."""

    group_id: str
    inter_arrivals_s: np.ndarray
    unique_blocks: int
    accesses: int

    def hits(self, ttl_s: float) -> float:
        """Interpolated H_g(t)."""
        d = self.inter_arrivals_s
        if len(d) == 0:
            return 0.0
        xs = np.concatenate([[0.0], d])
        ys = np.arange(len(d) + 1, dtype=np.float64)
        return float(np.interp(ttl_s, xs, ys))

    def hits_slope(self, ttl_s: float) -> float:
        d = self.inter_arrivals_s
        if len(d) == 0:
            return 0.0
        xs = np.concatenate([[0.0], d])
        i = int(np.searchsorted(xs, ttl_s, side="right"))
        if i <= 0 or i >= len(xs):
            return 0.0
        width = xs[i] - xs[i - 1]
        return 1.0 / width if width > 0 else 0.0

    def cost(self, ttl_s: float) -> float:
        """C_g(t), block-seconds."""
        return float(self.unique_blocks * ttl_s + np.minimum(self.inter_arrivals_s, ttl_s).sum())

    def cost_slope(self, ttl_s: float) -> float:
        return float(self.unique_blocks + np.count_nonzero(self.inter_arrivals_s > ttl_s))

    def roi_optimal_ttl(self) -> float:
        """argmax H_g(t)/C_g(t) over the sample points (Algorithm 2 line 5); 0 without reuse."""
        d = self.inter_arrivals_s
        if len(d) == 0:
            return 0.0
        h = np.arange(1, len(d) + 1, dtype=np.float64)
        prefix = np.cumsum(d)
        # C(d_i) = |B| d_i + sum_{j<=i} d_j + (n - i - 1) d_i   (sorted d)
        rest = (len(d) - np.arange(1, len(d) + 1)) * d
        c = self.unique_blocks * d + prefix + rest
        with np.errstate(divide="ignore", invalid="ignore"):
            roi = np.where(c > 0, h / c, np.where(h > 0, np.inf, 0.0))
        return float(d[int(np.argmax(roi))])


@dataclass(frozen=True)
class TtlSolution:
    """TTLs per group (same order as the groups), expected hits and cost."""

    groups: list[GroupStats]
    ttl_s: np.ndarray
    hits: float
    cost: float
    starts: int

    def by_id(self) -> dict[str, float]:
        return {g.group_id: float(t) for g, t in zip(self.groups, self.ttl_s)}


def group_stats(accesses: Iterable[tuple[float, int, str]], top_k: int) -> list[GroupStats]:
    """Per-group statistics from (time_s, block_id, subtree_id) accesses in time order.

    The top_k subtrees by reuse events become their own groups (ids = subtree ids); the rest are merged
    into the residual group (id "residual", always last).
    """
    last_seen: dict[int, float] = {}
    block_group: dict[int, str] = {}
    gaps: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    for t, block, sub in accesses:
        prev = last_seen.get(block)
        if prev is None:
            block_group[block] = sub
        else:
            gaps.setdefault(block_group[block], []).append(t - prev)
        last_seen[block] = t
        counts[sub] = counts.get(sub, 0) + 1
    uniques: dict[str, int] = {}
    for sub in block_group.values():
        uniques[sub] = uniques.get(sub, 0) + 1
    ranked = sorted(uniques, key=lambda s: (-len(gaps.get(s, ())), s))
    top = [s for s in ranked if gaps.get(s)][:top_k]
    out = [
        GroupStats(s, np.sort(np.asarray(gaps[s], dtype=np.float64)), uniques[s], counts.get(s, 0))
        for s in top
    ]
    top_set = set(top)
    res_gaps = [g for s, gl in gaps.items() if s not in top_set for g in gl]
    out.append(GroupStats(
        RESIDUAL, np.sort(np.asarray(res_gaps, dtype=np.float64)),
        sum(n for s, n in uniques.items() if s not in top_set),
        sum(n for s, n in counts.items() if s not in top_set),
    ))
    return out


def solve(groups: Sequence[GroupStats], budget: float, *, max_ttl_s: float | None = None, seed: int = 0,
          time_budget_s: float = 2.0, maxiter: int = 100) -> TtlSolution:
    """Kareto Algorithm 2: maximise sum H_g(t_g) s.t. sum C_g(t_g) <= budget (block-seconds), t >= 0."""
    k1 = len(groups)
    if k1 == 0:
        return TtlSolution([], np.empty(0), 0.0, 0.0, 0)
    if budget <= 0:
        return TtlSolution(list(groups), np.zeros(k1), 0.0, 0.0, 0)
    upper = max_ttl_s if max_ttl_s is not None else max(
        [float(g.inter_arrivals_s[-1]) for g in groups if len(g.inter_arrivals_s)] or [1.0])
    upper = max(upper, 1e-6)
    t_roi = np.array([g.roi_optimal_ttl() for g in groups])
    unscaled = sum(g.cost(t) for g, t in zip(groups, t_roi))
    alpha = budget / unscaled if unscaled > 0 else 1.0
    t_init = np.clip(alpha * t_roi, 0.0, upper)

    scale = upper  # optimise x = t / upper in [0, 1]

    def total_hits(t: np.ndarray) -> float:
        return sum(g.hits(float(x)) for g, x in zip(groups, t))

    def total_cost(t: np.ndarray) -> float:
        return sum(g.cost(float(x)) for g, x in zip(groups, t))

    def objective(x: np.ndarray) -> float:
        return -total_hits(x * scale)

    def objective_grad(x: np.ndarray) -> np.ndarray:
        return -np.array([g.hits_slope(float(v) * scale) * scale for g, v in zip(groups, x)])

    def slack(x: np.ndarray) -> float:
        return (budget - total_cost(x * scale)) / budget

    def slack_grad(x: np.ndarray) -> np.ndarray:
        return -np.array([g.cost_slope(float(v) * scale) * scale for g, v in zip(groups, x)]) / budget

    rng = np.random.default_rng(seed)
    starts = [t_init]
    for _ in range(int(math.isqrt(k1)) + 1):
        starts.append(np.clip(t_init * rng.uniform(0.5, 1.5, size=k1), 0.0, upper))

    best_t, best_hits = np.zeros(k1), 0.0
    deadline = time.monotonic() + time_budget_s
    used = 0
    for i, start in enumerate(starts):
        if i > 0 and time.monotonic() > deadline:
            break
        used += 1
        candidates = [start]
        res = minimize(
            objective, start / scale, jac=objective_grad, method="SLSQP", bounds=[(0.0, 1.0)] * k1,
            constraints=[{"type": "ineq", "fun": slack, "jac": slack_grad}],
            options={"maxiter": maxiter, "ftol": 1e-9},
        )
        candidates.append(np.clip(res.x * scale, 0.0, upper))
        for t in candidates:
            t = _fit_budget(t, total_cost, budget)
            hits = total_hits(t)
            if hits > best_hits:
                best_t, best_hits = t, hits
    return TtlSolution(list(groups), best_t, best_hits, total_cost(best_t), used)


def _fit_budget(t: np.ndarray, total_cost: Callable[[np.ndarray], float], budget: float) -> np.ndarray:
    """Scale t down by the largest factor in [0, 1] whose cost fits the budget (cost grows with t)."""
    if total_cost(t) <= budget:
        return t
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if total_cost(t * mid) <= budget:
            lo = mid
        else:
            hi = mid
    return t * lo
