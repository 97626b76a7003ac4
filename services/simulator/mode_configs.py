"""The parameters of the serving modes ``perf_model.PerfModel`` times: speculative decoding (GreenLLM SpecDecode and
DSD, ``SpecDecodeConfig``) and prefill/decode disaggregation (GreenLLM DPD, ``DisaggConfig``), each checked at
construction (ValueError naming the field).
"""

from __future__ import annotations

from dataclasses import dataclass

from greenserve.simulator.engine_profile import EngineProfile

__all__ = ["DisaggConfig", "SpecDecodeConfig"]


@dataclass(frozen=True)
class SpecDecodeConfig:
    """Speculative decoding (GreenLLM SpecDecode/DSD): a draft model proposes ``num_speculative_tokens``.

    ``acceptance_rate`` is accepted / proposed draft tokens, as GreenLLM Sec. V-A reports it (45.7 % for the 1B
    draft, 35.3 % for the 300M draft, 3 speculative tokens on Llama 7B) and as vLLM's
    ``spec_decode_draft_acceptance_rate`` metric measures it: a round of ``k`` proposals yields ``1 + k x r``
    tokens on average (the accepted ones plus the target's own). (Read as a per-token probability with
    Leviathan et al.'s ``(1 - r^(k+1)) / (1 - r)`` the same figure gives 1.76 instead of 2.37 tokens at k = 3,
    r = 0.457: TPOT overstated by a third.)
    ``draft`` is the draft model's profile (on the same GPU for SpecDecode, another GPU for DSD).
    ``link_bandwidth_bytes_per_s`` is only used for DSD: per round the draft sends its token ids (4 bytes each)
    and then their probability distributions (``vocab_size x 4`` bytes per proposed token) to the target; the
    probabilities travel while the target verifies (GreenLLM Fig. 2), so only what outlasts the verify step
    delays the round.
    """

    draft: EngineProfile
    num_speculative_tokens: int = 3
    acceptance_rate: float = 0.457
    disaggregated: bool = False
    link_bandwidth_bytes_per_s: float = 2e9
    vocab_size: int = 32000

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens: must be >= 1")
        if not 0.0 <= self.acceptance_rate <= 1.0:
            raise ValueError("acceptance_rate: must be in [0, 1] (accepted / proposed draft tokens)")
        if self.link_bandwidth_bytes_per_s <= 0:
            raise ValueError("link_bandwidth_bytes_per_s: must be > 0")
        if self.vocab_size < 1:
            raise ValueError("vocab_size: must be >= 1")


@dataclass(frozen=True)
class DisaggConfig:
    """Prefill/decode disaggregation (GreenLLM DPD): prefill on ``prefill``'s engine, decode on ``decode``'s;
    the prompt's KV cache crosses a link of ``link_bandwidth_bytes_per_s`` (GreenLLM: 16 Gbps = 2 GB/s on GCP).
    """

    prefill: EngineProfile
    decode: EngineProfile
    link_bandwidth_bytes_per_s: float = 2e9
    link_latency_s: float = 0.0005

    def __post_init__(self) -> None:
        if self.link_bandwidth_bytes_per_s <= 0:
            raise ValueError("link_bandwidth_bytes_per_s: must be > 0")
        if self.link_latency_s < 0:
            raise ValueError("link_latency_s: must be >= 0")
        if self.prefill.kv_bytes_per_token != self.decode.kv_bytes_per_token:
            raise ValueError("decode: prefill and decode engines must serve the same model (KV layout differs)")
