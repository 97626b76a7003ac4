"""cancel_and_wait: every task is cancelled and finished when it returns; failures are logged, not raised."""

from __future__ import annotations

import asyncio
import logging

import pytest

from greenserve.common.tasks import cancel_and_wait


async def test_cancels_and_waits_for_every_task_and_skips_none() -> None:
    finished: list[str] = []

    async def body(name: str) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0)  # cleanup that itself awaits: must complete before cancel_and_wait returns
            finished.append(name)

    tasks = [asyncio.create_task(body(n)) for n in ("a", "b")]
    await asyncio.sleep(0)
    await cancel_and_wait(tasks[0], None, tasks[1])
    assert sorted(finished) == ["a", "b"]
    assert all(t.cancelled() for t in tasks)


async def test_a_task_that_already_failed_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def boom() -> None:
        raise RuntimeError("scrape loop died")

    task = asyncio.create_task(boom(), name="scraper")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="greenserve.tasks"):
        await cancel_and_wait(task)
    assert "scraper" in caplog.text and "scrape loop died" in caplog.text
