"""Step timing of the emulated engine, taken from the simulator's performance model.

One engine step of vLLM V1's continuous batching runs, in one forward pass, the prefill chunks of
newly admitted (or still prefilling) requests and one decode token for every running request. The
emulator charges such a mixed step ``prefill_time_s(prefill tokens, prefill batch) +
decode_step_time_s(decode batch, decode context)``: the prefill part is compute-bound in the
uncached tokens, the decode part memory-bound in the weights plus the batch's KV context
(``greenserve.simulator.perf_model``). Adding them slightly over-charges a mixed step (the weights
are streamed once per pass, not twice); pure prefill and pure decode steps are exact per the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: model context length used when the profile gives none (Llama 3's max_position_embeddings).
DEFAULT_MAX_MODEL_LEN_TOKENS = 8192
#: vLLM V1 chunked-prefill token budget when the profile gives none (see profiles.toml engine_defaults).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class EngineShape:
    """Sizes of one emulated engine, resolved from the profile and the emulator's flags."""

    profile_name: str
    served_model_name: str
    block_size_tokens: int
    num_gpu_blocks: int
    max_model_len_tokens: int
    max_num_batched_tokens: int


class StepTimer:
    """Modelled duration of engine steps (seconds of the modelled engine, before time scaling)."""

    def __init__(self, perf_model: Any) -> None:
        self._pm = perf_model
        # decode_step_parts_s(0, 0) = (one pass over the weights, no compute)
        self._weight_pass_s = float(perf_model.decode_step_parts_s(0, 0)[0])

    def step_time_s(
        self,
        prefill_tokens: int,
        prefill_batch: int,
        prefill_context_tokens: int,
        decode_batch: int,
        decode_context_tokens: int,
    ) -> float:
        """Duration of one step: ``prefill_tokens`` new prompt tokens over ``prefill_batch`` sequences
        that already hold ``prefill_context_tokens`` (cached or earlier chunks), plus one decode token
        for each of ``decode_batch`` sequences with ``decode_context_tokens`` of context in total.

        A mixed step pays the prefill step (which includes the per-step overhead and one pass over
        the weights) plus what the decode batch adds on top: its KV reads or its FLOPs, whichever
        is larger.
        """
        pm = self._pm
        if prefill_tokens <= 0:
            return float(pm.decode_step_time_s(decode_batch, decode_context_tokens)) if decode_batch > 0 else 0.0
        t = float(pm.prefill_time_s(prefill_tokens, batch_size=max(1, prefill_batch), cached_tokens=prefill_context_tokens))
        if decode_batch > 0:
            mem_s, compute_s = pm.decode_step_parts_s(decode_batch, decode_context_tokens)
            t += max(float(mem_s) - self._weight_pass_s, float(compute_s))
        return t


def load_perf_model(profile_name: str | None) -> tuple[Any, Any, str]:
    """(profile, PerfModel, profile name) for ``profile_name`` or the simulator's default profile.

    Raises KeyError listing the known profiles when the name is unknown.
    """
    from greenserve.simulator import perf_model as pm

    name = profile_name or pm.DEFAULT_PROFILE
    known = list(pm.list_profiles())
    if name not in known:
        raise KeyError(f"unknown profile {name!r}; choices: {', '.join(sorted(known))}")
    profile = pm.load_profile(name)
    return profile, pm.PerfModel(profile), name


def resolve_shape(
    profile: Any,
    perf_model: Any,
    profile_name: str,
    served_model_name: str | None = None,
    max_model_len_tokens: int | None = None,
    num_gpu_blocks: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> EngineShape:
    """Engine sizes: KV blocks from the model's memory budget (or an override), block size and
    chunked-prefill token budget from the profile (or an override)."""
    block = int(getattr(profile, "block_size_tokens", 16))
    blocks = int(num_gpu_blocks or perf_model.kv_cache_blocks())
    if blocks <= 0:
        raise ValueError(f"profile {profile_name!r} leaves no memory for the KV cache")
    capacity = blocks * block
    max_len = int(max_model_len_tokens or DEFAULT_MAX_MODEL_LEN_TOKENS)
    max_len = min(max_len, capacity)  # vLLM refuses to start when one sequence cannot fit the pool
    batched = int(max_num_batched_tokens or getattr(profile, "max_num_batched_tokens", 0) or DEFAULT_MAX_NUM_BATCHED_TOKENS)
    name = served_model_name or str(getattr(profile, "model", "") or profile_name)
    return EngineShape(profile_name, str(name), block, blocks, max_len, max(batched, 1))
