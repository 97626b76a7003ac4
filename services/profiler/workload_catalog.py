"""Workloads a sweep can name, built for one measurement point: warm-up requests, then measured requests.

Names (``SweepSpec.workload``):

* ``poisson``: independent requests, log-normal lengths (mean 1,024 prompt / 256 output tokens), no reuse.
* ``sharegpt``, ``humaneval``, ``longbench``: every request is the dataset's P50 size from GreenLLM Table II
  ((160, 140), (136, 55), (1495, 275) tokens), as GreenLLM's Fig. 4 runs them.
* ``multiturn``: GreenCache-style multi-turn conversations (each turn's prompt extends the previous context).
* ``zipf-docs`` / ``zipf-docs-a0.7``: GreenCache-style document questions, Zipf document popularity 0.4 / 0.7.
* ``azure-conv``: the Azure LLM inference trace 2023 (conversation), its token counts.
* ``mooncake``: the Mooncake FAST'25 conversation trace, its token counts and prefix-block hashes.

The two traces ship with the package (greenserve.simulator.workloads.trace_path, SOURCE.md beside them).

Arrivals are open-loop at the point's rate: Poisson by default; with ``arrival = "trace"`` the trace's own
inter-arrival times rescaled to the rate (trace workloads only). The synthetic generators' rates are in
requests per second (the multi-turn generator's conversation rate is set so that requests arrive at the rate).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from greenserve.simulator.workloads import (
    TRACE_FILES,
    Workload,
    load_azure_csv,
    load_mooncake_jsonl,
    multi_turn_workload,
    poisson_workload,
    trace_path,
    zipf_document_workload,
)

FIXED_SIZES: dict[str, tuple[int, int]] = {  # GreenLLM Table II, P50 (input, output) tokens
    "sharegpt": (160, 140),
    "humaneval": (136, 55),
    "longbench": (1495, 275),
}
SYNTHETIC = ("poisson", "multiturn", "zipf-docs", "zipf-docs-a0.7")
WORKLOADS: tuple[str, ...] = (*SYNTHETIC, *FIXED_SIZES, *TRACE_FILES)
ARRIVALS = ("poisson", "trace")
_MULTITURN_MEAN_TURNS = 4.0


class WorkloadUnavailable(RuntimeError):
    """A known workload whose shipped trace file is missing: an incomplete install (FAILED_PRECONDITION)."""


@dataclass(frozen=True)
class PointWorkload:
    """Requests of one point: the first ``warmup`` are not measured."""

    workload: Workload
    warmup: int

    @property
    def measured(self) -> int:
        return len(self.workload) - self.warmup


def check_workload(name: str, arrival: str) -> None:
    """ValueError for an unknown name or arrival; WorkloadUnavailable when a trace file is missing."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    if arrival not in ARRIVALS:
        raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}, got {arrival!r}")
    if arrival == "trace" and name not in TRACE_FILES:
        raise ValueError(f"arrival 'trace' needs a trace workload ({', '.join(TRACE_FILES)}), not {name!r}")
    if name in TRACE_FILES:
        try:
            trace_path(name)
        except FileNotFoundError as exc:
            raise WorkloadUnavailable(f"workload {name!r}: {exc}") from None


@functools.lru_cache(maxsize=8)
def _trace(name: str, limit: int) -> Workload:
    path = trace_path(name)
    if name == "azure-conv":
        return load_azure_csv(path, limit=limit)
    return load_mooncake_jsonl(path, limit=limit)


def _poisson_times(rng: np.random.Generator, n: int, rate_per_s: float) -> list[float]:
    return np.cumsum(rng.exponential(1.0 / rate_per_s, n)).tolist()


def build(name: str, rate_per_s: float, *, warmup: int, measured: int, seed: int = 0,
          arrival: str = "poisson") -> PointWorkload:
    """The requests of one point: ``warmup + measured`` requests offered at ``rate_per_s``. Deterministic, so the
    last few are cached: a sweep offers the same requests to every cache size (callers must not mutate them)."""
    return _build(name, float(rate_per_s), int(warmup), int(measured), int(seed), arrival)


@functools.lru_cache(maxsize=32)
def _build(name: str, rate_per_s: float, warmup: int, measured: int, seed: int, arrival: str) -> PointWorkload:
    if not (math.isfinite(rate_per_s) and rate_per_s > 0):
        raise ValueError(f"rate_per_s: must be finite and > 0, got {rate_per_s}")
    if warmup < 0 or measured < 1:
        raise ValueError("measured: a point needs at least one measured request")
    check_workload(name, arrival)
    n = warmup + measured
    rng = np.random.default_rng(seed)
    if name == "poisson":
        wl = poisson_workload(n, rate_per_s, seed=seed)
    elif name in FIXED_SIZES:
        prompt, output = FIXED_SIZES[name]
        wl = Workload(name, _poisson_times(rng, n, rate_per_s), [prompt] * n, [output] * n, [], 256)
    elif name == "multiturn":
        conversations = max(1, math.ceil(n / _MULTITURN_MEAN_TURNS * 1.5))
        wl = multi_turn_workload(conversations, rate_per_s / _MULTITURN_MEAN_TURNS, seed=seed,
                                 mean_turns=_MULTITURN_MEAN_TURNS, think_time_s=0.0)
        wl = wl.head(n) if len(wl) >= n else wl
        wl = Workload(name, _poisson_times(rng, len(wl), rate_per_s), wl.prompt_tokens, wl.output_tokens,
                      wl.block_hashes, wl.hash_block_tokens, wl.session_ids)
    elif name.startswith("zipf-docs"):
        alpha = 0.7 if name.endswith("a0.7") else 0.4
        wl = zipf_document_workload(n, rate_per_s, alpha=alpha, seed=seed)
    else:
        trace = _trace(name, n)
        if len(trace) < n:
            raise ValueError(f"workload {name!r} has only {len(trace)} requests, the point needs {n}")
        if arrival == "trace":
            span = trace.arrival_s[-1] - trace.arrival_s[0]
            native = (len(trace) - 1) / span if span > 0 else rate_per_s
            wl = trace.scaled(rate_per_s / native)
        else:
            wl = Workload(name, _poisson_times(rng, n, rate_per_s), trace.prompt_tokens, trace.output_tokens,
                          trace.block_hashes, trace.hash_block_tokens, trace.session_ids)
    return PointWorkload(wl, min(warmup, max(len(wl) - 1, 0)))
