"""Step timing and power of the emulated engine, taken from the simulator's performance model.

One engine step of vLLM V1's continuous batching is one forward pass over every token its scheduler
gave out: the prefill chunks of newly admitted (or still prefilling) requests and one decode token for
every running request (the scheduler has no prefill or decode phase, only tokens per request; the
model runner flattens them into one batch). The emulator charges such a step what the replay charges
it, ``PerfModel.step_time_s``: one roofline over the whole step (the weights streamed once, every KV
token the step attends to read, the prefill and decode FLOPs together), plus the per-step overhead.
The step's modelled power is ``PerfModel.power_w`` at that step's utilisation (``step_utilisation``).
"""

from __future__ import annotations

from collections.abc import Iterable
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
    """Modelled duration and power of engine steps (seconds of the modelled engine, before time scaling)."""

    def __init__(self, perf_model: Any) -> None:
        self._pm = perf_model
        #: the engine's modelled draw while no step runs (watts)
        self.idle_power_w = float(perf_model.power_w(0.0))

    def step(self, prefill_chunks: Iterable[tuple[int, int]], decode_batch: int,
             decode_context_tokens: int) -> tuple[float, float]:
        """``(duration_s, power_w)`` of one step: ``prefill_chunks`` as (new prompt tokens, tokens the
        sequence already holds: cached prefix or earlier chunks), plus one decode token for each of
        ``decode_batch`` sequences with ``decode_context_tokens`` of context in total. An empty step
        is ``(0, idle power)``."""
        pm = self._pm
        flops = 0.0
        context = 0
        for tokens, held in prefill_chunks:
            if tokens > 0:
                flops += pm.prefill_flops(tokens, 1, held)
                context += held
        if flops <= 0 and decode_batch <= 0:
            return 0.0, self.idle_power_w
        mem_s, compute_s = pm.step_parts_s(flops, context, decode_batch, decode_context_tokens)
        duration_s = pm.step_time_s(flops, context, decode_batch, decode_context_tokens)
        return float(duration_s), float(pm.power_w(pm.step_utilisation(mem_s, compute_s)))


def load_perf_model(profile_name: str | None) -> tuple[Any, Any, str]:
    """(profile, PerfModel, profile name) for ``profile_name`` or the simulator's default profile.

    Raises KeyError listing the known profiles when the name is unknown.
    """
    from greenserve.simulator.engine_profile import DEFAULT_PROFILE, list_profiles, load_profile
    from greenserve.simulator.perf_model import PerfModel

    name = profile_name or DEFAULT_PROFILE
    known = list(list_profiles())
    if name not in known:
        raise KeyError(f"unknown profile {name!r}; choices: {', '.join(sorted(known))}")
    profile = load_profile(name)
    return profile, PerfModel(profile), name


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
