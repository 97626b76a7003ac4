"""The journaled apply protocol, with the router draining and failures injected at every step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from greenserve.common.client import ChannelConfig
from greenserve.common.persistence import Database
from greenserve.gpu_partitioner.apply import ApplyCoordinator, ApplyPreconditionError
from greenserve.gpu_partitioner.backend import (
    InsufficientResourcesError,
    MigBackendError,
)
from greenserve.gpu_partitioner.backend_sim import SimulatedBackend
from greenserve.common.mig_geometry import LayoutError, Placement
from greenserve.gpu_partitioner.models import ApplyJournalEntry
from greenserve.gpu_partitioner.peer_clients import RouterEngines

from tests.gpu_partitioner.conftest import RunningRouter, make_harness

# CLOVER configuration 9 -> 10 on an A100-40GB: the 3g at slice 4 stays, the left half is re-cut.
START = [Placement(0, 2, "2g.10gb"), Placement(2, 1, "1g.5gb"), Placement(3, 1, "1g.5gb"), Placement(4, 4, "3g.20gb")]
TARGET = [Placement(0, 1, "1g.5gb"), Placement(1, 1, "1g.5gb"), Placement(2, 2, "2g.10gb"), Placement(4, 4, "3g.20gb")]
N_STEPS = 6  # 3 destroys + 3 creates


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so no handler in the service catches it."""


class FaultyBackend:
    """Delegates to a real backend and injects one fault at the n-th mutating call.

    modes: "raise" (the call fails, nothing changed), "after" (the call took effect, then failed),
    "crash" (the process dies before the call), "crash_after" (dies right after the call took effect),
    "verify" (every mutation works, the read-back after them fails).
    """

    def __init__(self, inner: Any, fail_at: int | None, mode: str = "raise") -> None:
        self.inner, self.fail_at, self.mode = inner, fail_at, mode
        self.mutations = 0
        self.armed = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _mutate(self, fn: Callable[..., Any], *args: Any) -> Any:
        index = self.mutations
        self.mutations += 1
        if self.armed and self.mode != "verify" and index == self.fail_at:
            self.armed = False
            if self.mode == "raise":
                raise InsufficientResourcesError("injected failure")
            if self.mode == "crash":
                raise Crash()
            fn(*args)
            if self.mode == "after":
                raise MigBackendError("injected failure after the call took effect")
            raise Crash()
        return fn(*args)

    def create_instance(self, gpu_uuid: str, placement: Placement) -> Any:
        return self._mutate(self.inner.create_instance, gpu_uuid, placement)

    def destroy_instance(self, gpu_uuid: str, placement: Placement) -> Any:
        return self._mutate(self.inner.destroy_instance, gpu_uuid, placement)

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> Any:
        return self._mutate(self.inner.set_mig_mode, gpu_uuid, enabled)

    def gpu(self, gpu_uuid: str) -> Any:
        if self.mode == "verify" and self.armed and self.mutations == self.fail_at:
            self.armed = False
            raise MigBackendError("injected read-back failure")
        return self.inner.gpu(gpu_uuid)


def _setup(kind: str, db: Database, router: RunningRouter) -> tuple[Any, str, dict[str, str]]:
    h = make_harness(kind, db, [("A100-40GB", True)])
    gpu_uuid = h.backend.list_gpus()[0].uuid
    uuids = {}
    for p in START:
        uuids[str(p)] = h.backend.create_instance(gpu_uuid, p).uuid
    # one engine per slice, registered with the router by MIG UUID
    for p in START:
        router.state.engines[f"engine-{p.profile}-{p.start}"] = uuids[str(p)]
    return h, gpu_uuid, uuids


def _link(router: RunningRouter) -> RouterEngines:
    return RouterEngines(ChannelConfig(address=router.address, default_timeout_s=5.0))


@pytest.mark.parametrize("kind", ["simulated", "nvml"])
async def test_apply_keeps_untouched_instance_and_drains_affected_engines(kind: str, db: Database, router: RunningRouter) -> None:
    h, gpu_uuid, uuids = _setup(kind, db, router)
    coordinator = ApplyCoordinator(db, h.backend, _link(router))
    result = await coordinator.apply(gpu_uuid, TARGET, plan_version=7)
    assert result.state == "succeeded", result.error
    assert result.done_steps == N_STEPS
    after = h.backend.gpu(gpu_uuid)
    assert after.layout == sorted(TARGET)
    kept = next(i for i in after.instances if i.profile == "3g.20gb")
    assert kept.uuid == uuids["3g.20gb@4:4"]  # never destroyed
    assert {i["uuid"] for i in result.instances} == {i.uuid for i in after.instances}
    affected = ("engine-1g.5gb-2", "engine-1g.5gb-3", "engine-2g.10gb-0")
    assert router.state.calls == [("drain", affected), ("undrain", affected)]
    assert "engine-3g.20gb-4" not in dict(router.state.calls)["drain"]
    assert coordinator.journal_is_clean()


async def test_dry_run_returns_steps_only(db: Database, router: RunningRouter) -> None:
    h, gpu_uuid, _ = _setup("simulated", db, router)
    coordinator = ApplyCoordinator(db, h.backend, _link(router))
    # same profile counts as now: the planner places them where they already are, nothing to do
    same = await coordinator.apply(gpu_uuid, [], ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"], dry_run=True)
    assert same.steps == [] and same.kept == sorted(START)
    result = await coordinator.apply(gpu_uuid, [], ["3g.20gb", "2g.10gb", "2g.10gb"], dry_run=True)
    assert result.state == "pending" and result.apply_id == ""
    assert [str(s) for s in result.steps] == ["destroy 1g.5gb@3:1", "destroy 1g.5gb@2:1", "create 2g.10gb@2:2"]
    assert result.kept == [Placement(0, 2, "2g.10gb"), Placement(4, 4, "3g.20gb")]
    assert h.backend.gpu(gpu_uuid).layout == sorted(START)
    assert router.state.calls == []
    with db.session(readonly=True) as s:
        assert s.query(ApplyJournalEntry).count() == 0


@pytest.mark.parametrize("kind", ["simulated", "nvml"])
@pytest.mark.parametrize("mode", ["raise", "after"])
@pytest.mark.parametrize("fail_at", range(N_STEPS))
async def test_failure_at_every_step_restores_the_previous_layout(
    kind: str, mode: str, fail_at: int, db: Database, router: RunningRouter
) -> None:
    h, gpu_uuid, uuids = _setup(kind, db, router)
    faulty = FaultyBackend(h.backend, fail_at, mode)
    coordinator = ApplyCoordinator(db, faulty, _link(router))
    result = await coordinator.apply(gpu_uuid, TARGET)
    assert result.state == "rolled_back", result.error
    assert f"step {fail_at}" in result.error
    after = h.backend.gpu(gpu_uuid)
    assert after.layout == sorted(START)
    assert next(i.uuid for i in after.instances if i.profile == "3g.20gb") == uuids["3g.20gb@4:4"]
    assert all(i.uuid.startswith("MIG-") for i in after.instances)
    assert coordinator.journal_is_clean()
    with db.session(readonly=True) as s:
        states = [r.state for r in s.query(ApplyJournalEntry).order_by(ApplyJournalEntry.step_index)]
    assert states[fail_at] == "failed" and set(states) <= {"failed", "rolled_back"}
    assert router.state.calls[-1][0] == "undrain" and router.state.drained == set()


async def test_verify_failure_rolls_back(db: Database, router: RunningRouter) -> None:
    h, gpu_uuid, _ = _setup("simulated", db, router)
    coordinator = ApplyCoordinator(db, FaultyBackend(h.backend, N_STEPS, "verify"), _link(router))
    result = await coordinator.apply(gpu_uuid, TARGET)
    assert result.state == "rolled_back" and result.error.startswith("verify")
    assert h.backend.gpu(gpu_uuid).layout == sorted(START)
    assert coordinator.journal_is_clean()


async def test_busy_engine_after_drain_timeout_changes_nothing(db: Database, router: RunningRouter) -> None:
    h, gpu_uuid, uuids = _setup("simulated", db, router)
    router.state.busy.add("engine-2g.10gb-0")
    coordinator = ApplyCoordinator(db, h.backend, _link(router))
    result = await coordinator.apply(gpu_uuid, TARGET, drain_timeout_s=0.5)
    assert result.state == "rolled_back" and "engine-2g.10gb-0" in result.error
    gpu = h.backend.gpu(gpu_uuid)
    assert gpu.layout == sorted(START) and {i.uuid for i in gpu.instances} == set(uuids.values())
    assert router.state.drained == set()  # undrained again
    assert coordinator.journal_is_clean()


async def test_unreachable_router_refuses_to_destroy(db: Database) -> None:
    h = make_harness("simulated", db, [("A100-40GB", True)])
    gpu_uuid = h.backend.list_gpus()[0].uuid
    h.backend.create_instance(gpu_uuid, Placement(0, 8, "7g.40gb"))
    dead = RouterEngines(ChannelConfig(address="127.0.0.1:1", default_timeout_s=1.0))
    coordinator = ApplyCoordinator(db, h.backend, dead)
    result = await coordinator.apply(gpu_uuid, [Placement(0, 4, "4g.20gb")])
    assert result.state == "rolled_back" and "router unreachable" in result.error
    assert h.backend.gpu(gpu_uuid).layout == [Placement(0, 8, "7g.40gb")]
    # creating only (nothing to drain) needs no router
    coordinator2 = ApplyCoordinator(db, h.backend, dead)
    h.backend.destroy_instance(gpu_uuid, Placement(0, 8, "7g.40gb"))
    assert (await coordinator2.apply(gpu_uuid, [Placement(0, 4, "4g.20gb")])).state == "succeeded"


async def test_engine_still_running_on_a_slice_is_in_use_and_rolled_back(db: Database, router: RunningRouter) -> None:
    h, gpu_uuid, uuids = _setup("simulated", db, router)
    h.start_process(gpu_uuid, uuids["1g.5gb@3:1"])  # the engine process did not exit after the drain
    coordinator = ApplyCoordinator(db, h.backend, _link(router))
    result = await coordinator.apply(gpu_uuid, TARGET)
    assert result.state == "rolled_back" and "InUseError" in result.error
    assert h.backend.gpu(gpu_uuid).layout == sorted(START)


async def test_restore_failure_is_reported_failed_with_a_clean_journal(db: Database, router: RunningRouter) -> None:
    h, gpu_uuid, _ = _setup("simulated", db, router)

    class AlwaysFailCreate(FaultyBackend):
        def create_instance(self, gpu_uuid: str, placement: Placement) -> Any:
            raise InsufficientResourcesError("no more creates")

    coordinator = ApplyCoordinator(db, AlwaysFailCreate(h.backend, None), _link(router))
    result = await coordinator.apply(gpu_uuid, TARGET)
    assert result.state == "failed" and "restoring the previous layout failed" in result.error
    assert coordinator.journal_is_clean()
    assert router.state.drained == set()


async def test_bad_targets_and_preconditions(db: Database, router: RunningRouter) -> None:
    h = make_harness("simulated", db, [("A100-40GB", True), ("A100-40GB", False)])
    on, off = (g.uuid for g in h.backend.list_gpus())
    coordinator = ApplyCoordinator(db, h.backend, _link(router))
    with pytest.raises(LayoutError) as bad:
        await coordinator.apply(on, [Placement(0, 4, "4g.20gb"), Placement(2, 2, "2g.10gb")])
    assert bad.value.index == 1
    with pytest.raises(ApplyPreconditionError, match="needs a GPU reset"):
        await coordinator.apply(off, [Placement(0, 8, "7g.40gb")])
    assert coordinator.journal_is_clean()
    with db.session(readonly=True) as s:
        assert s.query(ApplyJournalEntry).count() == 0


@pytest.mark.parametrize("policy", ["rollback", "resume"])
@pytest.mark.parametrize("mode", ["crash", "crash_after"])
@pytest.mark.parametrize("crash_at", range(N_STEPS))
async def test_crash_mid_apply_is_recovered_on_start(
    policy: str, mode: str, crash_at: int, db: Database, router: RunningRouter
) -> None:
    h, gpu_uuid, uuids = _setup("simulated", db, router)
    coordinator = ApplyCoordinator(db, FaultyBackend(h.backend, crash_at, mode), _link(router))
    with pytest.raises(Crash):
        await coordinator.apply(gpu_uuid, TARGET)
    assert not coordinator.journal_is_clean()  # the crash left the run open
    # "restart": a new backend object over the same database, a new coordinator
    restarted = SimulatedBackend(db)
    recovery = ApplyCoordinator(db, restarted, _link(router), recovery_policy=policy)
    recovered = await recovery.recover()
    assert len(recovered) == 1
    record = recovery.get(recovered[0])
    expected = sorted(TARGET) if policy == "resume" else sorted(START)
    assert restarted.gpu(gpu_uuid).layout == expected
    assert record.state == ("succeeded" if policy == "resume" else "rolled_back")
    assert "interrupted" in record.error
    assert next(i.uuid for i in restarted.gpu(gpu_uuid).instances if i.profile == "3g.20gb") == uuids["3g.20gb@4:4"]
    assert recovery.journal_is_clean()
    assert router.state.drained == set()
