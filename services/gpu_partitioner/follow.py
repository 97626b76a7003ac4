"""The gpu-partitioner in the control loop: its flags, its GPU reports to the optimizer, its plan follower.

`start_following` runs, beside the gRPC service:

* a `GpuReporter`: ``ReportGpus(node, gpus)`` at start and whenever the node's inventory (GPUs, MIG instances,
  engines on them) changes, retried with capped backoff in the background while the optimizer is down;
* a `PlanFollower` (component ``gpu-partitioner``, instance = the node name) whose reconcile is
  `MigEnforcer.reconcile` followed by `PowerEnforcer.reconcile` (the interval's ``gpu_power``: power limits and
  locked SM clocks, power.py), with the plan kept in ``<data-dir>/gpu_partitioner_plan.pb`` so a restart during an
  optimizer outage keeps the plan in force. Engines die with the service, so a stored plan is reconciled once
  at start (which starts them again);
* a watchdog that reconciles again when an engine it launched has exited, or when the last reconcile failed.

Engines are children of this process: `stop` (run when the service stops on SIGTERM) stops all of them.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

import grpc
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from greenserve.common.app import ServiceContext
from greenserve.common.client import ChannelConfig, create_channel
from greenserve.common.config import ServiceSettings
from greenserve.common.plan_follow import APPLIED, FAILED, PlanFollower, plan_file_store
from greenserve.common.tasks import cancel_and_wait
from greenserve.gpu_partitioner.apply import DEFAULT_DRAIN_TIMEOUT_S, ApplyCoordinator
from greenserve.gpu_partitioner.backend import MigBackend
from greenserve.gpu_partitioner.enforcer import COMPONENT, MigEnforcer
from greenserve.common.engine_launch import (
    EngineSupervisor,
    VllmLauncher,
    make_launcher,
    parse_lmcache_servers,
    parse_port_range,
)
from greenserve.gpu_partitioner.peer_clients import OptimizerFleet, RouterEngines
from greenserve.gpu_partitioner.power import PowerCoordinator, PowerEnforcer, combine
from greenserve.v1 import common_pb2, gpu_partitioner_pb2, optimizer_pb2, optimizer_pb2_grpc

if TYPE_CHECKING:  # the service and settings modules import this one
    from greenserve.gpu_partitioner.service import GpuPartitionerServicer
    from greenserve.gpu_partitioner.settings import GpuPartitionerSettings

log = logging.getLogger("greenserve.gpu_partitioner.follow")

PLAN_FILE = "gpu_partitioner_plan.pb"


class PlanFollowSettings(BaseSettings):
    """Flags of the gpu-partitioner's part of the control loop (mixed into GpuPartitionerSettings)."""

    # the services' configuration: as the last base of GpuPartitionerSettings, BaseSettings' own (no env prefix,
    # no --flag/--no-flag) won over it, and GREENSERVE_SIM_GPUS was ignored while SIM_GPUS was read
    model_config = ServiceSettings.model_config

    follow_plans: bool = Field(
        True, description="watch the optimizer's plans and apply this node's MIG layouts with engines on them; "
        "also report the node's GPUs (--no-follow-plans: neither)")
    engine_launcher: Literal["auto", "vllm", "emulator", "none"] = Field(
        "auto", description="how engines on MIG instances are started: vllm (`vllm serve`), emulator "
        "(greenserve-engine-sim) or none; auto: vllm with the NVML backend, emulator with the simulated one")
    engine_host: str = Field(
        "127.0.0.1", description="address engines bind to and are registered with the router under")
    engine_port_range: str = Field("8100-8199", description="ports engines listen on, LOW-HIGH")
    engine_time_scale: float = Field(
        1.0, gt=0, le=1000, description="emulator: modelled engine speed-up over real time")
    engine_health_timeout_s: float = Field(
        600.0, gt=0, le=7200, description="seconds an engine gets to answer /health after start (vLLM loads a model)")
    engine_gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="vLLM --gpu-memory-utilization of engines (of the MIG instance's memory)")
    engine_max_model_len: int = Field(0, ge=0, description="vLLM --max-model-len of engines (0: the model's own)")
    engine_vllm_executable: str = Field(
        "vllm", description="the vLLM command engines are started with (`<it> serve MODEL ...`): vllm on PATH, or a "
        "path such as .venv-vllm/bin/vllm, the CPU build that scripts/install-vllm.sh installs")
    engine_lmcache_servers: str = Field(
        "", description="LMCache servers (multiprocess mode) per pool, POOL=tcp://HOST:PORT,...: engines of those "
        "pools get LMCache's KV connector; the server runs on the engines' own node (it moves KV blocks through "
        "CUDA IPC and shared memory)")
    engine_stop_grace_s: float = Field(
        10.0, ge=0, le=600, description="seconds an engine gets after SIGTERM before SIGKILL")
    mig_drain_timeout_s: float = Field(
        DEFAULT_DRAIN_TIMEOUT_S, ge=0, le=3600,
        description="seconds the router gets to drain engines before a layout change")
    gpu_report_interval_s: float = Field(
        30.0, gt=0, le=3600, description="seconds between looks at the node's inventory for a change to report")
    engine_check_interval_s: float = Field(
        15.0, gt=0, le=3600, description="seconds between checks for exited engines (reconciled again when one is)")
    engine_retry_backoff_max_s: float = Field(
        300.0, gt=0, le=86400, description="longest wait between two retries of engines that keep failing (the "
        "wait doubles from --engine-check-interval-s at each retry that fails)")

    @field_validator("engine_port_range")
    @classmethod
    def _port_range(cls, value: str) -> str:
        parse_port_range(value)
        return value

    @field_validator("engine_lmcache_servers")
    @classmethod
    def _lmcache(cls, value: str) -> str:
        parse_lmcache_servers(value)
        return value


InventoryFn = Callable[[], Awaitable[list[common_pb2.Gpu]]]


class GpuReporter:
    """Reports the node's GPUs (``ReportGpus``) at start and on every change; retries while the optimizer is down."""

    def __init__(self, channel: grpc.aio.Channel, node: str, inventory: InventoryFn, *, interval_s: float = 30.0,
                 backoff_max_s: float = 10.0) -> None:
        self.stub = optimizer_pb2_grpc.OptimizerServiceStub(channel)
        self.node = node
        self.inventory = inventory
        self.interval_s = interval_s
        self.backoff_max_s = backoff_max_s
        self.reported: list[common_pb2.Gpu] | None = None  # last report the optimizer accepted
        self.sent = 0
        self.refused = 0  # reports the optimizer answered INVALID_ARGUMENT (not retried until the inventory changes)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="gpu-report")

    def poke(self) -> None:
        """Look at the inventory now (after a layout change)."""
        self._wake.set()

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            self._wake.clear()
            wait_s = self.interval_s
            gpus: list[common_pb2.Gpu] | None = None
            try:
                gpus = await self.inventory()
                for gpu in gpus:
                    gpu.node = self.node
                    gpu.reported_by = f"{COMPONENT}/{self.node}"
                if gpus != self.reported:
                    await self.stub.ReportGpus(optimizer_pb2.ReportGpusRequest(node=self.node, gpus=gpus), timeout=10.0)
                    self.reported = gpus
                    self.sent += 1
                    log.info("reported %d GPU(s) of node %s to the optimizer", len(gpus), self.node)
                backoff = 0.2
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:  # never deliverable as it is: wait for a change
                    log.warning("the optimizer refused the GPU report of node %s: %s", self.node, exc.details())
                    self.reported = gpus if gpus is not None else self.reported
                    self.refused += 1
                else:
                    log.info("ReportGpus failed (%s); retrying in %.1f s", exc.code().name, backoff)
                    wait_s = backoff
                    backoff = min(self.backoff_max_s, backoff * 2)
            except Exception:  # keep reporting; the backend may come back
                log.exception("reading the node's GPUs failed")
                wait_s = backoff
                backoff = min(self.backoff_max_s, backoff * 2)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=wait_s)
            except TimeoutError:
                pass


class Following:
    """What `start_following` started; `stop` ends it all (engines included)."""

    def __init__(self, follower: PlanFollower | None, reporter: GpuReporter | None, enforcer: MigEnforcer | None,
                 supervisor: EngineSupervisor | None, closers: list[Callable[[], Awaitable[None]]]) -> None:
        self.follower = follower
        self.reporter = reporter
        self.enforcer = enforcer
        self.supervisor = supervisor
        self._closers = closers
        self._watchdog: asyncio.Task[None] | None = None
        self.startup: asyncio.Task[object] | None = None
        self.retries = 0  # the watchdog's reconciles

    def start_watchdog(self, interval_s: float, backoff_max_s: float = 300.0) -> None:
        """Every ``interval_s``, reconcile again when an engine exited or the last reconcile FAILED (an engine that
        did not start, or a GPU with a layout that vanished). Retries back off, so that an engine failing its health
        check after every launch is not launched again at every check: after ``n`` consecutive retries that did not
        fix it, the next waits ``interval_s x 2^n``, at most ``backoff_max_s``; a new plan or interval, a check that
        finds nothing to do, or a vanished GPU listed again, starts again at once."""

        async def watch() -> None:
            loop = asyncio.get_running_loop()
            failures, next_try, key = 0, 0.0, None
            while True:
                await asyncio.sleep(interval_s)
                follower = self.follower
                if follower is None or follower.plan is None:
                    continue
                exited = self.supervisor is not None and any(
                    e.returncode is not None and not e.reported_exit for e in self.supervisor.engines.values())
                failed = follower.last_outcome is not None and follower.last_outcome.state == FAILED
                if not (exited or failed):
                    failures, next_try = 0, 0.0
                    continue
                if follower.reconciled != key:  # another plan or interval since the last retry: no back-off
                    failures, next_try, key = 0, 0.0, follower.reconciled
                if loop.time() < next_try and self.enforcer is not None and await self.enforcer.vanished_back():
                    next_try = 0.0  # a GPU that had vanished is back: its layout now, not when the back-off ends
                if loop.time() < next_try:
                    continue
                try:
                    self.retries += 1
                    outcome = await follower.reconcile_now(force=True)
                except asyncio.CancelledError:
                    raise
                except Exception:  # reported by the follower already
                    log.exception("watchdog reconcile failed")
                    outcome = None
                key = follower.reconciled
                if outcome is None or outcome.state != APPLIED:
                    failures += 1
                    wait_s = min(backoff_max_s, interval_s * 2**failures)
                    next_try = loop.time() + wait_s
                    log.warning("engines still failing after %d retr%s; next retry in %.0f s", failures,
                                "y" if failures == 1 else "ies", wait_s)
                else:
                    failures, next_try = 0, 0.0

        self._watchdog = asyncio.get_running_loop().create_task(watch(), name="engine-watchdog")

    async def stop(self) -> None:
        await cancel_and_wait(self._watchdog, self.startup)
        if self.follower is not None:
            await self.follower.stop()
        if self.reporter is not None:
            await self.reporter.stop()
        if self.supervisor is not None:
            await self.supervisor.stop_all()
        for close in self._closers:
            await close()


async def start_following(ctx: ServiceContext, settings: GpuPartitionerSettings, backend: MigBackend,
                          coordinator: ApplyCoordinator, inventory: InventoryFn,
                          power: PowerCoordinator | None = None) -> Following:
    """Starts GPU reports, the plan follower and the engine watchdog per ``settings`` (the service's,
    ``ctx.settings``; nothing when off)."""
    node = settings.node_name
    if not settings.follow_plans:
        return Following(None, None, None, None, [])
    launcher_name = settings.engine_launcher
    if launcher_name == "auto":
        launcher_name = "vllm" if backend.kind == "nvml" else "emulator"
    launcher = make_launcher(launcher_name, time_scale=settings.engine_time_scale,
                             gpu_memory_utilization=settings.engine_gpu_memory_utilization,
                             max_model_len=settings.engine_max_model_len,
                             vllm_executable=settings.engine_vllm_executable)
    if isinstance(launcher, VllmLauncher) and shutil.which(launcher.executable) is None:
        log.warning("engine launcher vllm: %r is not on PATH; engines the plan asks for will fail to start "
                    "(install vLLM in this image, or --engine-launcher none)", launcher.executable)
    supervisor = None
    if launcher is not None:
        supervisor = EngineSupervisor(launcher, host=settings.engine_host,
                                      port_range=parse_port_range(settings.engine_port_range),
                                      log_dir=settings.data_dir / "engines",
                                      stop_grace_s=settings.engine_stop_grace_s)
    token = settings.token()
    tls_ca = settings.tls_ca
    optimizer_channel = create_channel(ChannelConfig(address=settings.optimizer_addr,
                                                     token=token, tls_ca=tls_ca))
    router = RouterEngines(ChannelConfig(address=settings.router_addr,
                                         token=token, tls_ca=tls_ca))
    reporter = GpuReporter(optimizer_channel, node, inventory, interval_s=settings.gpu_report_interval_s)
    fleet = OptimizerFleet(optimizer_channel)
    enforcer = MigEnforcer(
        backend=backend, coordinator=coordinator, node=node, fleet=fleet.pools,
        router=router, supervisor=supervisor, lmcache_servers=parse_lmcache_servers(settings.engine_lmcache_servers),
        drain_timeout_s=settings.mig_drain_timeout_s, health_timeout_s=settings.engine_health_timeout_s,
        on_change=reporter.poke,
    )
    power_enforcer = PowerEnforcer(backend=backend, coordinator=power or PowerCoordinator(ctx.db, backend),
                                   fleet=fleet.inventory, supervisor=supervisor)
    save, load = plan_file_store(settings.data_dir / PLAN_FILE)
    follower = PlanFollower(component=COMPONENT, instance=node, channel=optimizer_channel,
                            reconcile=combine(enforcer.reconcile, power_enforcer.reconcile), save=save, load=load)
    log.info("following plans as %s/%s, engines: %s", COMPONENT, node, launcher_name)
    following = Following(follower, reporter, enforcer, supervisor, [router.close, optimizer_channel.close])
    reporter.start()
    await follower.start()
    if follower.plan is not None:  # a stored plan: its engines died with the previous process
        following.startup = asyncio.get_running_loop().create_task(follower.reconcile_now(force=True),
                                                                   name="reconcile-stored-plan")
    following.start_watchdog(settings.engine_check_interval_s, settings.engine_retry_backoff_max_s)
    return following


async def inventory_of(servicer: GpuPartitionerServicer) -> list[common_pb2.Gpu]:
    """The node's GPUs as GetInventory answers them."""
    reply = await servicer.GetInventory(gpu_partitioner_pb2.GetInventoryRequest(), None)
    return list(reply.gpus)
