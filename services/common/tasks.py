"""Background asyncio tasks of the services: stop them the same way everywhere."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("greenserve.tasks")


async def cancel_and_wait(*tasks: asyncio.Task[object] | None) -> None:
    """Cancel each task and wait until it has finished; a task that had already failed is logged, not raised.

    For shutdown paths: after this returns no task body runs any more, so state it wrote can be saved."""
    live = [t for t in tasks if t is not None]
    for task in live:
        task.cancel()
    for task, result in zip(live, await asyncio.gather(*live, return_exceptions=True)):
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            log.warning("background task %s had failed: %r", task.get_name(), result)
