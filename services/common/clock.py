"""One clock for every scheduler, plan interval and feed: the wall clock, or a virtual clock.

A virtual clock maps real time onto a virtual timeline: ``virtual = start + (real - anchor) x speed``. Processes
that share ``start``, ``speed`` and ``anchor`` agree on the virtual time, so a whole fleet (``greenserve up``, the
demo, the evaluation) lives through a day in minutes. ``anchor`` is the real (Unix) instant at which the virtual
clock reads ``start``; without one, the process's own start is used (fine for one process, not for a fleet).

Configuration: the flags ``--clock-start``, ``--clock-speed`` and ``--clock-anchor-s`` of every service, or the
env vars ``GREENSERVE_CLOCK_START`` (ISO-8601 instant), ``GREENSERVE_CLOCK_SPEED`` (virtual seconds per real
second, in (0, 100000]) and ``GREENSERVE_CLOCK_ANCHOR_S`` (Unix seconds). Code reads the clock of the process
through ``clock()``; tests install their own with ``set_clock``.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Mapping
from datetime import UTC, datetime

MAX_SPEED = 100_000.0
ENV_START = "GREENSERVE_CLOCK_START"
ENV_SPEED = "GREENSERVE_CLOCK_SPEED"
ENV_ANCHOR = "GREENSERVE_CLOCK_ANCHOR_S"


class Clock:
    """The wall clock. Subclasses change what ``now_s`` reads and how long a virtual wait takes."""

    speed: float = 1.0
    virtual: bool = False

    def now_s(self) -> float:
        """Current instant, Unix seconds (UTC)."""
        return time.time()

    def now(self) -> datetime:
        """Current instant as an aware UTC datetime."""
        return datetime.fromtimestamp(self.now_s(), UTC)

    def real_delay_s(self, virtual_s: float) -> float:
        """Real seconds that ``virtual_s`` clock seconds take."""
        return max(0.0, virtual_s) / self.speed

    async def sleep(self, virtual_s: float) -> None:
        """Waits ``virtual_s`` seconds of this clock."""
        await asyncio.sleep(self.real_delay_s(virtual_s))

    async def sleep_until(self, instant_s: float) -> None:
        """Waits until the clock reads ``instant_s`` (returns at once when it is past)."""
        await asyncio.sleep(self.real_delay_s(instant_s - self.now_s()))

    def describe(self) -> str:
        return "wall clock"


WallClock = Clock


class VirtualClock(Clock):
    """``start_s + (real - anchor_s) x speed``: a fleet-wide virtual timeline."""

    virtual = True

    def __init__(self, start_s: float, speed: float = 1.0, anchor_s: float | None = None) -> None:
        if not math.isfinite(start_s):
            raise ValueError("clock_start: must be a finite instant")
        if not math.isfinite(speed) or not 0 < speed <= MAX_SPEED:
            raise ValueError(f"clock_speed: must be in (0, {MAX_SPEED:g}], got {speed!r}")
        if anchor_s is not None and not math.isfinite(anchor_s):
            raise ValueError("clock_anchor_s: must be finite")
        self.start_s = float(start_s)
        self.speed = float(speed)
        self.anchor_s = time.time() if anchor_s is None else float(anchor_s)

    def now_s(self) -> float:
        return self.start_s + (time.time() - self.anchor_s) * self.speed

    def describe(self) -> str:
        start = datetime.fromtimestamp(self.start_s, UTC).isoformat()
        return f"virtual clock from {start} at {self.speed:g}x (anchor {self.anchor_s:.3f})"


def parse_instant_s(text: str, field: str = "clock_start") -> float:
    """An ISO-8601 instant (UTC when it has no offset) or Unix seconds, as Unix seconds."""
    value = text.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{field}: not an ISO-8601 instant or Unix seconds: {value[:64]!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def make_clock(start: str | None, speed: float | None = None, anchor_s: float | None = None) -> Clock:
    """The wall clock when neither start nor speed is set, else a virtual clock (start defaults to now)."""
    if not start and (speed is None or speed == 1.0) and anchor_s is None:
        return Clock()
    start_s = parse_instant_s(start) if start else time.time()
    return VirtualClock(start_s, 1.0 if speed is None else speed, anchor_s)


def clock_from_env(env: Mapping[str, str] | None = None) -> Clock:
    """The clock the GREENSERVE_CLOCK_* variables describe (the wall clock when none is set)."""
    variables: Mapping[str, str] = os.environ if env is None else env

    def number(name: str, field: str) -> float | None:
        text = variables.get(name)
        if not text:
            return None
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{field}: {name} is not a number: {text[:64]!r}") from None

    speed = number(ENV_SPEED, "clock_speed")
    anchor = number(ENV_ANCHOR, "clock_anchor_s")
    try:
        return make_clock(variables.get(ENV_START) or None, speed, anchor)
    except ValueError as exc:
        raise ValueError(f"{exc} (from the GREENSERVE_CLOCK_* environment)") from None


_clock: Clock | None = None


def clock() -> Clock:
    """The clock of this process (built from the environment on first use)."""
    global _clock
    if _clock is None:
        _clock = clock_from_env()
    return _clock


def set_clock(new: Clock) -> Clock:
    """Installs ``new`` as the process clock; returns the previous one (tests restore it)."""
    global _clock
    previous = clock()
    _clock = new
    return previous


def now_s() -> float:
    """Shorthand for ``clock().now_s()``."""
    return clock().now_s()


def hour_floor_s(instant_s: float) -> float:
    """Start of the hour holding ``instant_s``."""
    return math.floor(instant_s / 3600.0) * 3600.0
