"""Analytical performance, memory and power model of one vLLM engine (model x hardware).

The model is a roofline per engine step, the same decomposition the seeds use to reason about serving:

* **prefill** of ``n`` uncached tokens is compute-bound: ``2 x P x n`` FLOPs for the weights plus the causal
  attention term ``4 x L x d x n x (cached + n / 2)`` (per sequence), at ``peak x prefill_mfu``; it cannot be
  faster than streaming the weights once from HBM (GreenCache Sec. 2.2, Fig. 1b: cached prefix tokens skip
  this work, which is why a reuse cuts TTFT).
* **decode** of a batch is memory-bound: every step streams the weights plus the KV cache of every running
  sequence (``weight_bytes + kv_bytes_per_token x total_context``) at ``bandwidth x decode_mbu``, unless
  the batch is large enough to be compute-bound.
* **KV budget**: vLLM's block pool is ``gpu_memory_utilization x memory - weights - reserve`` divided by the
  bytes of one block (``block_size_tokens x kv_bytes_per_token``).
* **tiered reuse**: a prefix held in host DRAM (LMCache L1) or on disk (LMCache L2) is reloaded over that
  tier's bandwidth. Kareto Sec. 3.3 (Observations 2 and 4) and StoreLLM Sec. 3.4: a slow-tier reload is
  only worth it when it completes inside the request's queueing time (prefetch) or is faster than
  recomputing the same tokens; otherwise the tokens are recomputed. ``plan_prefix_reuse`` applies the rule.
* **power**: ``idle + (max - idle) x utilisation``; a step's utilisation is its compute-bound share plus
  ``memory_power_weight`` times its memory-bound share (prefill ~ 1, small-batch decode ~ 0.6).
* **modes**: speculative decoding (GreenLLM Sec. II-B/IV: ``k`` draft tokens, acceptance rate ``r`` read as
  GreenLLM reports it, accepted / proposed tokens, so a round yields ``1 + k x r`` tokens; for DSD the draft's
  token ids cross the link first and its probabilities cross while the target verifies, GreenLLM Fig. 2) and
  prefill/decode disaggregation (GreenLLM DPD: the prompt's KV crosses a link of limited bandwidth).

The engine's parameters are an ``engine_profile.EngineProfile`` (loaded from the cited data file); the modes'
parameters are ``mode_configs.SpecDecodeConfig`` and ``mode_configs.DisaggConfig``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from greenserve.simulator.engine_profile import EngineProfile
from greenserve.simulator.mode_configs import DisaggConfig, SpecDecodeConfig

__all__ = [
    "REUSE_RULES",
    "TIERS",
    "PerfModel",
    "ReusePlan",
]

TIERS: tuple[str, ...] = ("hbm", "dram", "disk")
"""Cache tiers, fastest first: GPU HBM (vLLM prefix cache), host DRAM (LMCache L1), disk (LMCache L2)."""

REUSE_RULES: tuple[str, ...] = ("latency", "always", "energy")
"""Read-or-recompute rules of ``PerfModel.plan_prefix_reuse``: ``latency`` (read a DRAM/disk segment only when it
is hidden by queueing or beats recomputing it), ``always`` (LMCache's behaviour and Kareto's simulator: every hit
is loaded, however slow the tier), ``energy`` (StoreLLM Sec. 3.4 / Algorithm 1: read whenever reading costs less
energy than recomputing and the reload fits in the request's delay budget)."""


@dataclass(frozen=True, slots=True)
class ReusePlan:
    """Outcome of the read-or-recompute rule for one request's cached prefix.

    ``used_tokens[tier]`` are the prefix tokens taken from that tier, ``load_s`` the reload time that
    is not hidden behind queueing, ``recompute_tokens`` the prompt tokens the prefill must compute.
    """

    used_hbm_tokens: int
    used_dram_tokens: int
    used_disk_tokens: int
    recompute_tokens: int
    load_s: float
    skipped_tokens: int


class PerfModel:
    """Step-time, memory and power model of one engine; all methods are pure and cheap (hot path)."""

    __slots__ = (
        "_attn_coeff",
        "_decode_compute_rate",
        "_decode_rate",
        "_disk_bw",
        "_disk_lat",
        "_dram_bw",
        "_dram_lat",
        "_flops_per_token",
        "_idle_w",
        "_kv_bytes_per_token",
        "_mem_w",
        "_overhead_s",
        "_prefill_rate",
        "_span_w",
        "_tp_step_s",
        "_weight_bytes",
        "_weight_read_s",
        "linear",
        "profile",
    )

    def __init__(self, profile: EngineProfile) -> None:
        if not isinstance(profile, EngineProfile):
            raise TypeError("profile: must be an EngineProfile")
        self.profile = profile
        p = profile
        # Tensor parallelism over a link (no NVLink), when the profile gives one: every layer all-reduces the
        # hidden state twice (after attention, after the MLP), a ring moving 2 (p - 1) / p of the BF16
        # activations per GPU, and each all-reduce has a fixed latency. vLLM runs them between the GEMMs (no
        # overlap), so per token they add ``4 L (p - 1) / p x hidden x 2 bytes / link`` seconds to the compute
        # (expressed as the derived efficiency ``tp_eff`` of the compute rate) and per step ``2 L x latency``
        # (in the step overhead). Without a link the flat ``tp_comm_efficiency`` applies as before.
        tp_eff_compute = tp_eff_memory = p.tp_comm_efficiency
        self._tp_step_s = 0.0
        if p.gpu_count > 1 and p.tp_link_bandwidth_bytes_per_s > 0:
            ring = 2.0 * (p.gpu_count - 1) / p.gpu_count
            comm_per_token_s = 4.0 * p.n_layers * ring / 2.0 * p.hidden_size * 2.0 / p.tp_link_bandwidth_bytes_per_s
            compute_per_token_s = 2.0 * p.n_params / (p.peak_flops * p.prefill_mfu)
            tp_eff_compute = compute_per_token_s / (compute_per_token_s + comm_per_token_s)
            tp_eff_memory = 1.0
            self._tp_step_s = 2.0 * p.n_layers * p.tp_allreduce_latency_s
        self._prefill_rate = p.peak_flops * p.prefill_mfu * tp_eff_compute  # FLOP/s achieved in prefill
        self._decode_compute_rate = self._prefill_rate
        self._decode_rate = p.hbm_bandwidth_bytes_per_s * p.decode_mbu * tp_eff_memory  # bytes/s
        self._weight_bytes = p.weight_bytes
        self._kv_bytes_per_token = p.kv_bytes_per_token
        self._overhead_s = p.step_overhead_s + self._tp_step_s
        self._weight_read_s = p.weight_bytes / self._decode_rate
        self._flops_per_token = 2.0 * p.n_params
        self._attn_coeff = 4.0 * p.n_layers * p.hidden_size  # QK^T and AV: 2 x 2 x d FLOPs per (token, context) pair per layer
        self.linear = p.step_per_prefill_token_s > 0
        if self.linear:
            # A measured CPU engine (step_model.py): the step is the compute line alone, linear in the prefill
            # tokens (per_prefill_token), the decode batch (per_sequence) and its context (per_context_token),
            # with no memory line; the rates below turn the roofline's terms into those coefficients so that the
            # replay's decode-run sums and the emulator's pacing apply unchanged.
            self._prefill_rate = self._flops_per_token / p.step_per_prefill_token_s
            self._decode_compute_rate = self._flops_per_token / p.step_per_sequence_s
            self._attn_coeff = p.step_per_context_token_s * self._decode_compute_rate
            self._decode_rate = math.inf
            self._weight_read_s = 0.0
        self._idle_w = p.idle_w
        self._span_w = p.max_w - p.idle_w
        self._mem_w = p.memory_power_weight
        self._dram_bw = p.dram_bandwidth_bytes_per_s
        self._disk_bw = p.disk_bandwidth_bytes_per_s
        self._dram_lat = p.dram_latency_s
        self._disk_lat = p.disk_latency_s

    # -- compute --------------------------------------------------------------------------------------
    def prefill_flops(self, uncached_tokens: int, batch_size: int = 1, cached_tokens: int = 0) -> float:
        """FLOPs of one prefill step: ``uncached_tokens`` new tokens spread over ``batch_size`` sequences,
        each sequence attending to ``cached_tokens / batch_size`` reused prefix tokens as well."""
        if uncached_tokens <= 0:
            return 0.0
        if self.linear:
            return uncached_tokens * self._flops_per_token
        b = batch_size if batch_size > 0 else 1
        per_seq = uncached_tokens / b
        cached_per_seq = cached_tokens / b
        return uncached_tokens * (self._flops_per_token + self._attn_coeff * (cached_per_seq + 0.5 * per_seq))

    def prefill_time_s(self, uncached_tokens: int, batch_size: int = 1, cached_tokens: int = 0) -> float:
        """Seconds of one prefill step computing ``uncached_tokens`` (total over ``batch_size`` sequences).

        Compute-bound (``prefill_flops / (peak x mfu)``) but never faster than one pass over the weights;
        plus the per-step overhead. Zero tokens cost nothing (no step is run).
        """
        if uncached_tokens < 0 or batch_size < 0 or cached_tokens < 0:
            raise ValueError("uncached_tokens: token counts and batch_size must be >= 0")
        if uncached_tokens == 0:
            return 0.0
        return self.step_time_s(self.prefill_flops(uncached_tokens, batch_size, cached_tokens), cached_tokens, 0, 0)

    def step_parts_s(self, prefill_flops: float, prefill_context_tokens: int, decode_batch: int,
                     decode_context_tokens: int) -> tuple[float, float]:
        """``(memory_s, compute_s)`` of one engine step, before the per-step overhead: the one cost function
        of a step that the replay and the emulator both use.

        A vLLM V1 step is one forward pass over every token the scheduler gave out (its scheduler has no
        prefill or decode phase, only tokens per request; the model runner runs them as one flattened
        batch): prefill chunks worth ``prefill_flops`` (the sum of ``prefill_flops(chunk, 1, context)``
        over the chunks) whose sequences already hold ``prefill_context_tokens`` of KV (cached prefix,
        earlier chunks), plus one decode token for each of ``decode_batch`` sequences holding
        ``decode_context_tokens`` in total. Memory: the weights once plus every KV token the step
        attends to; compute: the prefill FLOPs plus the decode tokens' FLOPs and attention.
        """
        mem_s = self._weight_read_s + (prefill_context_tokens + decode_context_tokens) * self._kv_bytes_per_token / self._decode_rate
        compute_s = (prefill_flops / self._prefill_rate
                     + (decode_batch * self._flops_per_token + self._attn_coeff * decode_context_tokens) / self._decode_compute_rate)
        return mem_s, compute_s

    def step_time_s(self, prefill_flops: float, prefill_context_tokens: int, decode_batch: int,
                    decode_context_tokens: int) -> float:
        """Seconds of one engine step (see ``step_parts_s``): ``overhead + max(memory_s, compute_s)``, one
        roofline over the whole step; a step with no prefill and no decode costs nothing (none is run)."""
        if prefill_flops <= 0 and decode_batch <= 0:
            return 0.0
        mem_s, compute_s = self.step_parts_s(prefill_flops, prefill_context_tokens, decode_batch, decode_context_tokens)
        return self._overhead_s + (compute_s if compute_s > mem_s else mem_s)

    def decode_step_time_s(self, batch_size: int, total_context_tokens: int) -> float:
        """Seconds of one decode step producing one token for each of ``batch_size`` sequences whose
        contexts sum to ``total_context_tokens``: ``max(weights + KV bytes / bandwidth, FLOPs / rate)``."""
        if batch_size < 0 or total_context_tokens < 0:
            raise ValueError("batch_size: batch_size and total_context_tokens must be >= 0")
        return self.step_time_s(0.0, 0, batch_size, total_context_tokens)

    def decode_step_parts_s(self, batch_size: int, total_context_tokens: int) -> tuple[float, float]:
        """``(memory_s, compute_s)`` of one decode step, for the power model and diagnostics."""
        return self.step_parts_s(0.0, 0, batch_size, total_context_tokens)

    # -- memory ---------------------------------------------------------------------------------------
    def kv_cache_bytes(self) -> float:
        """Bytes of the KV block pool: ``util x memory - weights - reserve per GPU`` (0 if it does not fit)."""
        p = self.profile
        free = p.gpu_memory_utilization * p.memory_bytes - self._weight_bytes - p.non_kv_reserve_bytes_per_gpu * p.gpu_count
        return free if free > 0 else 0.0

    def kv_cache_blocks(self) -> int:
        """Number of KV blocks (``block_size_tokens`` tokens each) the engine can hold in HBM."""
        block_bytes = self._kv_bytes_per_token * self.profile.block_size_tokens
        return int(self.kv_cache_bytes() // block_bytes)

    def kv_cache_tokens(self) -> int:
        """Token capacity of the KV pool (``kv_cache_blocks x block_size_tokens``)."""
        return self.kv_cache_blocks() * self.profile.block_size_tokens

    def kv_bytes(self, tokens: int) -> float:
        """Bytes of the KV cache of ``tokens`` tokens."""
        return tokens * self._kv_bytes_per_token

    # -- cache tiers ----------------------------------------------------------------------------------
    def load_time_s(self, tokens: int, tier: str) -> float:
        """Seconds to make ``tokens`` cached tokens usable from ``tier``.

        ``hbm``: 0 (vLLM's prefix cache reuses the blocks in place); ``dram``: LMCache L1 over the host
        link (PCIe); ``disk``: LMCache L2 read over the SSD bandwidth (then the host link, overlapped, so the
        slower of the two bounds it).
        """
        if tokens < 0:
            raise ValueError("tokens: must be >= 0")
        if tier == "hbm":
            return 0.0
        if tokens == 0:
            return 0.0
        nbytes = tokens * self._kv_bytes_per_token
        if tier == "dram":
            return self._dram_lat + nbytes / self._dram_bw
        if tier == "disk":
            bw = min(self._dram_bw, self._disk_bw)
            return self._disk_lat + nbytes / bw
        raise ValueError(f"tier: must be one of {', '.join(TIERS)}, got {tier!r}")

    def recompute_time_s(self, tokens: int, cached_before: int = 0) -> float:
        """Marginal prefill seconds to recompute ``tokens`` tokens that follow ``cached_before`` tokens
        (no step overhead, no weight-read floor: these tokens join a prefill step that runs anyway)."""
        if tokens <= 0:
            return 0.0
        return tokens * (self._flops_per_token + self._attn_coeff * (cached_before + 0.5 * tokens)) / self._prefill_rate

    def plan_prefix_reuse(self, hbm_tokens: int, dram_tokens: int, disk_tokens: int, prompt_tokens: int,
                          queue_wait_s: float = 0.0, rule: str = "latency",
                          delay_budget_s: float = math.inf) -> ReusePlan:
        """Read-or-recompute rule for a prompt whose cached prefix is split over the tiers (fastest first).

        HBM hits are always used. A DRAM or disk segment is used only if the prefix before it is used
        (reuse must be a contiguous prefix) and its reload either fits in the time the request waits in
        the queue anyway (Kareto Sec. 3.3, Obs. 2/4: disk reloads are prefetched during queueing) or is
        faster than recomputing those tokens (StoreLLM Sec. 3.4: read only when it beats compute under
        the delay budget). Reload time not hidden by queueing is returned in ``load_s``.

        ``rule`` (``REUSE_RULES``) replaces that test: ``always`` loads every segment when the request is
        scheduled, none of it hidden behind queueing (LMCache's blocking retrieve at the start of the step; Kareto's
        simulator); ``energy`` (StoreLLM) loads a segment when its reload energy (the engine waiting at idle
        power) is below the energy of recomputing it (at full power) and the reload time not hidden by queueing
        keeps the request within ``delay_budget_s`` (the wait so far, the exposed reloads and the prefill of
        the tokens still to compute): StoreLLM reads whenever the delay budget allows, even when reading is
        slower than computing.
        """
        if min(hbm_tokens, dram_tokens, disk_tokens, prompt_tokens) < 0 or queue_wait_s < 0:
            raise ValueError("prompt_tokens: token counts and queue_wait_s must be >= 0")
        if rule not in REUSE_RULES:
            raise ValueError(f"rule: must be one of {', '.join(REUSE_RULES)}, got {rule!r}")
        if not delay_budget_s > 0:
            raise ValueError("delay_budget_s: must be > 0")
        if hbm_tokens + dram_tokens + disk_tokens > prompt_tokens:
            raise ValueError("prompt_tokens: cached tokens exceed the prompt")
        used = hbm_tokens
        budget = queue_wait_s
        exposed = 0.0
        used_dram = used_disk = 0
        skipped = 0
        for tier, tokens in (("dram", dram_tokens), ("disk", disk_tokens)):
            if tokens == 0:
                continue
            if skipped:
                skipped += tokens
                continue
            load_s = self.load_time_s(tokens, tier)
            if rule == "always":  # LMCache loads a hit when the request is scheduled: nothing is hidden
                exposed += load_s
            elif rule == "energy":
                hidden = min(load_s, budget)
                recompute_s = self.recompute_time_s(tokens, used)
                rest_s = self.recompute_time_s(prompt_tokens - used - tokens, used + tokens)
                saves = load_s * self._idle_w < recompute_s * (self._idle_w + self._span_w)
                if not (saves and queue_wait_s + exposed + load_s - hidden + rest_s <= delay_budget_s):
                    skipped += tokens
                    continue
                exposed += load_s - hidden
                budget -= hidden
            elif load_s <= budget:
                budget -= load_s
            elif load_s - budget < self.recompute_time_s(tokens, used):
                exposed += load_s - budget
                budget = 0.0
            else:
                skipped += tokens
                continue
            used += tokens
            if tier == "dram":
                used_dram = tokens
            else:
                used_disk = tokens
        return ReusePlan(hbm_tokens, used_dram, used_disk, prompt_tokens - used, exposed, skipped)

    # -- power ----------------------------------------------------------------------------------------
    def power_w(self, utilisation: float) -> float:
        """Engine power draw at ``utilisation`` in [0, 1]: ``idle + (max - idle) x utilisation``."""
        if not 0.0 <= utilisation <= 1.0:
            raise ValueError(f"utilisation: must be in [0, 1], got {utilisation!r}")
        return self._idle_w + self._span_w * utilisation

    def prefill_utilisation(self) -> float:
        """Utilisation of a compute-bound prefill step (1.0)."""
        return 1.0

    def decode_utilisation(self, batch_size: int, total_context_tokens: int) -> float:
        """Utilisation of a decode step: compute share + ``memory_power_weight`` x memory-bound share."""
        if batch_size <= 0:
            return 0.0
        return self.step_utilisation(*self.decode_step_parts_s(batch_size, total_context_tokens))

    def step_utilisation(self, memory_s: float, compute_s: float) -> float:
        """Utilisation of a step with these ``step_parts_s``: its compute-bound share plus
        ``memory_power_weight`` times its memory-bound share (1.0 for a step of no length)."""
        step = compute_s if compute_s > memory_s else memory_s
        if step <= 0:
            return 1.0
        u = compute_s / step + self._mem_w * (1.0 - compute_s / step)
        return u if u < 1.0 else 1.0

    def step_energy_j(self, step_s: float, utilisation: float) -> float:
        """Joules drawn by the engine during a step of ``step_s`` at ``utilisation``."""
        return self.power_w(utilisation) * step_s

    # -- modes ----------------------------------------------------------------------------------------
    @staticmethod
    def expected_tokens_per_verify(num_speculative_tokens: int, acceptance_rate: float) -> float:
        """Expected tokens per speculative round: ``1 + k x r`` with ``r`` = accepted / proposed draft tokens
        (GreenLLM's and vLLM's acceptance rate; see ``SpecDecodeConfig``)."""
        r, k = acceptance_rate, num_speculative_tokens
        if not 0.0 <= r <= 1.0 or k < 1:
            raise ValueError("acceptance_rate: must be in [0, 1] with num_speculative_tokens >= 1")
        return 1.0 + k * r

    def spec_decode_round_parts_s(self, spec: SpecDecodeConfig, batch_size: int, total_context_tokens: int
                                  ) -> tuple[float, float, float]:
        """``(draft_s, verify_s, link_s)`` of one speculative round for the batch: ``k`` draft decode steps (on
        the draft's engine: the same GPU for SpecDecode, another for DSD), one target verify step over ``k + 1``
        tokens per sequence, and for DSD the link time the round waits for: the token ids (sent first), plus
        whatever of the probabilities' transfer outlasts the verify step (GreenLLM Fig. 2: they travel while
        the target verifies, which needs them only at the end)."""
        if batch_size <= 0:
            return 0.0, 0.0, 0.0
        k = spec.num_speculative_tokens
        draft = PerfModel(spec.draft) if not isinstance(spec.draft, PerfModel) else spec.draft
        draft_s = 0.0
        for i in range(k):
            draft_s += draft.decode_step_time_s(batch_size, total_context_tokens + i * batch_size)
        ctx = total_context_tokens + k * batch_size
        verify_mem = self._weight_read_s + ctx * self._kv_bytes_per_token / self._decode_rate
        verify_compute = (batch_size * (k + 1) * self._flops_per_token
                          + self._attn_coeff * ctx * (k + 1)) / self._decode_compute_rate
        verify_s = self._overhead_s + max(verify_mem, verify_compute)
        link_s = 0.0
        if spec.disaggregated:
            ids_s = batch_size * k * 4 / spec.link_bandwidth_bytes_per_s
            probs_s = batch_size * k * spec.vocab_size * 4 / spec.link_bandwidth_bytes_per_s
            link_s = ids_s + max(0.0, probs_s - verify_s)
        return draft_s, verify_s, link_s

    def spec_decode_step_time_s(self, spec: SpecDecodeConfig, batch_size: int, total_context_tokens: int) -> float:
        """Seconds of one speculative round for the batch (``spec_decode_round_parts_s`` summed)."""
        return sum(self.spec_decode_round_parts_s(spec, batch_size, total_context_tokens))

    def spec_decode_tpot_s(self, spec: SpecDecodeConfig, batch_size: int, total_context_tokens: int) -> float:
        """Mean seconds per output token with speculative decoding (round time / expected tokens)."""
        return self.spec_decode_step_time_s(spec, batch_size, total_context_tokens) / self.expected_tokens_per_verify(
            spec.num_speculative_tokens, spec.acceptance_rate)

    def kv_transfer_time_s(self, tokens: int, link_bandwidth_bytes_per_s: float, link_latency_s: float = 0.0) -> float:
        """Seconds to ship the KV cache of ``tokens`` tokens from a prefill to a decode engine (DPD)."""
        if tokens < 0 or link_bandwidth_bytes_per_s <= 0 or link_latency_s < 0:
            raise ValueError("link_bandwidth_bytes_per_s: must be > 0 with tokens >= 0")
        if tokens == 0:
            return 0.0
        return link_latency_s + tokens * self._kv_bytes_per_token / link_bandwidth_bytes_per_s

    @staticmethod
    def disagg_request_latency_s(config: DisaggConfig, prompt_tokens: int, output_tokens: int,
                                 decode_batch_size: int = 1, mean_context_tokens: int | None = None) -> tuple[float, float, float]:
        """Unloaded ``(ttft_s, tpot_s, kv_transfer_s)`` of one request in DPD mode: prefill on the prefill
        engine, KV transfer over the link, then decode on the decode engine at ``decode_batch_size``."""
        pre = PerfModel(config.prefill)
        dec = PerfModel(config.decode)
        ttft = pre.prefill_time_s(prompt_tokens)
        transfer = pre.kv_transfer_time_s(prompt_tokens, config.link_bandwidth_bytes_per_s, config.link_latency_s)
        ctx = mean_context_tokens if mean_context_tokens is not None else prompt_tokens + output_tokens // 2
        tpot = dec.decode_step_time_s(decode_batch_size, ctx * decode_batch_size)
        return ttft, tpot, transfer

    # -- convenience ----------------------------------------------------------------------------------
    def unloaded_request_s(self, prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> tuple[float, float]:
        """``(ttft_s, tpot_s)`` of one request alone on an idle engine (no queueing, batch 1)."""
        uncached = max(prompt_tokens - cached_tokens, 1)
        ttft = self.prefill_time_s(uncached, 1, cached_tokens)
        if output_tokens <= 1:
            return ttft, 0.0
        ctx = prompt_tokens + output_tokens // 2
        return ttft, self.decode_step_time_s(1, ctx)
