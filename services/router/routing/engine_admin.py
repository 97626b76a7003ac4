"""The router's engine writes while serving (RegisterEngine, DeregisterEngine, Drain, Undrain, plan engines) and
their rows: ``EngineAdmin``, mixed into ``RouterCore`` (core.py), which holds the registry, the database, the
monitor and ``_engine_writes``.

Each write holds ``_engine_writes``, writes the database first (in a thread) and changes the registry on the
event loop only once the row is committed: what a caller was told succeeded is exactly what a restart loads,
and the registry is never changed from a thread while the loop iterates it. Replicas see each other's writes
through the shared state's version counter (``bump``, shared_state.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from greenserve.common.orm_conventions import utcnow
from greenserve.common.persistence import Database
from greenserve.router import models
from greenserve.router.routing.engines import EngineRegistry, EngineState
from greenserve.router.routing.monitor import EngineMonitor
from greenserve.router.routing.shared_state import bump
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm.exc import StaleDataError


class EngineGone(LookupError):
    """An engine this replica knows was deregistered through another replica (its row is gone)."""

    def __init__(self, engine_id: str) -> None:
        super().__init__(f"engine {engine_id!r} is not registered (deregistered through another replica)")
        self.engine_id = engine_id


class EngineAdmin:
    """Engine writes and drains of ``RouterCore`` (see the module docstring)."""

    registry: EngineRegistry
    db: Database | None
    monitor: EngineMonitor
    config: Any  # core.CoreConfig
    busy_power_w: float
    idle_power_w: float
    _engine_writes: asyncio.Lock
    # Engines deregistered (DeregisterEngine here, or their row gone through another replica or worker) that the
    # plan may still name and the optimizer's fleet still list: the gpu-partitioner deregisters the engines of the
    # MIG instances it destroys before its next GPU report says they are gone, so a fleet read meanwhile still
    # lists them with their URLs. They are not registered again from the plan ("plan engines", core._fetch_fleet)
    # until they are registered again explicitly; an id leaves this set then, or once the fleet no longer lists it.
    deregistered: set[str]

    def engine_defaults(self, engine: EngineState) -> EngineState:
        if engine.busy_power_w <= 0:
            engine.busy_power_w = self.busy_power_w
            if engine.idle_power_w <= 0:
                engine.idle_power_w = self.idle_power_w
        return engine

    def add_engine(self, engine: EngineState, *, persist: bool = True) -> tuple[EngineState, bool]:
        """Adds or updates an engine at start-up (stored and flag engines; nothing else runs yet).
        Once serving, engine writes go through ``register_engine`` and friends."""
        if persist and self.db is not None:
            known = self.registry.get(engine.id)
            self._persist_engine(self.engine_defaults(engine), known.draining if known else engine.draining)
        return self.registry.upsert(self.engine_defaults(engine))

    async def register_engine(self, engine: EngineState, *, check_url: bool = True) -> tuple[EngineState, bool]:
        """Stores and adds (or updates) an engine; ValueError when another engine has its URL."""
        async with self._engine_writes:
            engine = self.engine_defaults(engine)
            if check_url:
                other = self.registry.by_url(engine.url)
                if other is not None and other.id != engine.id:
                    raise ValueError(f"already registered as engine {other.id!r}")
            known = self.registry.get(engine.id)
            if self.db is not None:
                await asyncio.to_thread(self._persist_engine, engine, known.draining if known else engine.draining,
                                        refuse_url_clash=check_url)
            if engine.source != "plan":  # registered again explicitly: the plan may bring it back later
                self.deregistered.discard(engine.id)
            return self.registry.upsert(engine)

    async def deregister_engine(self, engine_id: str) -> bool:
        """Deletes an engine's row, then forgets it; False when it is not registered."""
        async with self._engine_writes:
            if self.registry.get(engine_id) is None:
                return False
            if self.db is not None:
                await asyncio.to_thread(self.delete_engine_row, engine_id)
            self.registry.remove(engine_id)
            self.deregistered.add(engine_id)
            return True

    async def set_draining(self, engine_ids: list[str], draining: bool) -> list[EngineState]:
        """Stores, then sets, the drain flag of the engines still registered (all in one transaction);
        EngineGone, and nothing written, when one was deregistered through another replica meanwhile."""
        async with self._engine_writes:
            engines = [e for e in (self.registry.get(i) for i in engine_ids) if e is not None]
            if self.db is not None and engines:
                await asyncio.to_thread(self._persist_draining, engines, draining)
            for e in engines:
                e.draining = draining
            return engines

    def _persist_draining(self, engines: list[EngineState], draining: bool) -> None:
        """Writes the drain flags. An engine stored by RegisterEngine or a plan whose row is gone was deregistered
        through another replica that this one has not read yet: writing its row would bring it back, so the
        batch is refused (EngineGone). Flag engines (--engines) have a row only once drained. A write that loses
        a race with another replica's (PostgreSQL: the row deleted under the update) is retried once."""
        assert self.db is not None
        for attempt in range(2):
            try:
                with self.db.session() as s:
                    for engine in engines:
                        if engine.source != "flag" and s.get(models.Engine, engine.id) is None:
                            raise EngineGone(engine.id)
                        self._write_engine_row(s, engine, draining)
                    bump(s)
                return
            except (IntegrityError, StaleDataError):
                if attempt:
                    raise

    def _persist_engine(self, engine: EngineState, draining: bool, *, refuse_url_clash: bool = False) -> None:
        """Writes an engine's row. ``refuse_url_clash``: ValueError when the database holds another engine with
        its URL (another replica registered it and this one has not read it yet) instead of replacing it.
        A write that loses a race with another replica's first write of the same id or URL (PostgreSQL: both
        found no row, the second insert breaks a unique constraint) is retried once: it then sees the row the
        other replica committed (an update, or the URL clash)."""
        assert self.db is not None
        for attempt in range(2):
            try:
                with self.db.session() as s:
                    self._write_engine_row(s, engine, draining, refuse_url_clash=refuse_url_clash)
                    bump(s)
                return
            except (IntegrityError, StaleDataError):
                if attempt:
                    raise

    @staticmethod
    def _write_engine_row(s: Any, engine: EngineState, draining: bool, *, refuse_url_clash: bool = False) -> None:
        row = s.get(models.Engine, engine.id)
        clash = s.query(models.Engine).filter(models.Engine.url == engine.url,
                                              models.Engine.id != engine.id).one_or_none()
        if clash is not None:
            if refuse_url_clash:
                raise ValueError(f"already registered as engine {clash.id!r}")
            s.delete(clash)
            s.flush()
        values = {"url": engine.url, "pool": engine.pool, "model": engine.model, "source": engine.source,
                  "draining": draining, "kind": int(engine.kind), "gpu_uuid": engine.gpu_uuid,
                  "mig_uuid": engine.mig_uuid, "idle_power_w": float(engine.idle_power_w),
                  "busy_power_w": float(engine.busy_power_w), "prefill_url": engine.prefill_url,
                  "prefill_kv_transfer_params": engine.prefill_kv_transfer_params}
        if row is None:
            s.add(models.Engine(id=engine.id, registered_at=utcnow(), **values))
        else:
            for key, value in values.items():
                setattr(row, key, value)

    def delete_engine_row(self, engine_id: str) -> None:
        if self.db is None:
            return
        with self.db.session() as s:
            row = s.get(models.Engine, engine_id)
            if row is not None:
                s.delete(row)
            verdict = s.get(models.EngineHealth, engine_id)
            if verdict is not None:
                s.delete(verdict)
            bump(s)

    # -- drain --------------------------------------------------------------------------------------------

    async def drain(self, engine_ids: list[str], wait: bool, timeout_s: float) -> tuple[list[str], list[str]]:
        engines = await self.set_draining(engine_ids, True)
        if wait:
            pending = [e for e in engines if e.in_flight > 0]
            for e in pending:
                e.idle_event = asyncio.Event()
                if e.in_flight == 0:
                    e.idle_event.set()
            if pending:
                waits = [asyncio.ensure_future(e.idle_event.wait()) for e in pending]  # type: ignore[union-attr]
                _, not_done = await asyncio.wait(waits, timeout=timeout_s)
                for w in not_done:
                    w.cancel()
        idle = [e.id for e in engines if e.in_flight == 0]
        busy = [e.id for e in engines if e.in_flight > 0]
        return idle, busy

    async def confirm_idle(self, engine_ids: list[str], wait: bool, deadline: float, settle_until: float
                           ) -> tuple[list[str], list[str]]:
        """(idle, busy) of ``engine_ids`` (idle in this router's own view) by the engines' own ``/metrics``:
        requests that other replicas (or other clients) still have on an engine keep it busy. With ``wait``,
        scrapes until every engine reports none running or waiting, and never decides before ``settle_until``
        (time.monotonic(): when every replica has learnt of the drain from the shared state and sends it no more).
        An engine whose metrics cannot be read counts by this router's view."""
        pending = [e for i in engine_ids if (e := self.registry.get(i)) is not None]
        while True:
            scraped = await asyncio.gather(*(self.monitor.scrape(e) for e in pending))
            busy = [e.id for e, ok in zip(pending, scraped, strict=True) if ok and e.running + e.waiting > 0]
            now = time.monotonic()
            if not wait or now >= deadline or (not busy and now >= settle_until):
                return [i for i in engine_ids if i not in busy], busy
            await asyncio.sleep(min(self.config.state_poll_interval_s, max(0.0, deadline - now)))

    async def undrain(self, engine_ids: list[str]) -> None:
        await self.set_draining(engine_ids, False)
