"""Fixtures and helpers of the fault tests (issue 36): emulated engines and routers (the router tests' fixtures),
and waiting for a condition."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

from tests.router.conftest import emulators, router  # noqa: F401  (fixtures)


async def until(predicate: Callable[[], Awaitable[object] | object], timeout_s: float, what: str,
                every_s: float = 0.1) -> None:
    """Waits until ``predicate()`` (awaited when it answers an awaitable) is true; fails naming ``what`` after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(every_s)
