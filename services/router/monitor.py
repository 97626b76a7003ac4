"""Background watch over engines: ``/metrics`` scrapes and ``/health`` probes, each on its own interval.

Every engine is scraped and probed concurrently (one slow engine never delays the others, unlike
production-stack's sequential scraper), on a small session of its own so probes never queue behind
request traffic. A failed probe counts as a failure towards ejection; a probe that succeeds on an
ejected engine whose backoff has passed closes its circuit (half-open recovery without risking a user
request on it). Scrape failures only age the metrics (the engine turns STALE).
"""

from __future__ import annotations

import asyncio

from greenserve.common.tasks import cancel_and_wait
import logging
import time

import aiohttp
from greenserve.router.engines import EngineRegistry, EngineState
from greenserve.router.scrape import parse_metrics

log = logging.getLogger("greenserve.router.monitor")


class EngineMonitor:
    """Runs the scrape and health loops over the registry's engines."""

    def __init__(self, registry: EngineRegistry, *, scrape_interval_s: float, health_interval_s: float,
                 probe_timeout_s: float) -> None:
        self.registry = registry
        self.scrape_interval_s = scrape_interval_s
        self.health_interval_s = health_interval_s
        self.probe_timeout_s = probe_timeout_s
        self.scrapes = 0
        self.scrape_failures = 0
        self.probe_failures = 0
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=64, keepalive_timeout=30)
        self._session = aiohttp.ClientSession(connector=connector)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._loop(self.scrape_all, self.scrape_interval_s), name="scrape"),
                       loop.create_task(self._loop(self.probe_all, self.health_interval_s), name="health")]

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _loop(self, body, interval_s: float) -> None:  # type: ignore[no-untyped-def]
        while True:
            started = time.monotonic()
            try:
                await body()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("engine monitor error")
            await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))

    async def scrape_all(self) -> None:
        engines = list(self.registry.engines.values())
        if engines:
            await asyncio.gather(*(self.scrape(e) for e in engines))

    async def probe_all(self) -> None:
        engines = list(self.registry.engines.values())
        if engines:
            await asyncio.gather(*(self.probe(e) for e in engines))

    async def scrape(self, engine: EngineState) -> bool:
        assert self._session is not None
        try:
            async with self._session.get(engine.url + "/metrics",
                                         timeout=aiohttp.ClientTimeout(total=self.probe_timeout_s)) as resp:
                if resp.status != 200:
                    raise OSError(f"HTTP {resp.status}")
                text = await resp.text()
            metrics = parse_metrics(text)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            self.scrape_failures += 1
            return False
        engine.apply_metrics(metrics, time.monotonic())
        self.scrapes += 1
        return True

    async def probe(self, engine: EngineState) -> bool:
        assert self._session is not None
        started = time.monotonic()
        try:
            async with self._session.get(engine.url + "/health",
                                         timeout=aiohttp.ClientTimeout(total=self.probe_timeout_s)) as resp:
                ok = resp.status == 200
                await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError):
            ok = False
        now = time.monotonic()
        if ok:
            # Only closes an open circuit; on a healthy engine it leaves the count of failed requests alone
            # (an engine that errors on requests but answers /health must still be ejected).
            if engine.ejected_until and now >= engine.ejected_until:
                self.registry.record_success(engine, started)
        else:
            self.probe_failures += 1
            if not engine.ejected_until or now >= engine.ejected_until:
                self.registry.record_failure(engine, now, "health probe failed")
        return ok
