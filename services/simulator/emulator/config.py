"""Settings of one emulated engine (the in-process API and the CLI flags share them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from greenserve.simulator.emulator.modes import ModeSettings


@dataclass
class EmulatorConfig:
    """What an emulated engine serves and how fast.

    ``profile`` names a performance profile of ``greenserve.simulator.engine_profile`` (None = its
    default); ``model`` is the served model name clients must send (None = the profile's model);
    ``time_scale`` > 1 runs the modelled engine that many times faster than real time.
    """

    host: str = "127.0.0.1"
    port: int = 0
    profile: str | None = None
    model: str | None = None
    time_scale: float = 1.0
    max_num_seqs: int = 256
    #: overrides the profile's chunked-prefill token budget per step (None = profile value)
    max_num_batched_tokens: int | None = None
    #: context length limit (None = 8192, capped by the KV pool's capacity)
    max_model_len: int | None = None
    #: overrides the KV pool size in blocks (None = from the profile's memory budget); small values
    #: make eviction and preemption easy to exercise in tests
    num_gpu_blocks: int | None = None
    #: max_tokens of a chat request that names none (a real model stops at EOS; see server docs)
    default_chat_max_tokens: int = 256
    #: per-token probability of a deterministic pseudo end-of-sequence (0 = always max_tokens)
    eos_probability: float = 0.0
    # initial faults (see faults.py)
    hang: bool = False
    slow_factor: float = 1.0
    error_rate: float = 0.0
    fault_seed: int = 0
    fail_after_tokens: int = 0
    #: crash by itself this many wall-clock seconds after start (None = never)
    crash_after_s: float | None = None
    #: the CLI sets this: a crash ends the process (in-process engines just stop listening)
    exit_on_crash: bool = False
    #: serving mode (GreenLLM: standalone, spec_decode, dpd, dsd) and what it needs (modes.py)
    serving_mode: ModeSettings = field(default_factory=ModeSettings)
    #: vLLM's --enable-sleep-mode: POST /sleep, POST /wake_up, GET /is_sleeping (sleep_mode.py); off, as in vLLM
    enable_sleep_mode: bool = False
    #: engine seconds a sleep takes (None = modelled: the weights offloaded over the host link)
    sleep_s: float | None = None
    #: engine seconds a wake-up takes (None = modelled: the weights loaded back over the host link)
    wake_up_s: float | None = None

    def validate(self) -> None:
        """Raise ValueError naming the first invalid setting."""
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: must be in 0..65535, got {self.port}")
        if not (isinstance(self.time_scale, int | float) and math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"time_scale: must be a finite number > 0, got {self.time_scale}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs: must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens: must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len: must be >= 2, got {self.max_model_len}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks: must be >= 1, got {self.num_gpu_blocks}")
        if self.default_chat_max_tokens < 1:
            raise ValueError(f"default_chat_max_tokens: must be >= 1, got {self.default_chat_max_tokens}")
        if not 0.0 <= self.eos_probability < 1.0:
            raise ValueError(f"eos_probability: must be in [0, 1), got {self.eos_probability}")
        if not (math.isfinite(self.slow_factor) and self.slow_factor > 0):
            raise ValueError(f"slow_factor: must be a finite number > 0, got {self.slow_factor}")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"error_rate: must be in [0, 1], got {self.error_rate}")
        if self.fail_after_tokens < 0:
            raise ValueError(f"fail_after_tokens: must be >= 0, got {self.fail_after_tokens}")
        if self.crash_after_s is not None and not self.crash_after_s >= 0:
            raise ValueError(f"crash_after_s: must be >= 0, got {self.crash_after_s}")
        for name in ("sleep_s", "wake_up_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: must be a finite number >= 0, got {value}")
        self.serving_mode.validate()
