"""Background watch over engines: ``/metrics`` scrapes and ``/health`` probes, each on its own interval.

Every engine is scraped and probed concurrently (one slow engine never delays the others, unlike
production-stack's sequential scraper), on a small session of its own so probes never queue behind
request traffic. A failed probe counts as a failure towards ejection; a probe that succeeds on an
ejected engine whose backoff has passed closes its circuit (half-open recovery without risking a user
request on it). Scrape failures only age the metrics (the engine turns STALE). A reply over its cap
(engine_replies.py: ``MAX_METRICS_BYTES``, ``MAX_HEALTH_BYTES``) is a failed scrape or probe, logged once per
engine until a good one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import aiohttp
from greenserve.common.tasks import cancel_and_wait
from greenserve.router.routing.engines import EngineRegistry, EngineState
from greenserve.router.routing.scrape import parse_metrics
from greenserve.router.upstream.engine_replies import MAX_HEALTH_BYTES, MAX_METRICS_BYTES, ReplyTooLarge, read_capped

log = logging.getLogger("greenserve.router.routing.monitor")


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
        # (engine id, path) whose reply was over its cap, logged; dropped at the next good reply
        self._too_large: set[tuple[str, str]] = set()

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

    async def _loop(self, body: Callable[[], Awaitable[None]], interval_s: float) -> None:
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
        if self._too_large:  # forget engines deregistered since (the set stays bounded by the registry)
            self._too_large = {key for key in self._too_large if key[0] in self.registry.engines}
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
                text = (await read_capped(resp, MAX_METRICS_BYTES)).decode()  # the exposition format is UTF-8
            metrics = parse_metrics(text)
        except ReplyTooLarge as exc:
            self._note_too_large(engine, "/metrics", exc)
            self.scrape_failures += 1
            return False
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            self.scrape_failures += 1
            return False
        self._too_large.discard((engine.id, "/metrics"))
        engine.apply_metrics(metrics, time.monotonic())
        self.scrapes += 1
        return True

    def _note_too_large(self, engine: EngineState, path: str, exc: ReplyTooLarge) -> None:
        """Logs an engine's reply over its cap once, not at every scrape or probe while it lasts."""
        key = (engine.id, path)
        if key not in self._too_large:
            self._too_large.add(key)
            log.warning("engine reply over its cap: counted as a failed probe", extra={
                "engine_id": engine.id, "path": path, "error": str(exc)})

    async def probe(self, engine: EngineState) -> bool:
        assert self._session is not None
        started = time.monotonic()
        try:
            async with self._session.get(engine.url + "/health",
                                         timeout=aiohttp.ClientTimeout(total=self.probe_timeout_s)) as resp:
                ok = resp.status == 200
                await read_capped(resp, MAX_HEALTH_BYTES)  # not used; read so that the connection is reused
            self._too_large.discard((engine.id, "/health"))
        except ReplyTooLarge as exc:
            self._note_too_large(engine, "/health", exc)
            ok = False
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
