"""GPU power caps and locked SM clocks (issue 33): the backends' NVML calls (the simulated backend and the NVML
backend over the fake pynvml), and the enforcer of the plan's ``gpu_power`` on both: the pool's GPUs get the limit
and the nearest supported clock at or below the target, the change is journaled and undone on failure or after a
crash, a target outside the GPU's constraints and a GPU without permission are refused with the previous setting
kept (and no stream of NVML calls), and the defaults come back when the plan drops the target."""

from __future__ import annotations

import pytest
from greenserve.common.plan_follow import APPLIED, FAILED, REFUSED, ROLLED_BACK, Outcome
from greenserve.common.persistence import Database
from greenserve.gpu_partitioner.backend import InvalidPlacementError, NoPermissionError, NotSupportedError
from greenserve.gpu_partitioner.backend_sim import SimulatedBackend
from greenserve.gpu_partitioner.models import GpuPowerRun
from greenserve.gpu_partitioner.power import (
    DEFAULTS,
    PERMISSION_RETRY_FIRST_S,
    PowerCoordinator,
    PowerEnforcer,
    PowerSetting,
    combine,
)
from greenserve.v1 import common_pb2
from sqlalchemy import select

from tests.gpu_partitioner.conftest import Harness, make_harness

A100_LADDER = list(range(1410, 209, -15))  # nvidia-smi -q -d SUPPORTED_CLOCKS of an A100 (1215 MHz memory)


@pytest.fixture(params=["simulated", "nvml"])
def rig(request: pytest.FixtureRequest, db: Database) -> Harness:
    return make_harness(request.param, db, [("A100-40GB", False), ("A100-40GB", False)])


def device_setting(h: Harness, gpu_uuid: str) -> tuple[float | None, tuple[int, int] | None]:
    """(power limit W or None for the default, locked clocks or None) as the device itself holds them."""
    if h.kind == "simulated":
        return h.device.power_settings(gpu_uuid)
    dev = next(d for d in h.device.devices if d.uuid == gpu_uuid)
    return (None if dev.power_limit_mw is None else dev.power_limit_mw / 1000.0), dev.locked_clocks


def deny(h: Harness, gpu_uuid: str) -> None:
    if h.kind == "simulated":
        h.device.set_permission(gpu_uuid, False)
    else:
        next(d for d in h.device.devices if d.uuid == gpu_uuid).root = False


def nvml_sets(h: Harness) -> list[str]:
    return [c for c in h.device.calls if c.startswith(("SetPower", "SetGpuLocked", "ResetGpuLocked"))] \
        if h.kind == "nvml" else []


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def enforcer(h: Harness, db: Database, gpus_of: dict[str, str], clock: Clock | None = None,
             policy: str = "rollback") -> PowerEnforcer:
    fleet = common_pb2.FleetInventory(gpus=[common_pb2.Gpu(uuid=u, pool=p) for u, p in gpus_of.items()],
                                      pools=[common_pb2.Pool(name=p) for p in sorted(set(gpus_of.values()))])

    async def inventory() -> common_pb2.FleetInventory:
        return fleet

    coordinator = PowerCoordinator(db, h.backend, recovery_policy=policy, clock=clock or Clock())
    return PowerEnforcer(backend=h.backend, coordinator=coordinator, fleet=inventory)


def interval(*targets: common_pb2.GpuPowerTarget, **fields: object) -> common_pb2.PlanInterval:
    return common_pb2.PlanInterval(gpu_power=list(targets), **fields)  # type: ignore[arg-type]


def target(pool: str, watts: float = 0.0, mhz: int = 0) -> common_pb2.GpuPowerTarget:
    return common_pb2.GpuPowerTarget(pool=pool, power_limit_w=watts, max_sm_clock_mhz=mhz,
                                     sm_clock_fraction=mhz / 1410 if mhz else 1.0)


PLAN = common_pb2.Plan(version=7)


def test_backends_set_limits_and_clocks_as_nvml_does(rig: Harness) -> None:
    gpu = rig.backend.list_gpus()[0].uuid
    limits = rig.backend.power_limits(gpu)
    assert (limits.min_w, limits.max_w, limits.default_w, limits.current_w) == (100.0, 400.0, 400.0, 400.0)
    assert rig.backend.supported_sm_clocks(gpu) == A100_LADDER
    rig.backend.set_power_limit(gpu, 250.0)
    assert rig.backend.power_limits(gpu).current_w == 250.0
    with pytest.raises(InvalidPlacementError):  # NVML_ERROR_INVALID_ARGUMENT outside the constraints
        rig.backend.set_power_limit(gpu, 50.0)
    rig.backend.set_locked_clocks(gpu, 210, 990)
    assert device_setting(rig, gpu) == (250.0, (210, 990))
    rig.backend.reset_locked_clocks(gpu)
    deny(rig, gpu)
    with pytest.raises(NoPermissionError):
        rig.backend.set_power_limit(gpu, 300.0)
    with pytest.raises(NoPermissionError):
        rig.backend.set_locked_clocks(gpu, 210, 990)
    assert device_setting(rig, gpu) == (250.0, None)


async def test_the_pools_gpus_get_the_limit_and_the_nearest_clock_below_then_defaults_when_dropped(
        rig: Harness, db: Database) -> None:
    chat, batch = (g.uuid for g in rig.backend.list_gpus())
    enf = enforcer(rig, db, {chat: "chat", batch: "batch"})
    out = await enf.reconcile(PLAN, interval(target("chat", 250.0, 1000)))
    assert out.state == APPLIED, out.detail
    assert device_setting(rig, chat) == (250.0, (210, 990))  # 990 MHz: the highest supported clock <= 1000
    assert device_setting(rig, batch) == (None, None)  # another pool's GPU, no target: untouched
    assert f"GPU {chat} (pool chat): power limit 250 W, SM clocks locked 210-990 MHz" in out.detail
    calls = len(nvml_sets(rig))
    again = await enf.reconcile(PLAN, interval(target("chat", 250.0, 1000)))
    assert again.state == APPLIED and "(unchanged)" in again.detail and len(nvml_sets(rig)) == calls

    back = await enf.reconcile(PLAN, interval())  # the next hour has no GPU power target
    assert back.state == APPLIED and "no target: defaults back" in back.detail
    assert device_setting(rig, chat) == (None, None) and enf.coordinator.settings() == {}
    quiet = await enf.reconcile(PLAN, interval())
    assert quiet == Outcome(APPLIED, "")  # nothing asked, nothing to undo
    with db.session(readonly=True) as s:
        assert [r.state for r in s.scalars(select(GpuPowerRun).order_by(GpuPowerRun.started_at))] == \
            ["succeeded", "succeeded"]


async def test_targets_outside_the_gpus_constraints_are_refused_and_change_nothing(rig: Harness, db: Database) -> None:
    gpu = rig.backend.list_gpus()[0].uuid
    enf = enforcer(rig, db, {gpu: "chat"})
    await enf.reconcile(PLAN, interval(target("chat", 300.0)))
    low = await enf.reconcile(PLAN, interval(target("chat", 50.0)))
    assert low.state == REFUSED and "outside the GPU's constraints [100, 400] W" in low.detail
    slow = await enf.reconcile(PLAN, interval(target("chat", 300.0, 100)))
    assert slow.state == REFUSED and "no supported SM clock at or below 100 MHz" in slow.detail
    assert device_setting(rig, gpu) == (300.0, None)
    # within a watt of the bound: clamped (400 W is the default limit, so nothing is set)
    edge = await enf.reconcile(PLAN, interval(target("chat", 400.4)))
    assert edge.state == APPLIED and device_setting(rig, gpu) == (None, None)
    bad = await enf.reconcile(PLAN, interval(target("chat", 200.0), target("chat", 300.0)))
    assert bad.state == REFUSED and "pool 'chat' has two targets" in bad.detail


async def test_no_permission_keeps_the_previous_setting_and_backs_off(rig: Harness, db: Database) -> None:
    gpu = rig.backend.list_gpus()[0].uuid
    clock = Clock()
    enf = enforcer(rig, db, {gpu: "chat"}, clock)
    deny(rig, gpu)
    first = await enf.reconcile(PLAN, interval(target("chat", 250.0, 1000)))
    assert first.state == REFUSED and "not applied: no permission" in first.detail
    assert "default power limit, clocks unlocked kept" in first.detail
    assert device_setting(rig, gpu) == (None, None) and enf.coordinator.in_force(gpu) == DEFAULTS
    tried = len(nvml_sets(rig))
    clock.now += 10  # a re-plan soon after: no NVML call, the back-off holds
    second = await enf.reconcile(PLAN, interval(target("chat", 250.0, 1000)))
    assert second.state == REFUSED and "next try in 50 s" in second.detail and len(nvml_sets(rig)) == tried
    clock.now += PERMISSION_RETRY_FIRST_S
    third = await enf.reconcile(PLAN, interval(target("chat", 250.0, 1000)))
    assert third.state == REFUSED and f"next try in {2 * PERMISSION_RETRY_FIRST_S:.0f} s" in third.detail
    with db.session(readonly=True) as s:
        assert {r.state for r in s.scalars(select(GpuPowerRun))} == {"rolled_back"}


class Crash(BaseException):
    """The process dies (SIGKILL) between two NVML calls."""


class Failing:
    """The backend with ``set_locked_clocks`` failing (an exception, or the process dying)."""

    def __init__(self, backend: object, exc: BaseException) -> None:
        self._backend, self._exc = backend, exc

    def __getattr__(self, name: str) -> object:
        return getattr(self._backend, name)

    def set_locked_clocks(self, gpu_uuid: str, min_mhz: int, max_mhz: int) -> None:
        raise self._exc


async def test_a_failed_step_rolls_back_and_a_crash_mid_apply_is_recovered(db: Database) -> None:
    sim = SimulatedBackend(db, [("A100-40GB", False)])
    gpu = sim.list_gpus()[0].uuid
    coordinator = PowerCoordinator(db, Failing(sim, NotSupportedError("locked clocks not supported")))  # type: ignore[arg-type]
    out = await coordinator.apply(gpu, PowerSetting(250.0, (210, 990)), pool="chat", plan_version=3)
    assert out.state == ROLLED_BACK and "rolled back to default power limit, clocks unlocked" in out.detail
    assert sim.power_settings(gpu) == (None, None)  # the limit set by the first step was written back

    with pytest.raises(Crash):
        await PowerCoordinator(db, Failing(sim, Crash())).apply(gpu, PowerSetting(250.0, (210, 990)))  # type: ignore[arg-type]
    assert sim.power_settings(gpu) == (250.0, None)  # half applied: the limit, not the clocks
    restarted = PowerCoordinator(db, sim)
    assert not restarted.journal_is_clean()
    assert len(restarted.recover()) == 1
    assert sim.power_settings(gpu) == (None, None) and restarted.journal_is_clean()
    assert restarted.in_force(gpu) == DEFAULTS

    with pytest.raises(Crash):
        await PowerCoordinator(db, Failing(sim, Crash())).apply(gpu, PowerSetting(250.0, (210, 990)))  # type: ignore[arg-type]
    resumed = PowerCoordinator(db, sim, recovery_policy="resume")
    resumed.recover()
    assert sim.power_settings(gpu) == (250.0, (210, 990)) and resumed.in_force(gpu) == PowerSetting(250.0, (210, 990))
    with db.session(readonly=True) as s:
        states = sorted(r.state for r in s.scalars(select(GpuPowerRun)))
    assert states == ["rolled_back", "rolled_back", "succeeded"]


async def test_gpus_found_through_mig_layouts_and_pools_that_disagree_get_the_least_restrictive(db: Database) -> None:
    sim = SimulatedBackend(db, [("A100-40GB", True)])
    gpu = sim.list_gpus()[0].uuid

    async def no_fleet() -> None:
        return None

    enf = PowerEnforcer(backend=sim, coordinator=PowerCoordinator(db, sim), fleet=no_fleet)
    layout = common_pb2.MigLayout(gpu_uuid=gpu, placements=[
        common_pb2.MigPlacement(profile="3g.20gb", start=0, size=4, pool="chat"),
        common_pb2.MigPlacement(profile="3g.20gb", start=4, size=4, pool="batch")])
    out = await enf.reconcile(PLAN, interval(target("chat", 250.0, 1000), target("batch", 300.0, 1200),
                                             mig_layouts=[layout]))
    assert out.state == APPLIED, out.detail
    assert sim.power_settings(gpu) == (300.0, (210, 1200))
    assert "pools disagree: the least restrictive applied" in out.detail
    assert "fleet inventory unknown" in out.detail


def test_the_simulated_gpu_draws_less_with_locked_clocks_and_never_above_its_limit(db: Database) -> None:
    sim = SimulatedBackend(db, [("A100-40GB", False)])
    gpu = sim.list_gpus()[0].uuid
    sim.start_process(gpu, None)
    full = sim.read_power(gpu).power_w
    assert full == 400.0
    sim.set_locked_clocks(gpu, 210, 990)  # 0.70 of 1410 MHz: clocks.py's memory-bound decode draw
    f = 990 / 1410
    expected = 50.0 + 350.0 * (0.4 + 0.6 * f ** 2.5)
    assert sim.read_power(gpu).power_w == pytest.approx(expected)
    sim.set_power_limit(gpu, 200.0)
    assert sim.read_power(gpu).power_w == 200.0
    sim.reset_locked_clocks(gpu)
    sim.set_power_limit(gpu, 400.0)
    assert sim.read_power(gpu).power_w == full


async def test_combine_reports_the_worst_state_and_every_part() -> None:
    async def mig(plan: common_pb2.Plan, iv: object) -> Outcome:
        return Outcome(APPLIED, "GPU g: no change")

    async def power(plan: common_pb2.Plan, iv: object) -> Outcome:
        return Outcome(REFUSED, "GPU power: GPU g (pool chat): refused")

    async def silent(plan: common_pb2.Plan, iv: object) -> Outcome:
        return Outcome(APPLIED, "")

    assert await combine(mig, power)(PLAN, None) == Outcome(REFUSED, "GPU g: no change; GPU power: GPU g (pool chat): refused")
    assert await combine(mig, silent)(PLAN, None) == Outcome(APPLIED, "GPU g: no change")

    async def broken(plan: common_pb2.Plan, iv: object) -> Outcome:
        raise RuntimeError("the MIG apply broke")

    assert await combine(broken, power)(PLAN, None) == Outcome(REFUSED, "RuntimeError: the MIG apply broke; GPU power: GPU g (pool chat): refused")
    assert (await combine(broken, silent)(PLAN, None)).state == FAILED
