"""The mutable state of one engine during a replay (``replay._Sim`` drives it) and its decode-run timing.

Between batch-composition changes an engine is in a **decode run**: the time of ``n`` decode steps with a fixed
batch is a closed-form sum (step time is piecewise linear in the growing context: the larger of a memory line
and a compute line, or the speculative-decoding round's line), so a run to the next completion is one event, not
one per token (``ReplayEngine.run_time``).

Bookkeeping is lazy and O(1) per event: a per-engine decode-step counter gives every running request's remaining
tokens (finish heap keyed by target step), context sums and energy per sequence are running accumulators. The
engine's prefix cache (HBM, LMCache DRAM and disk) is its ``PrefixTiers`` (tiers.py).
"""

from __future__ import annotations

import math
from collections import deque

from greenserve.simulator.perf_model import PerfModel
from greenserve.simulator.replay_fleet import EngineSpec
from greenserve.simulator.tiers import PrefixTiers

__all__ = ["ReplayEngine"]

INF = math.inf


class ReplayEngine:
    """Mutable state of one simulated engine (hot path: plain attributes, no properties)."""

    __slots__ = (
        "A",
        "B",
        "S",
        "base_sum",
        "batch_time_sum",
        "block",
        "busy_s",
        "c1",
        "cap_tokens",
        "decoded_tokens",
        "draft_mem_w",
        "draft_span_w",
        "energy_active_j",
        "energy_idle_j",
        "fin_heap",
        "fpt",
        "hash_tokens",
        "hbm_cap_blocks",
        "idle_since",
        "idle_w",
        "idx",
        "line_cache",
        "m1",
        "max_batched",
        "max_seqs",
        "mem_w",
        "n_prefilling",
        "o",
        "on",
        "outstanding",
        "planned",
        "pm",
        "prefilled_tokens",
        "prefix_caching",
        "reuse_budget",
        "reuse_rule",
        "reserved",
        "role",
        "routable",
        "run_c0",
        "run_end",
        "run_n",
        "run_t0",
        "span_w",
        "spec",
        "state",
        "step_extra",
        "steps",
        "tiers",
        "version",
        "w0",
        "waiting",
    )

    def __init__(self, idx: int, spec: EngineSpec, hash_tokens: int, on: bool) -> None:
        profile = spec.resolved_profile()
        pm = PerfModel(profile)
        self.idx = idx
        self.pm = pm
        self.role = spec.role
        self.spec = spec.spec
        self.prefix_caching = spec.prefix_caching
        self.reuse_rule = spec.reuse_rule
        self.reuse_budget = spec.reuse_delay_budget_s
        self.waiting: deque[int] = deque()
        self.state = 0  # 0 idle, 1 mixed step, 2 decode run
        self.version = 0
        self.S = 0
        self.B = 0
        self.base_sum = 0
        self.fin_heap: list[tuple[int, int]] = []
        self.reserved = 0
        self.cap_tokens = pm.kv_cache_tokens()
        self.block = profile.block_size_tokens
        self.outstanding = 0
        self.A = 0.0
        self.energy_active_j = 0.0
        self.energy_idle_j = 0.0
        self.idle_since = 0.0
        self.busy_s = 0.0
        self.run_t0 = self.run_end = 0.0
        self.run_n = 0
        self.run_c0 = 0
        self.planned: list[tuple[int, int]] = []
        self.step_extra = 0.0
        self.tiers = PrefixTiers(hash_tokens, *spec.tier_specs())
        self.hash_tokens = hash_tokens
        self.hbm_cap_blocks = self.cap_tokens // hash_tokens
        self.max_seqs = profile.max_num_seqs
        self.max_batched = profile.max_num_batched_tokens
        self.n_prefilling = 0
        self.on = on
        self.routable = on
        # step-time lines: t(C) = max(w0 + m1 C, o + B fpt + c1 C)
        self.o = pm._overhead_s  # the profile's step overhead plus, on a PCIe TP engine, the all-reduce latencies
        self.w0 = pm._overhead_s + pm._weight_read_s
        self.m1 = pm._kv_bytes_per_token / pm._decode_rate
        self.fpt = pm._flops_per_token / pm._decode_compute_rate
        self.c1 = pm._attn_coeff / pm._decode_compute_rate
        self.line_cache: dict[int, tuple[float, float]] = {}
        self.idle_w = profile.idle_w
        self.span_w = profile.max_w - profile.idle_w
        self.mem_w = profile.memory_power_weight
        # DSD: the draft runs on a GPU of its own, charged its own power: its idle draw whenever the engine is on,
        # its activity during the draft's share of each round; the target's GPU is active only while it verifies.
        self.draft_span_w = self.draft_mem_w = 0.0
        if self.spec is not None and self.spec.disaggregated:
            draft = self.spec.draft
            self.idle_w += draft.idle_w
            self.draft_span_w = draft.max_w - draft.idle_w
            self.draft_mem_w = draft.memory_power_weight
        self.decoded_tokens = 0
        self.prefilled_tokens = 0
        self.steps = 0
        self.batch_time_sum = 0.0

    # -- prefix cache (tiers.py) ----------------------------------------------------------------------
    def cached_prefix_blocks(self, hashes: tuple[int, ...]) -> int:
        return self.tiers.cached_prefix_blocks(hashes)

    def lookup(self, hashes: tuple[int, ...], now: float) -> tuple[int, int, int]:
        return self.tiers.lookup(hashes, now)

    def store(self, hashes: tuple[int, ...], now: float) -> None:
        free = (self.cap_tokens - self.reserved) // self.hash_tokens if self.prefix_caching else None
        self.tiers.store(hashes, free, now)

    # -- decode-run timing ----------------------------------------------------------------------------
    def _lines(self, B: int) -> tuple[float, float, float, float]:
        """(mem intercept, mem slope, compute intercept, compute slope) of the per-step time vs context."""
        if self.spec is None:
            return self.w0, self.m1, self.o + B * self.fpt, self.c1
        line = self.line_cache.get(B)
        if line is None:
            pm = self.pm
            lo = pm.spec_decode_tpot_s(self.spec, B, 0)
            hi = pm.spec_decode_tpot_s(self.spec, B, B * 4096)
            line = (lo, (hi - lo) / (B * 4096))
            self.line_cache[B] = line
        return line[0], line[1], -INF, 0.0

    def run_time(self, k: int, C0: int, B: int) -> float:
        """Seconds of ``k`` decode steps of a fixed batch of ``B`` starting at total context ``C0``."""
        if k <= 0:
            return 0.0
        m0, m1, c0, c1 = self._lines(B)
        # sum_{j=j0}^{j1-1} (a + b (C0 + j B)) = n (a + b C0) + b B (j1(j1-1) - j0(j0-1)) / 2
        if c0 == -INF:
            return k * (m0 + m1 * C0) + m1 * B * (k * (k - 1)) * 0.5
        if m1 > c1:
            cstar = (c0 - m0) / (m1 - c1)  # memory line above compute for C >= cstar
            js = math.ceil((cstar - C0) / B) if cstar > C0 else 0
            js = 0 if js < 0 else (min(js, k))
            comp = js * (c0 + c1 * C0) + c1 * B * (js * (js - 1)) * 0.5
            n = k - js
            mem = n * (m0 + m1 * C0) + m1 * B * (k * (k - 1) - js * (js - 1)) * 0.5
            return comp + mem
        # compute slope >= memory slope (not seen with real profiles): take the larger line at both ends
        a = max(m0 + m1 * C0, c0 + c1 * C0)
        b = max(m1, c1)
        return k * a + b * B * (k * (k - 1)) * 0.5

    def utilisation_at(self, B: int, C: float) -> float:
        m0, m1, c0, c1 = self._lines(B)
        mem = m0 + m1 * C - self.o
        comp = c0 + c1 * C - self.o if c0 != -INF else 0.0
        step = max(comp, mem)
        if step <= 0:
            return 1.0
        u = comp / step + self.mem_w * (1.0 - comp / step)
        return min(u, 1.0)
