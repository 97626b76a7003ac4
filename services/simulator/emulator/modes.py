"""Serving modes of the emulated engine (GreenLLM), paced by the performance model as the replay
paces them.

* ``standalone``: the engine's own steps (``pacing.StepTimer``).
* ``spec_decode``: a draft on the same GPU proposes ``k`` tokens, the target verifies them; a decode step costs one
  speculative round over the expected tokens per round, ``1 + k r`` (``PerfModel.spec_decode_tpot_s``), the draft's
  steps and the verification on the engine's GPU.
* ``dsd``: the draft on an older GPU (``draft_profile`` on that GPU), token ids and then probabilities over the link
  (the probabilities while the target verifies); that GPU's idle power is added to the engine's.
* ``dpd``: the emulated engine stands for the pair: prefill steps on the engine's profile, each prefilled prompt's
  KV cache over the link, decode steps on ``decode_profile`` (the older GPU), the two running side by side (a step
  lasts as long as the slower of its prefill part and its decode part); the older GPU's idle power is added.
* ``dpd`` with a PD role: the pair as two engines behind a proxy (the router's ``disaggregated.py``), as vLLM runs
  it. ``pd_role="prefill"``: the engine on the new GPU's profile prefills and answers one token whatever
  ``max_tokens`` asks (the proxy sends 1). ``pd_role="decode"``: the engine on the older GPU's profile does not
  prefill again: each prompt chunk it admits costs the transfer of its KV cache over the declared link
  (``PerfModel.kv_transfer_time_s``, the same figure the replay and ``mode_units`` charge), the GPU idle meanwhile,
  then it decodes on its own profile.

The emulator emits one token per sequence per step, so a speculative round is spread over its expected tokens (the
mean TPOT), as the replay does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from greenserve.simulator.emulator.pacing import StepTimer

MODES = ("standalone", "spec_decode", "dpd", "dsd")
PD_ROLES = ("", "prefill", "decode")  # "": dpd emulated as one engine standing for the pair


@dataclass(frozen=True)
class ModeSettings:
    """The mode of one emulated engine and what it needs (profiles are the simulator's names)."""

    mode: str = "standalone"
    draft_profile: str | None = None  # spec_decode (on this GPU) and dsd (on the older GPU)
    decode_profile: str | None = None  # dpd: the target on the older GPU
    acceptance_fraction: float = 0.457  # accepted / proposed (GreenLLM Sec. V-A, 1B draft)
    num_speculative_tokens: int = 3
    link_bandwidth_bytes_per_s: float = 2e9  # 16 Gbps (GreenLLM)
    pd_role: str = ""  # dpd as a pair of engines: "prefill" or "decode" (see the module docstring)

    def validate(self) -> None:
        """ValueError naming the first invalid setting."""
        if self.mode not in MODES:
            raise ValueError(f"mode: must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode in ("spec_decode", "dsd") and not self.draft_profile:
            raise ValueError(f"draft_profile: mode {self.mode} needs the draft's profile")
        if self.pd_role not in PD_ROLES:
            raise ValueError(f"pd_role: must be prefill or decode, got {self.pd_role!r}")
        if self.pd_role and self.mode != "dpd":
            raise ValueError(f"pd_role: only mode dpd runs as a prefill/decode pair, got mode {self.mode}")
        if self.mode == "dpd" and not self.pd_role and not self.decode_profile:
            raise ValueError("decode_profile: mode dpd needs the decode GPU's profile")
        if not 0.0 <= self.acceptance_fraction <= 1.0:
            raise ValueError(f"acceptance_fraction: must be in [0, 1], got {self.acceptance_fraction}")
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError(f"num_speculative_tokens: must be in 1..16, got {self.num_speculative_tokens}")
        if not (math.isfinite(self.link_bandwidth_bytes_per_s) and self.link_bandwidth_bytes_per_s > 0):
            raise ValueError(f"link_bandwidth_bytes_per_s: must be > 0, got {self.link_bandwidth_bytes_per_s}")


class ModeTimer(StepTimer):
    """``StepTimer`` for the modes other than standalone (see the module docstring)."""

    def __init__(self, perf_model: Any, settings: ModeSettings) -> None:
        from greenserve.simulator.engine_profile import load_profile
        from greenserve.simulator.mode_configs import SpecDecodeConfig
        from greenserve.simulator.perf_model import PerfModel

        super().__init__(perf_model)
        settings.validate()
        self.settings = settings
        self._spec = None
        self._decode = None
        self._draft_pm = None
        self._second_idle_w = 0.0
        if settings.mode in ("spec_decode", "dsd"):
            draft = load_profile(str(settings.draft_profile))
            self._spec = SpecDecodeConfig(draft=draft, num_speculative_tokens=settings.num_speculative_tokens,
                                          acceptance_rate=settings.acceptance_fraction,
                                          disaggregated=settings.mode == "dsd",
                                          link_bandwidth_bytes_per_s=settings.link_bandwidth_bytes_per_s)
            if settings.mode == "dsd":
                self._draft_pm = PerfModel(draft)
                self._second_idle_w = float(self._draft_pm.power_w(0.0))
        elif settings.mode == "dpd":
            self._decode = PerfModel(load_profile(str(settings.decode_profile)))
            self._second_idle_w = float(self._decode.power_w(0.0))
        self.idle_power_w += self._second_idle_w

    def step(self, prefill_chunks: Iterable[tuple[int, int]], decode_batch: int,
             decode_context_tokens: int) -> tuple[float, float]:
        chunks = list(prefill_chunks)
        prefill_s, prefill_w = StepTimer.step(self, chunks, 0, 0)
        prefill_w = prefill_w if prefill_s > 0 else 0.0
        pm = self._pm
        decode_s = decode_w = 0.0
        if decode_batch > 0:
            if self._spec is not None:
                decode_s = pm.spec_decode_tpot_s(self._spec, decode_batch, decode_context_tokens)
                decode_w = pm.power_w(pm.decode_utilisation(decode_batch, decode_context_tokens))
                if self._draft_pm is not None:  # dsd: the target busy while it verifies, the draft GPU while it drafts
                    draft_s, verify_s, link_s = pm.spec_decode_round_parts_s(self._spec, decode_batch,
                                                                           decode_context_tokens)
                    rnd = draft_s + verify_s + link_s
                    idle = float(pm.power_w(0.0))
                    draft_busy = self._draft_pm.power_w(self._draft_pm.decode_utilisation(decode_batch,
                                                                                        decode_context_tokens))
                    decode_w = idle + (decode_w - idle) * verify_s / rnd + (draft_busy - self._second_idle_w) * \
                        draft_s / rnd
            else:
                assert self._decode is not None
                decode_s = self._decode.decode_step_time_s(decode_batch, decode_context_tokens)
                decode_w = self._decode.power_w(self._decode.decode_utilisation(decode_batch, decode_context_tokens))
        if self._decode is not None:  # dpd: the prompts' KV over the link, prefill and decode GPUs side by side
            prefilled = sum(tokens for tokens, _ in chunks if tokens > 0)
            link_s = prefilled * pm.profile.kv_bytes_per_token / self.settings.link_bandwidth_bytes_per_s
            duration = max(prefill_s + link_s, decode_s)
            if duration <= 0:
                return 0.0, self.idle_power_w
            # each GPU busy for its own part, idle the rest of the step
            target_w = (prefill_w * prefill_s + float(pm.power_w(0.0)) * (duration - prefill_s)) / duration
            decode_gpu_w = (decode_w * decode_s + self._second_idle_w * (duration - decode_s)) / duration
            return float(duration), float(target_w + decode_gpu_w)
        duration = prefill_s + decode_s
        if duration <= 0:
            return 0.0, self.idle_power_w
        power = (prefill_w * prefill_s + decode_w * decode_s) / duration + self._second_idle_w
        return float(duration), float(power)


class PdDecodeTimer(StepTimer):
    """The decoder of a DPD pair (``pd_role="decode"``): a prompt's KV cache arrives over the link instead of being
    prefilled; decode steps on the engine's own profile (the older GPU)."""

    def __init__(self, perf_model: Any, settings: ModeSettings) -> None:
        super().__init__(perf_model)
        settings.validate()
        self.settings = settings

    def step(self, prefill_chunks: Iterable[tuple[int, int]], decode_batch: int,
             decode_context_tokens: int) -> tuple[float, float]:
        pm = self._pm
        received = sum(tokens for tokens, _ in prefill_chunks if tokens > 0)
        link_s = pm.kv_transfer_time_s(received, self.settings.link_bandwidth_bytes_per_s)
        decode_s, decode_w = StepTimer.step(self, (), decode_batch, decode_context_tokens)
        duration = link_s + decode_s
        if duration <= 0:
            return 0.0, self.idle_power_w
        # the GPU waits (idle) while the KV cache arrives, then runs the decode step
        return float(duration), float((self.idle_power_w * link_s + decode_w * decode_s) / duration)


def make_timer(perf_model: Any, settings: ModeSettings) -> StepTimer:
    """The step timer of an engine in ``settings``' mode (a DPD prefiller paces as a standalone engine)."""
    if settings.mode == "standalone" or settings.pd_role == "prefill":
        return StepTimer(perf_model)
    if settings.pd_role == "decode":
        return PdDecodeTimer(perf_model, settings)
    return ModeTimer(perf_model, settings)
