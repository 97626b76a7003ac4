"""The deadline of the RPC being served, shared by the server runtime (which sets it) and the clients (whose
outbound calls never outlive it)."""
from __future__ import annotations

import contextvars
import time

# Absolute deadline (time.monotonic()) of the RPC being served; outbound calls never outlive it.
current_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("greenserve_deadline", default=None)


def remaining_s() -> float | None:
    """Seconds left before the current RPC's deadline, or None when it has none."""
    deadline = current_deadline.get()
    return None if deadline is None else deadline - time.monotonic()
