"""GPU power caps and locked SM clocks: the gpu-partitioner's part of the plan's ``gpu_power``.

For the plan interval in force, ``PowerEnforcer.reconcile`` sets on each GPU of this node what the interval's
``GpuPowerTarget`` of the GPU's pool asks:

* **which GPUs**: a GPU belongs to a pool when the fleet inventory assigns it (``gpus[].pool``), when one of the
  pool's engines runs on it (``pools[].engines[].gpu_uuid``), when the interval's MIG layout places an instance of
  the pool on it, or when this partitioner started an engine of the pool on it. A GPU shared by pools that ask for
  different settings gets the least restrictive (the highest limit, the highest clock, unlocked over locked): no
  pool runs slower than its plan assumed. The report says so.
* **power limit**: ``power_limit_w`` (0: the GPU's default limit) goes to ``nvmlDeviceSetPowerManagementLimit`` in
  milliwatts. It must lie within ``nvmlDeviceGetPowerManagementLimitConstraints``: a limit up to
  ``LIMIT_TOLERANCE_W`` outside is clamped to the bound (rounding), one further outside is refused with the
  constraints named, as the plan's energy figures assume a limit the board cannot hold.
* **SM clocks**: ``max_sm_clock_mhz`` (0: unlocked) becomes the nearest clock of
  ``nvmlDeviceGetSupportedGraphicsClocks`` at or below it, locked with ``nvmlDeviceSetGpuLockedClocks(lowest
  supported, that clock)`` (the GPU still clocks down when idle); 0 calls ``nvmlDeviceResetGpuLockedClocks``. A
  clock below every supported clock is refused.
* **journal**: each change of a GPU is one ``gpu_power_runs`` row written before the first NVML call (previous and
  target setting, the step under way), ended ``succeeded``, ``rolled_back`` (a step failed: the previous setting is
  written back) or ``failed`` (even that failed). A run a crash left ``running`` is rolled back at start-up, or
  with ``--recovery-policy resume`` finished (``recover``). What is in force is kept in ``gpu_power_settings``
  (NVML cannot read a clock lock back).
* **no permission** (``NVML_ERROR_NO_PERMISSION``: the process is not root): nothing is changed (a step already made
  is written back), the GPU is reported as not applied (REFUSED) with its previous setting, and the same target is
  not tried on that GPU again before a back-off of ``PERMISSION_RETRY_FIRST_S`` doubling up to
  ``PERMISSION_RETRY_MAX_S`` (no stream of refused NVML calls at each re-plan).
* **defaults back**: a GPU whose pool the interval gives no target (or which no pool claims any more) gets its
  default limit and unlocked clocks back, if this service had changed them.

Outcomes (per GPU, the worst is the node's): APPLIED, REFUSED (a target out of range, no permission),
ROLLED_BACK, FAILED.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid as uuidlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from greenserve.common.orm_conventions import utcnow
from greenserve.common.persistence import Database
from greenserve.common.plan_follow import APPLIED, FAILED, REFUSED, ROLLED_BACK, Outcome
from greenserve.gpu_partitioner.backend import GpuState, MigBackend, MigBackendError, NoPermissionError
from greenserve.common.engine_launch import EngineSupervisor
from greenserve.gpu_partitioner.models import GpuPowerRun, GpuPowerSetting
from greenserve.v1 import common_pb2, optimizer_pb2
from sqlalchemy import select

log = logging.getLogger("greenserve.gpu_partitioner.power")

LIMIT_TOLERANCE_W = 1.0
PERMISSION_RETRY_FIRST_S = 60.0
PERMISSION_RETRY_MAX_S = 3600.0
RECOVERY_POLICIES = ("rollback", "resume")
_SEVERITY = {APPLIED: 0, FAILED: 1, ROLLED_BACK: 2, REFUSED: 3}

FleetFn = Callable[[], Awaitable[common_pb2.FleetInventory | None]]


@dataclass(frozen=True)
class PowerSetting:
    """What is set on a GPU: a power limit (None: the default) and an SM clock lock (None: unlocked)."""

    power_limit_w: float | None = None
    locked_clocks: tuple[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"power_limit_w": self.power_limit_w,
                "locked_clocks": list(self.locked_clocks) if self.locked_clocks else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PowerSetting:
        locked = data.get("locked_clocks")
        limit = data.get("power_limit_w")
        return cls(None if limit is None else float(limit), (int(locked[0]), int(locked[1])) if locked else None)

    def __str__(self) -> str:
        limit = "default power limit" if self.power_limit_w is None else f"power limit {self.power_limit_w:g} W"
        clocks = "clocks unlocked" if self.locked_clocks is None else \
            f"SM clocks locked {self.locked_clocks[0]}-{self.locked_clocks[1]} MHz"
        return f"{limit}, {clocks}"


DEFAULTS = PowerSetting()


class PowerRefused(Exception):
    """A target this GPU cannot take (out of its limits, no such clock); nothing was changed."""


@dataclass
class GpuOutcome:
    state: optimizer_pb2.EnforcementState
    detail: str


@dataclass
class _Denied:
    until: float
    delay_s: float
    target: PowerSetting


class PowerCoordinator:
    """Applies a ``PowerSetting`` to one GPU through the backend, journaled, and recovers runs a crash left open."""

    def __init__(self, db: Database, backend: MigBackend, *, recovery_policy: str = "rollback",
                 clock: Callable[[], float] = time.monotonic) -> None:
        if recovery_policy not in RECOVERY_POLICIES:
            raise ValueError(f"recovery_policy must be one of {RECOVERY_POLICIES}, got {recovery_policy!r}")
        self.db = db
        self.backend = backend
        self.recovery_policy = recovery_policy
        self.clock = clock
        self._denied: dict[str, _Denied] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    # -- what is in force -----------------------------------------------------------------------------

    def in_force(self, gpu_uuid: str) -> PowerSetting:
        with self.db.session(readonly=True) as s:
            row = s.get(GpuPowerSetting, gpu_uuid)
            if row is None:
                return DEFAULTS
            locked = (row.locked_min_mhz, row.locked_max_mhz) if row.locked_max_mhz else None
            return PowerSetting(row.power_limit_w, locked)  # type: ignore[arg-type]

    def settings(self) -> dict[str, PowerSetting]:
        """Every GPU this service changed from its defaults."""
        with self.db.session(readonly=True) as s:
            rows = s.scalars(select(GpuPowerSetting)).all()
            return {r.gpu_uuid: PowerSetting(r.power_limit_w, (r.locked_min_mhz, r.locked_max_mhz)  # type: ignore[arg-type]
                                             if r.locked_max_mhz else None) for r in rows}

    def _store(self, s: Any, gpu_uuid: str, setting: PowerSetting, pool: str, plan_version: int | None) -> None:
        row = s.get(GpuPowerSetting, gpu_uuid)
        if setting == DEFAULTS:
            if row is not None:
                s.delete(row)
            return
        values = {"power_limit_w": setting.power_limit_w,
                  "locked_min_mhz": setting.locked_clocks[0] if setting.locked_clocks else None,
                  "locked_max_mhz": setting.locked_clocks[1] if setting.locked_clocks else None,
                  "pool": pool, "plan_version": plan_version, "updated_at": utcnow()}
        if row is None:
            s.add(GpuPowerSetting(gpu_uuid=gpu_uuid, **values))
        else:
            for key, value in values.items():
                setattr(row, key, value)

    # -- a target as this GPU can take it -------------------------------------------------------------------

    def resolve(self, gpu_uuid: str, power_limit_w: float, max_sm_clock_mhz: int) -> PowerSetting:
        """The setting for a target (0: default / unlocked), checked against the GPU's limits and clocks
        (blocking: NVML calls); PowerRefused says why the GPU cannot take it."""
        limit: float | None = None
        if power_limit_w > 0:
            limits = self.backend.power_limits(gpu_uuid)
            if power_limit_w < limits.min_w - LIMIT_TOLERANCE_W or power_limit_w > limits.max_w + LIMIT_TOLERANCE_W:
                raise PowerRefused(f"power limit {power_limit_w:g} W is outside the GPU's constraints "
                                   f"[{limits.min_w:g}, {limits.max_w:g}] W (nvmlDeviceGetPowerManagementLimitConstraints)")
            limit = min(max(power_limit_w, limits.min_w), limits.max_w)
            if abs(limit - limits.default_w) < 1e-3:
                limit = None  # the default limit: nothing to set
        locked: tuple[int, int] | None = None
        if max_sm_clock_mhz > 0:
            clocks = self.backend.supported_sm_clocks(gpu_uuid)
            below = [c for c in clocks if c <= max_sm_clock_mhz]
            if not below:
                raise PowerRefused(f"no supported SM clock at or below {max_sm_clock_mhz} MHz (lowest "
                                   f"{min(clocks, default=0)} MHz, nvmlDeviceGetSupportedGraphicsClocks)")
            top = max(below)
            locked = None if top >= max(clocks) else (min(clocks), top)  # the highest clock: as unlocked
        return PowerSetting(limit, locked)

    # -- apply ------------------------------------------------------------------------------------------

    async def apply(self, gpu_uuid: str, target: PowerSetting, *, pool: str = "",
                    plan_version: int | None = None) -> GpuOutcome:
        lock = self._locks.setdefault(gpu_uuid, asyncio.Lock())
        async with lock:
            previous = await asyncio.to_thread(self.in_force, gpu_uuid)
            if previous == target:
                self._denied.pop(gpu_uuid, None)
                return GpuOutcome(APPLIED, f"{target} (unchanged)")
            denied = self._denied.get(gpu_uuid)
            now = self.clock()
            if denied is not None and denied.target == target and now < denied.until:
                return GpuOutcome(REFUSED, f"not applied: no permission to change it (NVML_ERROR_NO_PERMISSION); "
                                  f"{previous} kept; next try in {denied.until - now:.0f} s")
            run_id = str(uuidlib.uuid4())
            await asyncio.to_thread(self._journal, run_id, gpu_uuid, pool, plan_version, previous, target)
            done: list[str] = []
            try:
                await asyncio.to_thread(self._write, run_id, gpu_uuid, previous, target, done)
            except Exception as exc:  # noqa: BLE001 - any failure: the steps made are written back
                restored = await asyncio.to_thread(self._restore, run_id, gpu_uuid, previous, exc, done)
                if isinstance(exc, NoPermissionError) and restored:
                    delay = min(PERMISSION_RETRY_MAX_S, denied.delay_s * 2) \
                        if denied is not None and denied.target == target else PERMISSION_RETRY_FIRST_S
                    self._denied[gpu_uuid] = _Denied(now + delay, delay, target)
                    log.warning("no permission to set GPU power", extra={"gpu": gpu_uuid, "error": str(exc)})
                    return GpuOutcome(REFUSED, f"not applied: no permission to change it ({exc}); {previous} kept; "
                                      f"next try in {delay:.0f} s")
                if restored:
                    return GpuOutcome(ROLLED_BACK, f"{target} not applied ({type(exc).__name__}: {exc}); "
                                      f"rolled back to {previous}")
                return GpuOutcome(FAILED, f"{target} not applied ({type(exc).__name__}: {exc}) and the previous "
                                  "setting could not be written back; see gpu_power_runs " + run_id)
            self._denied.pop(gpu_uuid, None)
            return GpuOutcome(APPLIED, f"{target} (was {previous})")

    def _journal(self, run_id: str, gpu_uuid: str, pool: str, plan_version: int | None, previous: PowerSetting,
                 target: PowerSetting) -> None:
        with self.db.session() as s:
            s.add(GpuPowerRun(run_id=run_id, gpu_uuid=gpu_uuid, plan_version=plan_version or None, pool=pool,
                              state="running", phase="limit", previous=previous.to_json(), target=target.to_json(),
                              error="", started_at=utcnow(), ended_at=None))

    def _phase(self, run_id: str, **values: Any) -> None:
        with self.db.session() as s:
            run = s.get(GpuPowerRun, run_id)
            assert run is not None
            for key, value in values.items():
                setattr(run, key, value)

    def _write(self, run_id: str, gpu_uuid: str, previous: PowerSetting, target: PowerSetting,
               done: list[str]) -> None:
        """The steps of a run (blocking): the limit, then the clocks; each only when it changes, named in ``done``
        once made (an NVML setter that returns an error changed nothing)."""
        if target.power_limit_w != previous.power_limit_w:
            self._set_limit(gpu_uuid, target.power_limit_w)
            done.append("limit")
        self._phase(run_id, phase="clocks")
        if target.locked_clocks != previous.locked_clocks:
            self._set_clocks(gpu_uuid, target.locked_clocks)
            done.append("clocks")
        with self.db.session() as s:
            run = s.get(GpuPowerRun, run_id)
            assert run is not None
            self._store(s, gpu_uuid, target, run.pool, run.plan_version)
            run.state, run.phase, run.ended_at = "succeeded", "done", utcnow()

    def _set_limit(self, gpu_uuid: str, watts: float | None) -> None:
        if watts is None:
            watts = self.backend.power_limits(gpu_uuid).default_w
        self.backend.set_power_limit(gpu_uuid, watts)

    def _set_clocks(self, gpu_uuid: str, locked: tuple[int, int] | None) -> None:
        if locked is None:
            self.backend.reset_locked_clocks(gpu_uuid)
        else:
            self.backend.set_locked_clocks(gpu_uuid, locked[0], locked[1])

    def _converge(self, gpu_uuid: str, goal: PowerSetting) -> None:
        """Writes both parts of ``goal`` whatever the device holds (a step may have half-run)."""
        self._set_limit(gpu_uuid, goal.power_limit_w)
        self._set_clocks(gpu_uuid, goal.locked_clocks)

    def _restore(self, run_id: str, gpu_uuid: str, previous: PowerSetting, exc: Exception, done: list[str]) -> bool:
        """Writes back the steps ``done`` before a step failed; True when ``previous`` is in force again."""
        error = f"{type(exc).__name__}: {exc}"
        self._phase(run_id, phase="rollback", error=error)
        try:
            if "limit" in done:
                self._set_limit(gpu_uuid, previous.power_limit_w)
            if "clocks" in done:
                self._set_clocks(gpu_uuid, previous.locked_clocks)
        except Exception as again:  # noqa: BLE001 - said in the run and the report
            log.error("restoring the GPU's power setting failed", extra={"gpu": gpu_uuid, "error": str(again)})
            self._phase(run_id, state="failed", phase="done", ended_at=utcnow(),
                        error=f"{error}; writing back the previous setting failed: {type(again).__name__}: {again}")
            return False
        self._phase(run_id, state="rolled_back", phase="done", ended_at=utcnow())
        return True

    # -- recovery -----------------------------------------------------------------------------------------

    def recover(self) -> list[str]:
        """Ends every run a crash left ``running`` (blocking): rolls it back to its previous setting, or with the
        ``resume`` policy finishes its target; returns the run ids."""
        with self.db.session(readonly=True) as s:
            runs = [(r.run_id, r.gpu_uuid, r.pool, r.plan_version, r.previous, r.target)
                    for r in s.scalars(select(GpuPowerRun).where(GpuPowerRun.state == "running"))]
        for run_id, gpu_uuid, pool, plan_version, previous_json, target_json in runs:
            resume = self.recovery_policy == "resume"
            goal = PowerSetting.from_json(target_json if resume else previous_json)
            note = "interrupted (service restart); " + ("finished" if resume else "rolled back")
            try:
                self._converge(gpu_uuid, goal)
            except Exception as exc:  # noqa: BLE001 - said in the run
                self._phase(run_id, state="failed", phase="done", ended_at=utcnow(), error=f"{note} failed: {exc}")
                continue
            with self.db.session() as s:
                self._store(s, gpu_uuid, goal, pool, plan_version)
                run = s.get(GpuPowerRun, run_id)
                assert run is not None
                run.state, run.phase, run.ended_at, run.error = (
                    "succeeded" if resume else "rolled_back", "done", utcnow(), note)
        return [r[0] for r in runs]

    def journal_is_clean(self) -> bool:
        with self.db.session(readonly=True) as s:
            return s.scalars(select(GpuPowerRun).where(GpuPowerRun.state == "running")).first() is None


class PowerEnforcer:
    """Reconciles this node's GPU power limits and clock locks with the plan in force (module docstring)."""

    def __init__(self, *, backend: MigBackend, coordinator: PowerCoordinator, fleet: FleetFn,
                 supervisor: EngineSupervisor | None = None) -> None:
        self.backend = backend
        self.coordinator = coordinator
        self.fleet = fleet
        self.supervisor = supervisor

    async def reconcile(self, plan: common_pb2.Plan, interval: common_pb2.PlanInterval | None) -> Outcome:
        targets = list(interval.gpu_power) if interval is not None else []
        in_force = await asyncio.to_thread(self.coordinator.settings)
        if not targets and not in_force:
            return Outcome(APPLIED, "")  # nothing asked, nothing to undo
        problem = _invalid(targets)
        if problem:
            return Outcome(REFUSED, f"GPU power: nothing changed: {problem}")
        gpus = await asyncio.to_thread(self.backend.list_gpus)
        fleet = await self.fleet() if targets else None
        if targets and fleet is None:
            notes = ["fleet inventory unknown (optimizer unreachable): GPUs matched to pools by MIG layouts and "
                     "engines only; settings in force on other GPUs kept"]
        else:
            notes = []
        pools_of = self._pools_of(gpus, interval, fleet)
        by_pool = {t.pool: t for t in targets}
        state, details = APPLIED, []
        for gpu in sorted(gpus, key=lambda g: g.index):
            pools = pools_of.get(gpu.uuid, set())
            wanted = [by_pool[p] for p in sorted(pools) if p in by_pool]
            if not wanted:
                if gpu.uuid not in in_force or (targets and fleet is None):
                    continue
                goal, pool, what = DEFAULTS, "", "no target: defaults back"
            else:
                limit = 0.0 if any(t.power_limit_w <= 0 for t in wanted) else max(t.power_limit_w for t in wanted)
                clock = 0 if any(t.max_sm_clock_mhz == 0 for t in wanted) else max(t.max_sm_clock_mhz for t in wanted)
                pool = ",".join(t.pool for t in wanted)
                what = f"pool {pool}"
                if len(wanted) > 1 and len({(t.power_limit_w, t.max_sm_clock_mhz) for t in wanted}) > 1:
                    what += " (pools disagree: the least restrictive applied)"
                try:
                    goal = await asyncio.to_thread(self.coordinator.resolve, gpu.uuid, limit, clock)
                except PowerRefused as exc:
                    details.append(f"GPU {gpu.uuid} ({what}): refused: {exc}; setting in force kept")
                    state = _worst(state, REFUSED)
                    continue
                except MigBackendError as exc:
                    details.append(f"GPU {gpu.uuid} ({what}): limits unreadable: {exc}; setting in force kept")
                    state = _worst(state, REFUSED if isinstance(exc, NoPermissionError) else FAILED)
                    continue
            result = await self.coordinator.apply(gpu.uuid, goal, pool=pool, plan_version=plan.version)
            details.append(f"GPU {gpu.uuid} ({what}): {result.detail}")
            state = _worst(state, result.state)
        if not details:
            details.append("no GPU of this node belongs to a pool with a target")
        return Outcome(state, "GPU power: " + "; ".join(details + notes))

    def _pools_of(self, gpus: list[GpuState], interval: common_pb2.PlanInterval | None,
                  fleet: common_pb2.FleetInventory | None) -> dict[str, set[str]]:
        mine = {g.uuid for g in gpus}
        out: dict[str, set[str]] = {}

        def claim(gpu_uuid: str, pool: str) -> None:
            if gpu_uuid in mine and pool:
                out.setdefault(gpu_uuid, set()).add(pool)

        if fleet is not None:
            for gpu in fleet.gpus:
                claim(gpu.uuid, gpu.pool)
            for pool in fleet.pools:
                for engine in pool.engines:
                    claim(engine.gpu_uuid, engine.pool or pool.name)
        if interval is not None:
            for layout in interval.mig_layouts:
                for placement in layout.placements:
                    claim(layout.gpu_uuid, placement.pool)
        if self.supervisor is not None:
            for engine in self.supervisor.engines.values():
                if engine.returncode is None:
                    claim(engine.spec.gpu_uuid, engine.spec.pool)
        return out


def _invalid(targets: list[common_pb2.GpuPowerTarget]) -> str:
    seen: set[str] = set()
    for i, t in enumerate(targets):
        where = f"gpu_power[{i}]"
        if not t.pool:
            return f"{where}.pool: required"
        if t.pool in seen:
            return f"{where}: pool {t.pool!r} has two targets in the interval"
        seen.add(t.pool)
        if not math.isfinite(t.power_limit_w) or t.power_limit_w < 0:
            return f"{where}.power_limit_w: must be a finite number >= 0 (0: the default), got {t.power_limit_w!r}"
    return ""


def _worst(a: optimizer_pb2.EnforcementState, b: optimizer_pb2.EnforcementState) -> optimizer_pb2.EnforcementState:
    return a if _SEVERITY[a] >= _SEVERITY[b] else b


def combine(*reconciles: Callable[[common_pb2.Plan, common_pb2.PlanInterval | None], Awaitable[Outcome]]
            ) -> Callable[[common_pb2.Plan, common_pb2.PlanInterval | None], Awaitable[Outcome]]:
    """One reconcile running each in turn: the worst state, the details joined (empty ones left out). One that
    raises is FAILED with its error, and the others still run (a MIG apply that broke does not keep the power
    limits from being set)."""

    async def reconcile(plan: common_pb2.Plan, interval: common_pb2.PlanInterval | None) -> Outcome:
        state, details = APPLIED, []
        for fn in reconciles:
            try:
                outcome = await fn(plan, interval)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # reported, as PlanFollower reports a reconcile that raised
                log.exception("reconcile part failed")
                outcome = Outcome(FAILED, f"{type(exc).__name__}: {exc}")
            state = _worst(state, outcome.state) if outcome.state in _SEVERITY else outcome.state
            if outcome.detail:
                details.append(outcome.detail)
        return Outcome(state, "; ".join(details))

    return reconcile
