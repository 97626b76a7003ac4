"""Fault injection state of an emulated engine (reliability tests of routers and gateways).

* ``crash``: the engine dies: every open connection is cut mid-stream and the port stops
  accepting connections (the CLI process exits). In-process, clearing ``crash`` restarts the engine
  on the same port with an empty prefix cache, like a restarted pod.
* ``hang``: requests are accepted but no token is ever produced, and ``/health`` does not answer,
  until ``hang`` is cleared.
* ``slow_factor``: every engine step takes this many times longer (a throttled or shared GPU).
* ``error_rate``: this fraction of generation requests gets HTTP 500 before any token, drawn from
  a ``random.Random(seed)`` so a test sees the same sequence every run.
* ``fail_after_tokens``: every stream is cut (connection aborted) after this many generated tokens
  (0 = off): "dies mid-stream" without taking the whole engine down.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any


class FaultSpecError(ValueError):
    """A fault setting is invalid; ``field`` names it (the admin endpoint answers 400 with it)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass
class FaultState:
    """Current fault settings; see the module docstring for what each one does."""

    crash: bool = False
    hang: bool = False
    slow_factor: float = 1.0
    error_rate: float = 0.0
    seed: int = 0
    fail_after_tokens: int = 0
    _rng: random.Random = field(default_factory=lambda: random.Random(0), repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        """JSON view (``GET /admin/faults``)."""
        d = asdict(self)
        d.pop("_rng", None)
        return d

    def draw_error(self) -> bool:
        """Whether the next request is to be answered 500 (consumes one draw only when enabled)."""
        return self.error_rate > 0.0 and self._rng.random() < self.error_rate


def validate_fault_update(update: Any) -> dict[str, Any]:
    """Check a partial update (``POST /admin/faults`` body or keyword arguments); return it typed.

    Raises FaultSpecError naming the first bad field. Unknown keys are rejected so a typo
    (``"errror_rate"``) does not silently do nothing.
    """
    if not isinstance(update, dict):
        raise FaultSpecError("body", "must be a JSON object")
    out: dict[str, Any] = {}
    for key, value in update.items():
        if key in ("crash", "hang"):
            if not isinstance(value, bool):
                raise FaultSpecError(key, "must be true or false")
            out[key] = value
        elif key == "slow_factor":
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise FaultSpecError(key, "must be a finite number > 0 (1.0 = normal speed)")
            out[key] = float(value)
        elif key == "error_rate":
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise FaultSpecError(key, "must be a number in [0, 1]")
            out[key] = float(value)
        elif key in ("seed", "fail_after_tokens"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise FaultSpecError(key, "must be an integer >= 0")
            out[key] = value
        else:
            raise FaultSpecError(
                key, "unknown fault; known: crash, hang, slow_factor, error_rate, seed, fail_after_tokens"
            )
    return out


def apply_fault_update(state: FaultState, update: dict[str, Any]) -> None:
    """Apply a validated update; a new ``seed`` (or a new ``error_rate``) restarts the error draws."""
    for key, value in update.items():
        setattr(state, key, value)
    if "seed" in update or "error_rate" in update:
        state._rng = random.Random(state.seed)
