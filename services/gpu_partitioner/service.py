"""GpuPartitionerService wiring: servicer and the build function the process entry point runs (its settings:
settings.py).

The service picks the real NVML backend when ``nvmlInit`` succeeds and the simulated backend otherwise
(or as ``--backend`` says), reports which in GetInventory, finishes or rolls back applies a crash left
open before it starts serving, and samples GPU energy on a timer.

Placement convention of the requests: a ``MigPlacement`` with ``size == 0`` has no placement yet; the
planner places it (keeping running instances where it can). Any other size is an explicit placement in
memory slices, as NVML places GIs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Sequence
from datetime import datetime

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from greenserve.common.tasks import cancel_and_wait
from greenserve.common.app import ServiceContext
from greenserve.common.client import ChannelConfig
from greenserve.common.errors import FailedPrecondition, InvalidArgument, NotFound
from greenserve.common.server import Registration, registration
from greenserve.common import mig_geometry as geometry_mod
from greenserve.gpu_partitioner import layout_diff, migparted
from greenserve.gpu_partitioner.apply import (
    DEFAULT_DRAIN_TIMEOUT_S,
    ApplyBusy,
    ApplyCoordinator,
    ApplyPreconditionError,
    ApplyResult,
)
from greenserve.gpu_partitioner.backend import GpuState, MigBackend, NotFoundError
from greenserve.gpu_partitioner.backend_nvml import NvmlBackend
from greenserve.gpu_partitioner.backend_sim import SimulatedBackend, parse_gpu_spec
from greenserve.gpu_partitioner.energy import SPLIT_RULE, EnergyAccountant, GpuEnergyView
from greenserve.gpu_partitioner.follow import inventory_of, start_following
from greenserve.common.mig_geometry import CURRENT_DRIVER, LayoutError, Placement
from greenserve.gpu_partitioner.peer_clients import RouterEngines
from greenserve.gpu_partitioner.power import PowerCoordinator
from greenserve.gpu_partitioner.settings import GpuPartitionerSettings
from greenserve.v1 import (
    common_pb2,
    gpu_partitioner_pb2,
    gpu_partitioner_pb2_grpc,
)

log = logging.getLogger("greenserve.gpu_partitioner")

MODEL_TO_ENUM = {
    "A100-40GB": common_pb2.GPU_MODEL_A100_40GB,
    "A100-80GB": common_pb2.GPU_MODEL_A100_80GB,
    "H100-80GB": common_pb2.GPU_MODEL_H100_80GB,
    "H200-141GB": common_pb2.GPU_MODEL_H200_141GB,
}
ENUM_TO_MODEL = {v: k for k, v in MODEL_TO_ENUM.items()}
STATE_TO_ENUM = {
    "pending": gpu_partitioner_pb2.APPLY_STATE_PENDING,
    "running": gpu_partitioner_pb2.APPLY_STATE_RUNNING,
    "succeeded": gpu_partitioner_pb2.APPLY_STATE_SUCCEEDED,
    "rolled_back": gpu_partitioner_pb2.APPLY_STATE_ROLLED_BACK,
    "failed": gpu_partitioner_pb2.APPLY_STATE_FAILED,
}
KIND_TO_ENUM = {
    layout_diff.DESTROY: gpu_partitioner_pb2.LAYOUT_STEP_KIND_DESTROY,
    layout_diff.CREATE: gpu_partitioner_pb2.LAYOUT_STEP_KIND_CREATE,
    layout_diff.ENABLE_MIG: gpu_partitioner_pb2.LAYOUT_STEP_KIND_ENABLE_MIG,
    layout_diff.DISABLE_MIG: gpu_partitioner_pb2.LAYOUT_STEP_KIND_DISABLE_MIG,
}


def _ts(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def _placements(layout: common_pb2.MigLayout, field: str) -> tuple[list[Placement], list[str]]:
    # Every GI takes a memory slice at least: a longer layout fits no GPU, and is refused before a million
    # placements are turned into objects and searched on the event loop.
    most = max(geo.memory_slices for geo in geometry_mod.models().values())
    if len(layout.placements) > most:
        raise InvalidArgument(f"{field}.placements", f"at most {most} GPU instances fit on a GPU, got "
                              f"{len(layout.placements)}")
    placed: list[Placement] = []
    unplaced: list[str] = []
    for i, p in enumerate(layout.placements):
        if not p.profile:
            raise InvalidArgument(f"{field}.placements[{i}].profile", "required")
        if p.size == 0:
            unplaced.append(p.profile)
        else:
            placed.append(Placement(start=p.start, size=p.size, profile=p.profile))
    return placed, unplaced


def _layout_error(exc: LayoutError, field: str, placed_indices: Sequence[int] | None = None) -> InvalidArgument:
    index = exc.index
    if index >= 0 and placed_indices is not None and index < len(placed_indices):
        index = placed_indices[index]
    name = f"{field}.placements[{index}]" if index >= 0 else f"{field}.placements"
    return InvalidArgument(name, str(exc))


def _placed_indices(layout: common_pb2.MigLayout) -> list[int]:
    return [i for i, p in enumerate(layout.placements) if p.size != 0]


def _step_proto(step: layout_diff.Step) -> gpu_partitioner_pb2.LayoutStep:
    msg = gpu_partitioner_pb2.LayoutStep(kind=KIND_TO_ENUM[step.kind])
    if step.placement is not None:
        msg.placement.CopyFrom(common_pb2.MigPlacement(profile=step.placement.profile, start=step.placement.start,
                                                       size=step.placement.size))
    return msg


def _record_proto(result: ApplyResult) -> gpu_partitioner_pb2.ApplyRecord:
    record = gpu_partitioner_pb2.ApplyRecord(
        apply_id=result.apply_id, gpu_uuid=result.gpu_uuid, steps=[_step_proto(s) for s in result.steps],
        done_steps=result.done_steps, state=STATE_TO_ENUM[result.state], error=result.error,
        instances=[common_pb2.MigInstance(
            uuid=i["uuid"], profile=i["profile"], placement_start=i["start"], placement_size=i["size"],
            gpu_instance_id=i["gpu_instance_id"], memory_bytes=i["memory_bytes"],
            kubernetes_resource=i.get("kubernetes_resource", "")) for i in result.instances],
    )
    if result.started_at is not None:
        record.started_at.CopyFrom(_ts(result.started_at))
    if result.ended_at is not None:
        record.ended_at.CopyFrom(_ts(result.ended_at))
    return record


class GpuPartitionerServicer(gpu_partitioner_pb2_grpc.GpuPartitionerServiceServicer):
    """greenserve.v1.GpuPartitionerService."""

    def __init__(self, ctx: ServiceContext, backend: MigBackend, coordinator: ApplyCoordinator,
                 energy: EnergyAccountant, router: RouterEngines | None, backend_note: str = "") -> None:
        self.ctx = ctx
        self.backend = backend
        self.coordinator = coordinator
        self.energy = energy
        self.router = router
        self.backend_note = backend_note
        self._engines: dict[str, list[tuple[str, str]]] = {}  # last good ListEngines answer: (id, URL) per MIG UUID

    async def _engine_map(self) -> dict[str, list[tuple[str, str]]]:
        if self.router is None:
            return self._engines
        try:
            self._engines = await asyncio.wait_for(self.router.mig_engines(), timeout=2.0)
        except Exception as exc:  # noqa: BLE001 - keep the last good answer
            log.info("router ListEngines failed; inventory uses the last known engines", extra={"error": str(exc)})
        return self._engines

    async def GetInventory(self, request: gpu_partitioner_pb2.GetInventoryRequest,
                           context: grpc.aio.ServicerContext) -> gpu_partitioner_pb2.GetInventoryResponse:
        gpus = await asyncio.to_thread(self.backend.list_gpus)
        engines = await self._engine_map()
        node = getattr(self.ctx.settings, "node_name", "")
        out = []
        for gpu in gpus:
            geo = geometry_mod.models().get(gpu.model or "")
            if gpu.mig_enabled:
                with contextlib.suppress(Exception):
                    geo = await asyncio.to_thread(self.backend.geometry, gpu.uuid)
            msg = common_pb2.Gpu(
                uuid=gpu.uuid, index=gpu.index, model=MODEL_TO_ENUM.get(gpu.model or "", common_pb2.GPU_MODEL_OTHER),
                name=gpu.name, memory_bytes=gpu.memory_bytes, mig_enabled=gpu.mig_enabled, node=node,
            )
            for inst in gpu.instances:
                # one id each (engine_id: the first, for old readers), and the URL of each the router has one for
                on_instance = [engine_id for engine_id, _ in engines.get(inst.uuid, [])]
                msg.instances.append(common_pb2.MigInstance(
                    uuid=inst.uuid, profile=inst.profile, placement_start=inst.start, placement_size=inst.size,
                    gpu_instance_id=inst.gpu_instance_id, memory_bytes=inst.memory_bytes,
                    engine_ids=on_instance, engine_id=on_instance[0] if on_instance else "",
                    engine_urls={engine_id: url for engine_id, url in engines.get(inst.uuid, [])
                                 if url.startswith(("http://", "https://"))},
                    kubernetes_resource=geo.profile(inst.profile).kubernetes_resource
                    if geo is not None and geo.has_profile(inst.profile) else "",
                ))
            out.append(msg)
        backend = (gpu_partitioner_pb2.NVML_BACKEND_NVML if self.backend.kind == "nvml"
                   else gpu_partitioner_pb2.NVML_BACKEND_SIMULATED)
        return gpu_partitioner_pb2.GetInventoryResponse(gpus=out, backend=backend, driver_version=self.backend.driver_version())

    @staticmethod
    def _model(value: common_pb2.GpuModel, field: str = "gpu_model") -> geometry_mod.GpuGeometry:
        model = ENUM_TO_MODEL.get(value)
        if model is None:
            raise InvalidArgument(field, f"must be one of {', '.join(common_pb2.GpuModel.Name(v) for v in ENUM_TO_MODEL)}")
        return geometry_mod.geometry(model)

    async def ListLayouts(self, request: gpu_partitioner_pb2.ListLayoutsRequest,
                          context: grpc.aio.ServicerContext) -> gpu_partitioner_pb2.ListLayoutsResponse:
        geo = self._model(request.gpu_model)
        for i, name in enumerate(request.profiles):
            if not geo.has_profile(name):
                raise InvalidArgument(f"profiles[{i}]", f"{geo.model} has no MIG profile {name!r}")
        layouts = geo.maximal_layouts(list(request.profiles) or None, driver=request.driver_branch or CURRENT_DRIVER)
        return gpu_partitioner_pb2.ListLayoutsResponse(layouts=[
            common_pb2.MigLayout(placements=[common_pb2.MigPlacement(profile=p.profile, start=p.start, size=p.size)
                                             for p in layout])
            for layout in layouts
        ])

    async def DiffLayouts(self, request: gpu_partitioner_pb2.DiffLayoutsRequest,
                          context: grpc.aio.ServicerContext) -> gpu_partitioner_pb2.DiffLayoutsResponse:
        geo = self._model(request.gpu_model)
        current, unplaced_from = _placements(getattr(request, "from"), "from")
        if unplaced_from:
            raise InvalidArgument("from.placements", "the current layout needs explicit placements (size > 0)")
        try:
            geo.validate(current)
        except LayoutError as exc:
            raise _layout_error(exc, "from", _placed_indices(getattr(request, "from"))) from None
        placed, unplaced = _placements(request.to, "to")
        try:
            target = layout_diff.resolve_target(geo, placed, unplaced, current)
        except LayoutError as exc:
            raise _layout_error(exc, "to", _placed_indices(request.to)) from None
        result = layout_diff.plan(geo, current, target)
        return gpu_partitioner_pb2.DiffLayoutsResponse(
            steps=[_step_proto(s) for s in result.steps],
            kept=[common_pb2.MigPlacement(profile=p.profile, start=p.start, size=p.size) for p in result.kept],
        )

    async def ApplyLayout(self, request: gpu_partitioner_pb2.ApplyLayoutRequest,
                          context: grpc.aio.ServicerContext) -> gpu_partitioner_pb2.ApplyLayoutResponse:
        gpu_uuid = request.layout.gpu_uuid
        if not gpu_uuid:
            raise InvalidArgument("layout.gpu_uuid", "required")
        timeout_s = request.drain_timeout_s or DEFAULT_DRAIN_TIMEOUT_S
        if not math.isfinite(timeout_s) or timeout_s < 0 or timeout_s > 3600:
            raise InvalidArgument("drain_timeout_s", "must be between 0 and 3600 seconds")
        placed, unplaced = _placements(request.layout, "layout")
        try:
            result = await self.coordinator.apply(
                gpu_uuid, placed, unplaced, plan_version=request.plan_version or None, dry_run=request.dry_run,
                drain_timeout_s=timeout_s)
        except NotFoundError as exc:
            raise NotFound(str(exc), field="layout.gpu_uuid") from None
        except LayoutError as exc:
            raise _layout_error(exc, "layout", _placed_indices(request.layout)) from None
        except (ApplyBusy, ApplyPreconditionError) as exc:
            raise FailedPrecondition(str(exc), field="layout.gpu_uuid") from None
        return gpu_partitioner_pb2.ApplyLayoutResponse(record=_record_proto(result))

    async def GetApply(self, request: gpu_partitioner_pb2.GetApplyRequest,
                       context: grpc.aio.ServicerContext) -> gpu_partitioner_pb2.GetApplyResponse:
        if not request.apply_id:
            raise InvalidArgument("apply_id", "required")
        try:
            result = self.coordinator.get(request.apply_id)
        except KeyError:
            raise NotFound(f"no apply {request.apply_id!r}", field="apply_id") from None
        return gpu_partitioner_pb2.GetApplyResponse(record=_record_proto(result))

    async def GetEnergy(self, request: gpu_partitioner_pb2.GetEnergyRequest,
                        context: grpc.aio.ServicerContext) -> gpu_partitioner_pb2.GetEnergyResponse:
        gpus = await asyncio.to_thread(self.backend.list_gpus)
        known = {g.uuid for g in gpus}
        for i, uuid in enumerate(request.gpu_uuids):
            if uuid not in known:
                raise NotFound(f"no GPU {uuid!r}", field=f"gpu_uuids[{i}]")
        wanted = set(request.gpu_uuids) or known
        out = []
        for gpu in gpus:
            if gpu.uuid not in wanted:
                continue
            view = await sample_gpu(self.backend, self.energy, gpu)
            msg = gpu_partitioner_pb2.GpuEnergy(
                gpu_uuid=gpu.uuid, power_w=view.power_w, energy_j=view.energy_j, idle_power_w=view.idle_power_w,
                unallocated_power_w=view.unallocated_power_w, unallocated_energy_j=view.unallocated_energy_j,
                split_rule=SPLIT_RULE,
                instances=[gpu_partitioner_pb2.InstanceEnergy(mig_uuid=i.mig_uuid, power_w=i.power_w, energy_j=i.energy_j)
                           for i in view.instances],
            )
            msg.sampled_at.CopyFrom(_ts(view.sampled_at))
            out.append(msg)
        return gpu_partitioner_pb2.GetEnergyResponse(gpus=out)

    async def ConvertMigPartedConfig(self, request: gpu_partitioner_pb2.ConvertMigPartedConfigRequest,
                                     context: grpc.aio.ServicerContext) -> gpu_partitioner_pb2.ConvertMigPartedConfigResponse:
        geo = self._model(request.gpu_model)
        gpus = await asyncio.to_thread(self.backend.list_gpus)
        which = request.WhichOneof("input")
        if which == "yaml":
            try:
                configs = migparted.parse(request.yaml, geo, index_to_uuid={g.index: g.uuid for g in gpus})
            except migparted.MigPartedError as exc:
                raise InvalidArgument(f"yaml ({exc.path})", exc.message) from None
            return gpu_partitioner_pb2.ConvertMigPartedConfigResponse(configs=[
                gpu_partitioner_pb2.NamedLayouts(name=c.name, layouts=[
                    common_pb2.MigLayout(gpu_uuid=layout.gpu_uuid, placements=[
                        common_pb2.MigPlacement(profile=p.profile, start=p.start, size=p.size) for p in layout.placements])
                    for layout in c.layouts])
                for c in configs
            ])
        if which == "layouts":
            layouts = []
            for i, layout in enumerate(request.layouts.layouts):
                placed, unplaced = _placements(layout, f"layouts.layouts[{i}]")
                try:
                    layouts.append((layout.gpu_uuid, layout_diff.resolve_target(geo, placed, unplaced)))
                except LayoutError as exc:
                    raise _layout_error(exc, f"layouts.layouts[{i}]", _placed_indices(layout)) from None
            try:
                text = migparted.export([(request.layouts.name, layouts)], geo,
                                        uuid_to_index={g.uuid: g.index for g in gpus})
            except migparted.MigPartedError as exc:
                raise InvalidArgument(f"layouts.{exc.path}", exc.message) from None
            return gpu_partitioner_pb2.ConvertMigPartedConfigResponse(yaml=text)
        raise InvalidArgument("input", "set yaml or layouts")


async def sample_gpu(backend: MigBackend, energy: EnergyAccountant, gpu: GpuState) -> GpuEnergyView:
    """Read power/energy and activity of `gpu` and attribute the interval (one energy sample)."""
    reading = await asyncio.to_thread(backend.read_power, gpu.uuid)
    activity = await asyncio.to_thread(backend.instance_activity, gpu.uuid)
    geo = None
    if gpu.mig_capable:
        with contextlib.suppress(Exception):
            geo = await asyncio.to_thread(backend.geometry, gpu.uuid)
    return await asyncio.to_thread(energy.sample, gpu, geo, reading, activity)


def open_backend(settings: GpuPartitionerSettings, ctx: ServiceContext) -> tuple[MigBackend, str]:
    """The backend the settings ask for: NVML when it initialises (auto), else the simulator."""
    note = ""
    if settings.backend in ("auto", "nvml"):
        try:
            return NvmlBackend(), "NVML initialised"
        except Exception as exc:  # pynvml.NVMLError_LibraryNotFound / DriverNotLoaded / NoPermission, OSError
            if settings.backend == "nvml":  # a start-up error, said on one line (ValueError: see run_service)
                raise ValueError(f"--backend nvml: NVML unavailable ({type(exc).__name__}: {exc})") from exc
            note = f"NVML unavailable ({type(exc).__name__}: {exc}); using the simulated backend"
    return SimulatedBackend(ctx.db, parse_gpu_spec(settings.sim_gpus)), note or "simulated backend requested"


async def build(ctx: ServiceContext) -> list[Registration]:
    settings = ctx.settings
    assert isinstance(settings, GpuPartitionerSettings)
    backend, note = open_backend(settings, ctx)
    log.info("MIG backend", extra={"backend": backend.kind, "note": note})
    router = RouterEngines(ChannelConfig(address=settings.router_addr, token=settings.token(), tls_ca=settings.tls_ca))
    energy = EnergyAccountant(ctx.db)
    coordinator = ApplyCoordinator(ctx.db, backend, router, energy=energy, recovery_policy=settings.recovery_policy,
                                   require_router=settings.require_router)
    recovered = await coordinator.recover()
    if recovered:
        log.warning("recovered interrupted applies", extra={"apply_ids": recovered, "policy": settings.recovery_policy})
    power = PowerCoordinator(ctx.db, backend, recovery_policy=settings.recovery_policy)
    recovered = await asyncio.to_thread(power.recover)
    if recovered:
        log.warning("recovered interrupted GPU power changes", extra={"run_ids": recovered,
                                                                      "policy": settings.recovery_policy})
    servicer = GpuPartitionerServicer(ctx, backend, coordinator, energy, router, note)
    following = await start_following(ctx, settings, backend, coordinator, lambda: inventory_of(servicer), power)

    sampler: asyncio.Task[None] | None = None
    if settings.energy_sample_interval_s > 0:
        async def sample_forever() -> None:
            while True:
                await asyncio.sleep(settings.energy_sample_interval_s)
                try:
                    for gpu in await asyncio.to_thread(backend.list_gpus):
                        await sample_gpu(backend, energy, gpu)
                except Exception as exc:  # noqa: BLE001 - keep sampling; a GPU may come back
                    log.warning("energy sample failed", extra={"error": str(exc)})

        sampler = asyncio.get_running_loop().create_task(sample_forever())

    async def stop() -> None:
        await following.stop()  # engines first: they run on this node's instances
        await cancel_and_wait(sampler)
        await router.close()
        await asyncio.to_thread(backend.close)

    ctx.on_stop.append(stop)
    return [registration(gpu_partitioner_pb2, gpu_partitioner_pb2_grpc, "GpuPartitionerService", servicer)]
