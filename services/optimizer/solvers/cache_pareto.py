"""Kareto's adaptive Pareto search (Algorithm 1) over cache tier sizes, and the hypervolume that compares it
with a full grid (Kareto Sec. 5.3.1).

The search is over two sizes, DRAM (x) and disk or TTL (y), each point scored by a caller's `evaluate(x, y)`
that returns (latency_s, throughput, cost) (Kareto Eq. 1-2: lower latency, higher throughput, lower cost; in
greenserve the cost is carbon). Algorithm 1, as implemented:

1. evaluate a coarse uniform grid (`x_start`, `y_start`: ranges and steps);
2. **expansion** (long-tail pruning): while the latency still improves by more than `expand_threshold`
   (relative) between the last two x values at y = 0, add the next x column (all sampled y); the same along
   y at x = 0 (Kareto expands DRAM only, with the TTL range fixed; disk sizes get the same rule here);
3. **refinement**: for every pair of adjacent sampled points (consecutive x in a row, consecutive y in a
   column) whose latency or throughput differs by more than `perf_threshold` and whose cost differs by more
   than `cost_threshold` (relative), add their midpoint, snapped to the fine grid (`x_fine_step`,
   `y_fine_step`, so adaptive and grid points are comparable);
4. repeat 2-3 until nothing new is added (or `max_evaluations`); return the Pareto set of all evaluated points.

This module is the search itself (`greenserve bench cache-pareto` compares it with the grid); the planner
solver that scores points by replaying a pool's recorded traffic through the simulator is ``cache_kareto``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from greenserve.common.cli_parser import Parser

Metrics = tuple[float, float, float]  # latency_s (min), throughput (max), cost (min)


@dataclass(frozen=True)
class ScoredPoint:
    x: float
    y: float
    latency_s: float
    throughput: float
    cost: float
    tag: str = ""  # a categorical attribute of the point (the cache solver's disk medium), not an objective

    def objectives(self) -> tuple[float, float, float]:
        """All three as minimisation: (latency, -throughput, cost)."""
        return (self.latency_s, -self.throughput, self.cost)


@dataclass
class SearchResult:
    points: list[ScoredPoint]  # every evaluated point, in evaluation order
    pareto: list[ScoredPoint]
    rounds: int
    stopped_by_budget: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def evaluations(self) -> int:
        return len(self.points)


def _grid(lo: float, hi: float, step: float) -> list[float]:
    if step <= 0 or hi < lo:
        raise ValueError("step: must be > 0 with hi >= lo")
    n = int(math.floor((hi - lo) / step + 1e-9))
    return [lo + i * step for i in range(n + 1)]


def pareto_filter(points: Iterable[ScoredPoint]) -> list[ScoredPoint]:
    """Points no other point dominates (no worse in every objective, better in one)."""
    pts = list(points)
    objs = [p.objectives() for p in pts]
    out = []
    for i, a in enumerate(objs):
        dominated = any(all(b[k] <= a[k] for k in range(3)) and any(b[k] < a[k] for k in range(3))
                        for j, b in enumerate(objs) if j != i)
        if not dominated:
            out.append(pts[i])
    return out


def _area_2d(pts: list[tuple[float, float]], ref: tuple[float, float]) -> float:
    """Area dominated by `pts` (minimisation) up to `ref`: a staircase swept along x."""
    pts = sorted(p for p in pts if p[0] < ref[0] and p[1] < ref[1])
    xs = [p[0] for p in pts] + [ref[0]]
    area, low = 0.0, ref[1]
    for i, (x, y) in enumerate(pts):
        low = min(low, y)
        area += (xs[i + 1] - x) * (ref[1] - low)
    return area


def hypervolume(points: Sequence[ScoredPoint], ref: tuple[float, float, float]) -> float:
    """Exact 3-objective hypervolume (minimisation objectives, `ref` strictly worse than every point):
    slices along the third objective, each a 2-D staircase area."""
    objs = sorted((p.objectives() for p in points if all(v < r for v, r in zip(p.objectives(), ref))),
                  key=lambda o: o[2])
    total = 0.0
    for i, o in enumerate(objs):
        z_next = objs[i + 1][2] if i + 1 < len(objs) else ref[2]
        if z_next > o[2]:
            total += _area_2d([(q[0], q[1]) for q in objs[:i + 1]], (ref[0], ref[1])) * (z_next - o[2])
    return total


def reference_point(points: Sequence[ScoredPoint], margin: float = 0.01) -> tuple[float, float, float]:
    """A point strictly worse than all `points` in every objective (Kareto: an identical dominated reference
    for the grid and the adaptive search)."""
    objs = [p.objectives() for p in points]
    out = []
    for k in range(3):
        hi, lo = max(o[k] for o in objs), min(o[k] for o in objs)
        out.append(hi + margin * max(hi - lo, abs(hi), 1e-12))
    return (out[0], out[1], out[2])


def grid_search(evaluate: Callable[[float, float], Metrics], x_range: tuple[float, float, float],
                y_range: tuple[float, float, float]) -> SearchResult:
    """Every point of the uniform grid (lo, hi, step) x (lo, hi, step)."""
    pts = [ScoredPoint(x, y, *evaluate(x, y)) for x in _grid(*x_range) for y in _grid(*y_range)]
    return SearchResult(pts, pareto_filter(pts), 1)


def _rel(a: float, b: float) -> float:
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 0 else 0.0


def adaptive_search(evaluate: Callable[[float, float], Metrics], *, x_start: tuple[float, float, float],
                    y_start: tuple[float, float, float], x_max: float, y_max: float, x_fine_step: float,
                    y_fine_step: float, expand_threshold: float = 0.01, perf_threshold: float = 0.02,
                    cost_threshold: float = 0.005, max_evaluations: int = 10_000) -> SearchResult:
    """Kareto Algorithm 1 (module docstring)."""
    for name, v in (("x_fine_step", x_fine_step), ("y_fine_step", y_fine_step)):
        if not v > 0:
            raise ValueError(f"{name}: must be > 0")
    for name, v in (("expand_threshold", expand_threshold), ("perf_threshold", perf_threshold),
                    ("cost_threshold", cost_threshold)):
        if not v >= 0:
            raise ValueError(f"{name}: must be >= 0")
    x0, y0 = x_start[0], y_start[0]
    dx, dy = x_start[2], y_start[2]
    seen: dict[tuple[float, float], ScoredPoint] = {}
    order: list[ScoredPoint] = []
    todo = [(x, y) for x in _grid(*x_start) for y in _grid(*y_start)]
    rounds = 0
    stopped = False

    def snap(v: float, lo: float, step: float) -> float:
        return lo + round((v - lo) / step) * step

    while todo:
        rounds += 1
        for xy in todo:
            if xy in seen:
                continue
            if len(order) >= max_evaluations:
                stopped = True
                break
            p = ScoredPoint(xy[0], xy[1], *evaluate(*xy))
            seen[xy] = p
            order.append(p)
        if stopped:
            break
        new: set[tuple[float, float]] = set()
        xs = sorted({x for x, _ in seen})
        ys = sorted({y for _, y in seen})
        # Expansion along x at y = y0, and along y at x = x0 (long-tail pruning).
        row = sorted(x for x, y in seen if y == y0)
        if len(row) >= 2 and row[-1] + dx <= x_max + 1e-9 and \
                _rel(seen[(row[-2], y0)].latency_s, seen[(row[-1], y0)].latency_s) > expand_threshold:
            new.update((row[-1] + dx, y) for y in ys if (row[-1], y) in seen)
        col = sorted(y for x, y in seen if x == x0)
        if len(col) >= 2 and col[-1] + dy <= y_max + 1e-9 and \
                _rel(seen[(x0, col[-2])].latency_s, seen[(x0, col[-1])].latency_s) > expand_threshold:
            new.update((x, col[-1] + dy) for x in xs if (x, col[-1]) in seen)
        # Refinement between adjacent sampled points with a steep trade-off.
        for y in ys:
            r = sorted(x for x in xs if (x, y) in seen)
            for a, b in zip(r, r[1:]):
                _maybe_mid(seen[(a, y)], seen[(b, y)], perf_threshold, cost_threshold, new,
                           (snap((a + b) / 2, x0, x_fine_step), y), a, b, axis=0)
        for x in xs:
            c = sorted(y for y in ys if (x, y) in seen)
            for a, b in zip(c, c[1:]):
                _maybe_mid(seen[(x, a)], seen[(x, b)], perf_threshold, cost_threshold, new,
                           (x, snap((a + b) / 2, y0, y_fine_step)), a, b, axis=1)
        todo = sorted(new - set(seen))
    notes = [f"{len(order)} evaluations in {rounds} rounds"]
    return SearchResult(order, pareto_filter(order), rounds, stopped, notes)


def _maybe_mid(p: ScoredPoint, q: ScoredPoint, perf: float, cost: float, out: set[tuple[float, float]],
               mid: tuple[float, float], a: float, b: float, *, axis: int) -> None:
    steep = (_rel(p.latency_s, q.latency_s) > perf or _rel(p.throughput, q.throughput) > perf) and \
        _rel(p.cost, q.cost) > cost
    if steep and a < mid[axis] < b:
        out.add(mid)


def long_tail_surface(dram_gb: float, disk_gb: float) -> Metrics:
    """A synthetic response surface with Kareto's shape (Sec. 4.2: gains saturate past a workload-dependent
    capacity; disk hits are slower than DRAM hits): hit fraction 0.6 x (1 - exp(-DRAM/700 GB)) from DRAM, the
    rest of 0.6 x (1 - exp(-disk/900 GB)) from disk at 0.8 of a DRAM hit's saving; latency 2.05 s without hits;
    throughput 100 / latency; cost 40 + 0.004 per DRAM GB + 0.0006 per disk GB. Used by the bench and tests of
    the search itself, not as a model of any deployment."""
    hit_d = 0.6 * (1 - math.exp(-dram_gb / 700.0))
    hit_k = (0.6 - hit_d) * (1 - math.exp(-disk_gb / 900.0))
    latency = 2.0 * (1 - hit_d - 0.8 * hit_k) + 0.05
    return latency, 100.0 / latency, 40.0 + 0.004 * dram_gb + 0.0006 * disk_gb


def bench_main(argv: list[str], prog: str = "greenserve bench cache-pareto") -> int:
    """Adaptive search vs full grid on Kareto's grid (DRAM 0-4096 GB step 256 x disk 0-3600 GB step 120):
    evaluations and hypervolume ratio (Kareto Sec. 5.3.1), on the synthetic long-tail surface."""
    parser = Parser(prog=prog, description=bench_main.__doc__)
    parser.add_argument("--perf-threshold", type=float, default=0.02)
    parser.add_argument("--cost-threshold", type=float, default=0.005)
    parser.add_argument("--expand-threshold", type=float, default=0.01)
    parser.add_argument("--json", action="store_true", help="accepted for symmetry; the last line is always JSON")
    ns = parser.parse_args(argv)
    if min(ns.perf_threshold, ns.cost_threshold, ns.expand_threshold) < 0:
        parser.error("thresholds must be >= 0")
    grid = grid_search(long_tail_surface, (0, 4096, 256), (0, 3600, 120))
    started = time.perf_counter()
    adaptive = adaptive_search(long_tail_surface, x_start=(0, 2048, 512), y_start=(0, 2400, 600), x_max=4096,
                               y_max=3600, x_fine_step=256, y_fine_step=120, perf_threshold=ns.perf_threshold,
                               cost_threshold=ns.cost_threshold, expand_threshold=ns.expand_threshold)
    search_s = time.perf_counter() - started
    ref = reference_point(grid.points + adaptive.points)
    hv_grid, hv_adaptive = hypervolume(grid.pareto, ref), hypervolume(adaptive.pareto, ref)
    print(json.dumps({"surface": "long_tail_surface (synthetic)", "grid_evaluations": grid.evaluations,
                      "adaptive_evaluations": adaptive.evaluations, "rounds": adaptive.rounds,
                      "evaluation_fraction": round(adaptive.evaluations / grid.evaluations, 4),
                      "hypervolume_ratio": round(hv_adaptive / hv_grid, 5), "grid_pareto": len(grid.pareto),
                      "adaptive_pareto": len(adaptive.pareto), "search_s": round(search_s, 4)}))
    return 0
