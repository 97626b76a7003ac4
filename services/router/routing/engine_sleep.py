"""Engines that step down: the router's part of the plan's ``engine_runs`` (vLLM sleep mode).

For the plan interval in force (``ActivePlan.run_targets``: engine id -> ENGINE_RUN_STATE_*, MIG placements resolved
as routing weights are; an engine the interval does not name is awake), ``EngineSleeper.apply`` drives every
registered engine towards its target, one task per engine, so that a slow engine never delays another:

* **to sleep**: the engine is held out of routing at once (``EngineState.sleep_hold``; such plans give it weight 0
  anyway) and listed DRAINING; its task waits until no request is in flight to it, by this router's count and by
  the engine's own ``/metrics`` (requests other replicas or workers sent), for at most ``drain_timeout_s``; then
  ``POST /sleep?level=1&mode=wait`` (vLLM: weights offloaded to host memory, KV cache discarded; ``mode=wait``: a
  request another replica sent at the last moment finishes instead of being aborted) and ``GET /is_sleeping`` must
  say true. The engine is then listed SLEEPING.
* **to wake**: ``POST /wake_up``, then ``GET /is_sleeping`` until false and ``GET /health`` 200, all within
  ``wake_timeout_s``; only then does the engine take requests again. Until then it is listed WAKING.
* **failures**: an engine still busy when its drain time is over is not put to sleep (it stays out of routing while
  its requests finish); one that does not wake in time stays WAKING, out of routing, while the pool's awake engines
  serve; either is tried again after a back-off doubling from ``retry_first_s`` up to ``retry_max_s`` (one call at a
  time per engine, never a storm). An engine without sleep mode (``POST /sleep`` answers 404: vLLM started without
  ``--enable-sleep-mode``) is left awake, named in the report, and asked again only when a later interval wants it
  asleep.
* a router that starts does not know which engines sleep: at its first plan it asks every engine
  ``GET /is_sleeping`` once, so that an engine put to sleep before a restart is woken when the plan wants it awake
  (and never routed to while asleep).
* a pool whose every registered engine the interval would put to sleep keeps them all awake (said in the report):
  an asleep engine holds the requests sent to it until it wakes, so a pool must keep one awake.

``describe`` and ``outcome_state`` give the enforcement report's part; ``on_change`` is called whenever an engine
reaches its target or fails, so the watcher reports again (enforcer.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from greenserve.common.plan_follow import APPLIED, APPLYING, FAILED
from greenserve.common.tasks import cancel_and_wait
from greenserve.router.routing.engines import (
    RUN_ASLEEP,
    RUN_AWAKE,
    RUN_GOING_TO_SLEEP,
    RUN_WAKING,
    EngineRegistry,
    EngineState,
)
from greenserve.router.upstream.engine_replies import ReplyTooLarge, read_capped
from greenserve.v1 import common_pb2, optimizer_pb2

log = logging.getLogger("greenserve.router.routing.engine_sleep")

MAX_SLEEP_REPLY_BYTES = 4096  # {"is_sleeping": false} is 22 bytes
NAMES_SHOWN = 10


@dataclass(frozen=True)
class SleepSettings:
    """Bounds of the sleep and wake-up calls (RouterSettings: --sleep-drain-timeout-s, --wake-timeout-s, ...)."""

    drain_timeout_s: float = 120.0  # an engine going to sleep may take this long to finish its requests
    wake_timeout_s: float = 120.0  # POST /wake_up to awake and healthy
    call_timeout_s: float = 120.0  # POST /sleep (weights offloaded over the host link)
    poll_interval_s: float = 0.5  # drain and wake-up checks
    retry_first_s: float = 5.0  # back-off after a failed sleep or wake-up, doubling
    retry_max_s: float = 300.0
    level: int = 1  # vLLM sleep level: 1 keeps the weights in host memory (2 would need them reloaded)


class EngineSleeper:
    """Puts engines to sleep and wakes them as the interval in force says (see the module docstring)."""

    def __init__(self, registry: EngineRegistry, scrape: Callable[[EngineState], Awaitable[bool]],
                 settings: SleepSettings | None = None, on_change: Callable[[], None] | None = None) -> None:
        self.registry = registry
        self.scrape = scrape
        self.settings = settings or SleepSettings()
        self.on_change = on_change
        self.targets: dict[str, str] = {}  # engine id -> RUN_AWAKE or RUN_ASLEEP
        self.problems: dict[str, str] = {}  # engine id -> why it is not where the plan wants it
        self.unsupported: dict[str, str] = {}  # engine id -> why it cannot sleep (kept awake)
        self.kept_awake_pools: list[str] = []
        self.calls: list[tuple[str, str]] = []  # (engine id, "sleep" | "wake_up"), for the record and tests
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._probed = False
        self._session: aiohttp.ClientSession | None = None
        self._changed = asyncio.Event()

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks.values())
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- targets -------------------------------------------------------------------------------------

    def apply(self, runs: dict[str, int]) -> None:
        """Puts the interval's run states in force: every registered engine moves towards its target."""
        asleep = {eid for eid, state in runs.items() if state == common_pb2.ENGINE_RUN_STATE_SLEEPING}
        engines = list(self.registry.engines.values())
        pools: dict[str, list[EngineState]] = {}
        for e in engines:
            pools.setdefault(e.pool, []).append(e)
        self.kept_awake_pools = sorted(p for p, members in pools.items() if all(e.id in asleep for e in members))
        kept = set(self.kept_awake_pools)
        self.targets = {e.id: RUN_ASLEEP if e.id in asleep and e.pool not in kept else RUN_AWAKE for e in engines}
        for gone in [eid for eid in {*self.problems, *self.unsupported, *self._tasks} if eid not in self.targets]:
            self.problems.pop(gone, None)  # deregistered engines leave the report
            self.unsupported.pop(gone, None)
            if (task := self._tasks.get(gone)) is not None and task.done():
                del self._tasks[gone]
        probe = not self._probed
        self._probed = True
        for e in engines:
            target = self.targets[e.id]
            if target == RUN_ASLEEP:
                self.unsupported.pop(e.id, None)  # asked again: the engine may have been restarted with sleep mode
                e.sleep_unsupported = False
                if e.run_phase == RUN_AWAKE:  # out of routing from now on, before its task even starts
                    e.run_phase, e.sleep_hold = RUN_GOING_TO_SLEEP, True
            if probe or e.run_phase != target:
                self._ensure_task(e, probe)
        self._changed.set()
        self._changed = asyncio.Event()

    def _ensure_task(self, engine: EngineState, probe: bool) -> None:
        task = self._tasks.get(engine.id)
        if task is not None and not task.done():
            return  # it reads the new target at its next step
        self._tasks[engine.id] = asyncio.get_running_loop().create_task(
            self._drive(engine, probe), name=f"engine-sleep-{engine.id}")

    def pending(self) -> list[str]:
        """Engines not (yet) where the plan wants them, unsupported ones aside."""
        return sorted(eid for eid, target in self.targets.items()
                      if (e := self.registry.get(eid)) is not None and e.run_phase != target
                      and eid not in self.unsupported)

    async def settled(self, timeout_s: float) -> bool:
        """Waits until no engine task runs (each engine at its target, failed with its back-off over, or
        unsupported); False when ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        while any(not t.done() for t in self._tasks.values()):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.wait([t for t in self._tasks.values() if not t.done()], timeout=left)
        return True

    # -- report ----------------------------------------------------------------------------------------

    def outcome_state(self) -> optimizer_pb2.EnforcementState | None:
        """None when the plan names no run state and no engine sleeps; else APPLYING while engines are on their
        way, FAILED when one failed (still retried), APPLIED when every engine is at its target."""
        if not self.active():
            return None
        if self.problems:
            return FAILED
        return APPLYING if self.pending() else APPLIED

    def active(self) -> bool:
        return any(t == RUN_ASLEEP for t in self.targets.values()) or bool(self.problems) or bool(
            self.kept_awake_pools) or any(e.run_phase != RUN_AWAKE for e in self.registry.engines.values())

    def describe(self) -> str:
        """The engines' run states for the enforcement report ("" when nothing sleeps and the plan puts nobody
        to sleep)."""
        if not self.active():
            return ""
        by_phase: dict[str, list[str]] = {}
        for e in sorted(self.registry.engines.values(), key=lambda x: x.id):
            if e.id in self.targets or e.run_phase != RUN_AWAKE:
                by_phase.setdefault(e.run_phase, []).append(e.id)
        parts = []
        for phase, label in ((RUN_ASLEEP, "asleep"), (RUN_GOING_TO_SLEEP, "going to sleep"),
                             (RUN_WAKING, "waking"), (RUN_AWAKE, "awake")):
            ids = by_phase.get(phase, [])
            if ids:
                parts.append(f"{len(ids)} {label}" + (f" ({_names(ids)})" if phase != RUN_AWAKE else ""))
        text = "engines " + ", ".join(parts) if parts else "engines: none"
        for pool in self.kept_awake_pools:
            text += f"; pool {pool}: the plan puts every engine to sleep, all kept awake"
        for eid, why in sorted(self.unsupported.items())[:NAMES_SHOWN]:
            text += f"; {eid} kept awake: {why}"
        for eid, why in sorted(self.problems.items())[:NAMES_SHOWN]:
            text += f"; {eid}: {why}"
        return text

    def _changed_now(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:  # a report is best effort
                log.exception("engine sleep report failed")

    # -- one engine ----------------------------------------------------------------------------------------

    async def _drive(self, engine: EngineState, probe: bool) -> None:
        s = self.settings
        try:
            if probe:
                asleep = await self._is_sleeping(engine, s.poll_interval_s * 4)
                if asleep is True and engine.run_phase == RUN_AWAKE:
                    engine.run_phase, engine.sleep_hold = RUN_ASLEEP, True
                    log.info("engine found asleep", extra={"engine_id": engine.id})
            delay = s.retry_first_s
            while self.registry.get(engine.id) is engine:
                target = self.targets.get(engine.id, RUN_AWAKE)
                if target == RUN_ASLEEP and engine.id in self.unsupported:
                    return
                if engine.run_phase == target:
                    return
                ok = await (self._sleep(engine) if target == RUN_ASLEEP else self._wake(engine))
                self._changed_now()
                if ok:
                    delay = s.retry_first_s
                    continue
                await self._back_off(engine.id, target, delay)
                delay = min(s.retry_max_s, delay * 2)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one engine's trouble never stops the others
            log.exception("engine sleep task failed", extra={"engine_id": engine.id})
            self.problems[engine.id] = f"{type(exc).__name__}: {exc}"
            self._changed_now()

    async def _back_off(self, engine_id: str, target: str, delay_s: float) -> None:
        """Waits ``delay_s``, or less when a new interval changes the engine's target."""
        changed = self._changed
        deadline = time.monotonic() + delay_s
        while self.targets.get(engine_id) == target and (left := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                return
            changed = self._changed

    async def _sleep(self, engine: EngineState) -> bool:
        """Drain, ``POST /sleep``, check ``/is_sleeping``; True when the engine is asleep, or cannot sleep at all."""
        s = self.settings
        if engine.run_phase == RUN_AWAKE:
            engine.run_phase = RUN_GOING_TO_SLEEP
        engine.sleep_hold = True
        if engine.run_phase == RUN_GOING_TO_SLEEP:
            status, _ = await self._sleep_state(engine, s.call_timeout_s)
            if status == 404:  # no sleep mode: found before draining it for nothing
                return self._unsupported(engine, "GET /is_sleeping")
            deadline = time.monotonic() + s.drain_timeout_s
            while True:
                if self.targets.get(engine.id) != RUN_ASLEEP:  # a new interval wants it awake: never slept
                    engine.run_phase, engine.sleep_hold = RUN_AWAKE, False
                    return True
                if engine.in_flight == 0:
                    scraped = await self.scrape(engine)
                    if not scraped or engine.running + engine.waiting <= 0:  # unreadable: this router's count
                        break
                if time.monotonic() >= deadline:
                    self.problems[engine.id] = (f"still busy after {s.drain_timeout_s:g} s of draining "
                                                f"({engine.in_flight} in flight here, {engine.running + engine.waiting:g} "
                                                "on the engine): not put to sleep yet, no new request is sent to it")
                    return False
                await asyncio.sleep(s.poll_interval_s)
        self.calls.append((engine.id, "sleep"))
        status, why = await self._post(engine, "/sleep", {"level": str(s.level), "mode": "wait"}, s.call_timeout_s)
        if status == 404:
            return self._unsupported(engine, "POST /sleep")
        if status != 200:
            self.problems[engine.id] = f"POST /sleep failed ({why}); not routed to, tried again later"
            return False
        asleep = await self._is_sleeping(engine, s.call_timeout_s)
        if asleep is not True:
            self.problems[engine.id] = f"POST /sleep answered 200 but GET /is_sleeping says {asleep}; tried again later"
            return False
        engine.run_phase = RUN_ASLEEP
        self.problems.pop(engine.id, None)
        log.info("engine asleep", extra={"engine_id": engine.id})
        return True

    def _unsupported(self, engine: EngineState, call: str) -> bool:
        engine.run_phase, engine.sleep_hold, engine.sleep_unsupported = RUN_AWAKE, False, True
        self.unsupported[engine.id] = f"no sleep mode ({call} answered 404: start vLLM with --enable-sleep-mode)"
        self.problems.pop(engine.id, None)
        log.warning("engine has no sleep mode; kept awake", extra={"engine_id": engine.id})
        return True

    async def _wake(self, engine: EngineState) -> bool:
        """``POST /wake_up``, then ``/is_sleeping`` false and ``/health`` 200 within the wake-up bound; True when
        the engine is awake and takes requests again."""
        s = self.settings
        if engine.run_phase == RUN_GOING_TO_SLEEP:  # never slept: routable again at once
            engine.run_phase, engine.sleep_hold = RUN_AWAKE, False
            self.problems.pop(engine.id, None)
            return True
        engine.run_phase, engine.sleep_hold = RUN_WAKING, True
        started = time.monotonic()
        deadline = started + s.wake_timeout_s
        self.calls.append((engine.id, "wake_up"))
        status, why = await self._post(engine, "/wake_up", {}, s.wake_timeout_s)
        last = why if status not in (200, 404) else ""
        while status in (200, 404):  # 404: no sleep mode, so not asleep; /is_sleeping and /health decide
            left = deadline - time.monotonic()
            if left <= 0:
                break
            asleep = await self._is_sleeping(engine, min(left, s.call_timeout_s))
            if asleep is False or (asleep is None and status == 404):
                if await self._healthy(engine, min(max(0.0, deadline - time.monotonic()), s.call_timeout_s)):
                    engine.run_phase, engine.sleep_hold = RUN_AWAKE, False
                    self.problems.pop(engine.id, None)
                    log.info("engine awake", extra={"engine_id": engine.id, "wake_s": time.monotonic() - started})
                    return True
                last = "/health not passing yet"
            else:
                last = "GET /is_sleeping still says true" if asleep else "GET /is_sleeping unanswered"
            await asyncio.sleep(min(s.poll_interval_s, max(0.0, deadline - time.monotonic())))
        self.problems[engine.id] = (f"did not wake within {s.wake_timeout_s:g} s ({last or 'no answer'}); not "
                                    "routed to, the pool's awake engines serve; tried again with back-off")
        log.warning("engine did not wake", extra={"engine_id": engine.id, "why": last})
        return False

    # -- HTTP ----------------------------------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32))
        return self._session

    async def _post(self, engine: EngineState, path: str, params: dict[str, str], timeout_s: float
                    ) -> tuple[int, str]:
        """(HTTP status, what went wrong); status 0 when the engine could not be reached."""
        try:
            async with self._http().post(engine.url + path, params=params,
                                         timeout=aiohttp.ClientTimeout(total=max(0.1, timeout_s))) as resp:
                body = await read_capped(resp, MAX_SLEEP_REPLY_BYTES)
                return resp.status, "" if resp.status == 200 else f"HTTP {resp.status}: {body[:200]!r}"
        except (aiohttp.ClientError, OSError, TimeoutError, ReplyTooLarge) as exc:
            return 0, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

    async def _is_sleeping(self, engine: EngineState, timeout_s: float) -> bool | None:
        """The engine's ``GET /is_sleeping``; None when it cannot tell (no sleep mode, unreachable, unreadable)."""
        return (await self._sleep_state(engine, timeout_s))[1]

    async def _sleep_state(self, engine: EngineState, timeout_s: float) -> tuple[int, bool | None]:
        """(HTTP status of ``GET /is_sleeping``, its ``is_sleeping``); (0, None) when unreachable."""
        try:
            async with self._http().get(engine.url + "/is_sleeping",
                                        timeout=aiohttp.ClientTimeout(total=max(0.1, timeout_s))) as resp:
                if resp.status != 200:
                    return resp.status, None
                value = json.loads(await read_capped(resp, MAX_SLEEP_REPLY_BYTES)).get("is_sleeping")
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, AttributeError):
            return 0, None
        return 200, value if isinstance(value, bool) else None

    async def _healthy(self, engine: EngineState, timeout_s: float) -> bool:
        try:
            async with self._http().get(engine.url + "/health",
                                        timeout=aiohttp.ClientTimeout(total=max(0.1, timeout_s))) as resp:
                await read_capped(resp, MAX_SLEEP_REPLY_BYTES)
                return resp.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError, ReplyTooLarge):
            return False


def _names(ids: list[str]) -> str:
    shown = ", ".join(ids[:NAMES_SHOWN])
    return shown + (f" and {len(ids) - NAMES_SHOWN} more" if len(ids) > NAMES_SHOWN else "")
