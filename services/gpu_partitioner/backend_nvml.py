"""Real MIG backend over NVML through pynvml (PyPI nvidia-ml-py).

Calls and traps follow the NVML API reference (https://docs.nvidia.com/deploy/nvml-api/, "Multi Instance GPU
Management") as nvidia-ml-py's ``pynvml.py`` wraps it:

* ``NVML_GPU_INSTANCE_PROFILE_*`` constants are only the argument of
  ``nvmlDeviceGetGpuInstanceProfileInfo``; every later call takes ``info.id`` (19, 20, 15, 14, 9, 5, 0).
* Placement ``start``/``size`` are in memory slices; ``size`` comes from the possible-placements list.
* pynvml sets no ctypes argtypes: placements and counts are passed with ``ctypes.byref``; output arrays
  are sized from the count NVML returns (not ``instanceCount``: the +me profile has 7 placements, 1 instance).
* ``nvmlDeviceSetMigMode`` returns the activation status instead of raising; IN_USE / RESET_REQUIRED are
  checked and ``nvmlDeviceGetMigMode`` is re-read: ``current != pending`` means a reset is needed (A100).
* Destroying a GI needs its compute instances destroyed first; both return IN_USE while processes run.
* MIG device UUIDs come from the MIG device handles, joined to the GI/CI ids we created.
* Power is milliwatts and energy millijoules since driver load, for the whole GPU only.
* Power limits are milliwatts: ``nvmlDeviceSetPowerManagementLimit`` takes one within
  ``nvmlDeviceGetPowerManagementLimitConstraints`` (INVALID_ARGUMENT outside), NO_PERMISSION without root;
  ``nvmlDeviceSetGpuLockedClocks(min, max)`` takes MHz of ``nvmlDeviceGetSupportedGraphicsClocks`` (listed per
  memory clock: the highest of ``nvmlDeviceGetSupportedMemoryClocks``, the one a data-centre GPU runs at), and
  ``nvmlDeviceResetGpuLockedClocks`` unlocks them; NVML has no call that reads a clock lock back.
* A GPU whose ``nvmlDeviceGetMigMode`` answers NOT_SUPPORTED (no MIG: T4, V100) is listed with ``mig_capable``
  false; with the MIG-capable ones whose mode is disabled it is a whole GPU (``GpuState.whole``), named by
  ``hardware`` ("Tesla T4" -> "T4"): where the gpu-partitioner runs DPD's decoder.

Profiles and placements are read from the GPU when MIG is on (``...ProfileInfo`` + ``...PossiblePlacements``);
otherwise, or when NVML refuses, the tables of ``geometry`` are used.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import threading
from types import ModuleType
from typing import Any

from greenserve.common import mig_geometry as geometry_mod
from greenserve.gpu_partitioner.backend import (
    GpuState,
    hardware_name,
    InstanceState,
    InsufficientResourcesError,
    InUseError,
    InvalidPlacementError,
    MigBackendError,
    NoPermissionError,
    NotFoundError,
    NotSupportedError,
    PowerLimits,
    PowerReading,
    ResetRequiredError,
)
from greenserve.common.mig_geometry import GpuGeometry, Placement, MigProfile

log = logging.getLogger("greenserve.gpu_partitioner.nvml")

MIB = 1024 * 1024

# Full-size compute instance of a GI with N compute slices (NVML_COMPUTE_INSTANCE_PROFILE_<N>_SLICE).
_CI_CONSTANT_BY_SLICES = {
    1: "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE",
    2: "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE",
    3: "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE",
    4: "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE",
    6: "NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE",
    7: "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE",
    8: "NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE",
}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """MigBackend over the real NVML library. Construction calls ``nvmlInit`` (raises when NVML is absent)."""

    kind = "nvml"

    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        self.N = nvml if nvml is not None else importlib.import_module("pynvml")
        self.N.nvmlInit()
        self._lock = threading.RLock()
        self._geometry: dict[str, GpuGeometry] = {}
        self._errors: dict[int, type[MigBackendError]] = {
            self.N.NVML_ERROR_NOT_SUPPORTED: NotSupportedError,
            self.N.NVML_ERROR_INVALID_ARGUMENT: InvalidPlacementError,
            self.N.NVML_ERROR_NO_PERMISSION: NoPermissionError,
            self.N.NVML_ERROR_NOT_FOUND: NotFoundError,
            self.N.NVML_ERROR_GPU_IS_LOST: NotFoundError,  # fell off the bus: a handle taken before answers this
            self.N.NVML_ERROR_RESET_REQUIRED: ResetRequiredError,
            self.N.NVML_ERROR_IN_USE: InUseError,
            self.N.NVML_ERROR_INSUFFICIENT_RESOURCES: InsufficientResourcesError,
        }

    # ---------------------------------------------------------------------------------------------
    # Helpers
    # ---------------------------------------------------------------------------------------------

    def _translate(self, exc: Exception, what: str) -> MigBackendError:
        code = getattr(exc, "value", None)
        cls = self._errors.get(code, MigBackendError) if isinstance(code, int) else MigBackendError
        return cls(f"{what}: {type(exc).__name__} ({exc}, NVML error {code})")

    def _handle(self, gpu_uuid: str) -> Any:
        try:
            return self.N.nvmlDeviceGetHandleByUUID(gpu_uuid)
        except self.N.NVMLError as exc:
            raise self._translate(exc, f"GPU {gpu_uuid}") from exc

    def _mig_mode(self, handle: Any) -> tuple[bool, bool, bool]:
        """(capable, enabled, pending change)."""
        try:
            current, pending = self.N.nvmlDeviceGetMigMode(handle)
        except self.N.NVMLError_NotSupported:
            return False, False, False
        return True, current == self.N.NVML_DEVICE_MIG_ENABLE, current != pending

    def _table_geometry(self, handle: Any, name: str) -> GpuGeometry | None:
        pci = None
        try:
            pci = int(self.N.nvmlDeviceGetPciInfo(handle).pciDeviceId)
        except self.N.NVMLError:
            pass
        model = geometry_mod.identify_model(name=name, pci_device_id=pci)
        return None if model is None else geometry_mod.geometry(model)

    def _read_profiles(self, handle: Any, table: GpuGeometry | None) -> list[MigProfile]:
        """GI profiles the device offers (needs MIG on: the V call answers NOT_SUPPORTED otherwise)."""
        N = self.N
        constants = {getattr(N, n): n for n in dir(N) if n.startswith("NVML_GPU_INSTANCE_PROFILE_") and n != "NVML_GPU_INSTANCE_PROFILE_COUNT"}
        profiles: list[MigProfile] = []
        for const in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = N.nvmlDeviceGetGpuInstanceProfileInfo(handle, const)
            except N.NVMLError_FunctionNotFound:  # driver without the V symbol: legacy struct, no name
                try:
                    info = N.nvmlDeviceGetGpuInstanceProfileInfo(handle, const, version=1)
                except (N.NVMLError_NotSupported, N.NVMLError_InvalidArgument):
                    continue
            except (N.NVMLError_NotSupported, N.NVMLError_InvalidArgument):
                continue
            count = ctypes.c_uint(0)
            N.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, None, ctypes.byref(count))
            if count.value == 0:
                continue
            array = (N.c_nvmlGpuInstancePlacement_t * count.value)()
            N.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, array, ctypes.byref(count))
            placements = [(array[i].start, array[i].size) for i in range(count.value)]
            known = table.profile_by_id(info.id) if table is not None else None
            raw_name = _text(getattr(info, "name", "") or "")
            name = raw_name.removeprefix("MIG ").strip() or (known.name if known else f"profile-{info.id}")
            profiles.append(MigProfile(
                name=name, nvml_constant=constants.get(const, str(const)), nvml_value=const, profile_id=int(info.id),
                compute_slices=int(info.sliceCount), memory_slices=int(placements[0][1]),
                starts=tuple(sorted(int(p[0]) for p in placements)), max_instances=int(info.instanceCount),
                memory_mib=int(info.memorySizeMB), media_extensions="+me" in name,
                min_driver=0,
            ))
        return profiles

    def _mig_identity(self, mig: Any, profile: MigProfile) -> tuple[str, int]:
        """UUID and memory of a MIG device handle; without a handle (not enumerated yet) an empty UUID and
        the profile's nominal memory. Memory falls back to the profile when NVML cannot report it."""
        if mig is None:
            return "", profile.memory_mib * MIB
        uuid = _text(self.N.nvmlDeviceGetUUID(mig))
        try:
            return uuid, int(self.N.nvmlDeviceGetMemoryInfo(mig).total)
        except self.N.NVMLError:
            return uuid, profile.memory_mib * MIB

    def _gpu_instances(self, handle: Any, profile: MigProfile) -> list[Any]:
        N = self.N
        count = ctypes.c_uint(0)
        array = (N.c_nvmlGpuInstance_t * max(1, profile.max_instances))()
        try:
            N.nvmlDeviceGetGpuInstances(handle, profile.profile_id, array, ctypes.byref(count))
        except (N.NVMLError_NotSupported, N.NVMLError_InvalidArgument, N.NVMLError_NotFound):
            return []
        return [array[i] for i in range(count.value)]

    def _compute_instances(self, gi: Any) -> list[Any]:
        N = self.N
        found: list[Any] = []
        for const in range(N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                ci_info = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, const, N.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            except N.NVMLError:
                continue
            count = ctypes.c_uint(0)
            array = (N.c_nvmlComputeInstance_t * max(1, ci_info.instanceCount))()
            try:
                N.nvmlGpuInstanceGetComputeInstances(gi, ci_info.id, array, ctypes.byref(count))
            except N.NVMLError:
                continue
            found.extend(array[i] for i in range(count.value))
        return found

    def _mig_handles(self, handle: Any) -> dict[tuple[int, int], Any]:
        N = self.N
        out: dict[tuple[int, int], Any] = {}
        try:
            count = N.nvmlDeviceGetMaxMigDeviceCount(handle)
        except N.NVMLError:
            return out
        for index in range(count):
            try:
                mig = N.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except N.NVMLError_NotFound:  # indices can have holes
                continue
            out[(int(N.nvmlDeviceGetGpuInstanceId(mig)), int(N.nvmlDeviceGetComputeInstanceId(mig)))] = mig
        return out

    def _instances(self, handle: Any, geo: GpuGeometry) -> list[InstanceState]:
        N = self.N
        migs = self._mig_handles(handle)
        out: list[InstanceState] = []
        for profile in geo.profiles:
            for gi in self._gpu_instances(handle, profile):
                info = N.nvmlGpuInstanceGetInfo(gi)
                cis = self._compute_instances(gi)
                ci_id = int(N.nvmlComputeInstanceGetInfo(cis[0]).id) if cis else -1
                mig = migs.get((int(info.id), ci_id))
                uuid, memory = self._mig_identity(mig, profile)
                out.append(InstanceState(
                    profile=profile.name, start=int(info.placement.start), size=int(info.placement.size),
                    gpu_instance_id=int(info.id), compute_instance_id=max(ci_id, 0), uuid=uuid, memory_bytes=memory))
        return sorted(out, key=lambda i: i.start)

    def _geometry_for(self, handle: Any, gpu_uuid: str, name: str, mig_enabled: bool) -> GpuGeometry | None:
        with self._lock:
            cached = self._geometry.get(gpu_uuid)
        if cached is not None:
            return cached
        table = self._table_geometry(handle, name)
        if not mig_enabled:
            return table
        try:
            device_profiles = self._read_profiles(handle, table)
        except self.N.NVMLError as exc:
            log.warning("reading MIG profiles from NVML failed; using the tables", extra={"gpu": gpu_uuid, "error": str(exc)})
            return table
        if not device_profiles:
            return table
        base = table or GpuGeometry(model=name, display_name=name, profiles=())
        geo = base.with_device_profiles(device_profiles)
        with self._lock:
            self._geometry[gpu_uuid] = geo
        return geo

    # ---------------------------------------------------------------------------------------------
    # MigBackend
    # ---------------------------------------------------------------------------------------------

    def driver_version(self) -> str:
        try:
            return _text(self.N.nvmlSystemGetDriverVersion())
        except self.N.NVMLError:
            return ""

    def driver_branch(self) -> int:
        head = self.driver_version().split(".")[0]
        return int(head) if head.isdigit() else geometry_mod.CURRENT_DRIVER

    def list_gpus(self) -> list[GpuState]:
        N = self.N
        out = []
        for index in range(N.nvmlDeviceGetCount()):
            try:
                handle = N.nvmlDeviceGetHandleByIndex(index)
            except N.NVMLError_NoPermission:  # a GPU this process may not open (nvml.h)
                continue
            out.append(self._state(handle, index))
        return out

    def _state(self, handle: Any, index: int) -> GpuState:
        N = self.N
        uuid = _text(N.nvmlDeviceGetUUID(handle))
        name = _text(N.nvmlDeviceGetName(handle))
        capable, enabled, pending = self._mig_mode(handle)
        geo = self._geometry_for(handle, uuid, name, enabled) if capable else None
        try:
            memory = int(N.nvmlDeviceGetMemoryInfo(handle).total)
        except N.NVMLError:  # MIG parent without privileges: NO_PERMISSION
            memory = geo.memory_mib * MIB if geo is not None else 0
        instances = self._instances(handle, geo) if (enabled and geo is not None) else []
        model = geo.model if (geo is not None and geo.model in geometry_mod.models()) else None
        return GpuState(uuid=uuid, index=index, name=name, model=model, memory_bytes=memory, mig_capable=capable,
                        mig_enabled=enabled, mig_pending=pending, instances=instances,
                        hardware=hardware_name(name, model))

    def gpu(self, gpu_uuid: str) -> GpuState:
        handle = self._handle(gpu_uuid)
        for index in range(self.N.nvmlDeviceGetCount()):
            try:
                if _text(self.N.nvmlDeviceGetUUID(self.N.nvmlDeviceGetHandleByIndex(index))) == gpu_uuid:
                    return self._state(handle, index)
            except self.N.NVMLError:
                continue
        return self._state(handle, 0)

    def geometry(self, gpu_uuid: str) -> GpuGeometry:
        handle = self._handle(gpu_uuid)
        name = _text(self.N.nvmlDeviceGetName(handle))
        capable, enabled, _ = self._mig_mode(handle)
        geo = self._geometry_for(handle, gpu_uuid, name, enabled) if capable else None
        if geo is None:
            raise NotSupportedError(f"GPU {gpu_uuid} ({name}) has no MIG profiles this service knows")
        return geo

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> None:
        N = self.N
        handle = self._handle(gpu_uuid)
        capable, current, pending = self._mig_mode(handle)
        if not capable:
            raise NotSupportedError(f"GPU {gpu_uuid} does not support MIG")
        if current == enabled and not pending:
            return
        try:
            status = N.nvmlDeviceSetMigMode(handle, N.NVML_DEVICE_MIG_ENABLE if enabled else N.NVML_DEVICE_MIG_DISABLE)
        except N.NVMLError as exc:
            raise self._translate(exc, "nvmlDeviceSetMigMode") from exc
        with self._lock:
            self._geometry.pop(gpu_uuid, None)
        if status == N.NVML_ERROR_IN_USE:
            raise InUseError("MIG mode change not activated: the GPU is in use; idle it and retry")
        if status == N.NVML_ERROR_RESET_REQUIRED:
            raise ResetRequiredError("MIG mode change needs a GPU reset (or a reboot in a pass-through VM)")
        if status != N.NVML_SUCCESS:
            raise MigBackendError(f"MIG mode change activation failed with NVML status {status}")
        # The handle may have changed after an unbind/reset (nvml.h): re-acquire before reading back.
        handle = self._handle(gpu_uuid)
        current_now, pending_now = N.nvmlDeviceGetMigMode(handle)
        if current_now != pending_now:
            raise ResetRequiredError(
                f"MIG mode change to {'enabled' if enabled else 'disabled'} is pending a GPU reset "
                f"(current={current_now}, pending={pending_now})")

    def create_instance(self, gpu_uuid: str, placement: Placement) -> InstanceState:
        N = self.N
        handle = self._handle(gpu_uuid)
        geo = self.geometry(gpu_uuid)
        if not geo.has_profile(placement.profile):
            raise InvalidPlacementError(f"{geo.model} has no MIG profile {placement.profile!r}")
        profile = geo.profile(placement.profile)
        try:
            info = N.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile.nvml_value)
            request = N.c_nvmlGpuInstancePlacement_t()
            request.start, request.size = placement.start, placement.size
            gi = N.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, ctypes.byref(request))
        except N.NVMLError as exc:
            raise self._translate(exc, f"create {placement}") from exc
        try:
            ci_const = getattr(N, _CI_CONSTANT_BY_SLICES[profile.compute_slices])
            ci_info = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_const, N.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            ci = N.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
            gi_id = int(N.nvmlGpuInstanceGetInfo(gi).id)
            ci_id = int(N.nvmlComputeInstanceGetInfo(ci).id)
        except (N.NVMLError, KeyError) as exc:
            try:  # never leave a GI without its compute instance behind
                N.nvmlGpuInstanceDestroy(gi)
            except N.NVMLError:
                log.error("could not destroy GI after a failed CI creation", extra={"gpu": gpu_uuid, "placement": str(placement)})
            if isinstance(exc, KeyError):
                raise NotSupportedError(f"no full-size compute instance for {profile.compute_slices} slices") from exc
            raise self._translate(exc, f"create compute instance on {placement}") from exc
        mig = self._mig_handles(handle).get((gi_id, ci_id))
        uuid, memory = self._mig_identity(mig, profile)
        return InstanceState(profile=profile.name, start=placement.start, size=placement.size, gpu_instance_id=gi_id,
                             compute_instance_id=ci_id, uuid=uuid, memory_bytes=memory)

    def destroy_instance(self, gpu_uuid: str, placement: Placement) -> None:
        N = self.N
        handle = self._handle(gpu_uuid)
        _capable, enabled, _ = self._mig_mode(handle)
        if not enabled:
            raise NotSupportedError("MIG mode is not enabled on this GPU")
        geo = self.geometry(gpu_uuid)
        if not geo.has_profile(placement.profile):
            raise NotFoundError(f"no GPU instance {placement}")
        for gi in self._gpu_instances(handle, geo.profile(placement.profile)):
            info = N.nvmlGpuInstanceGetInfo(gi)
            if (int(info.placement.start), int(info.placement.size)) != (placement.start, placement.size):
                continue
            try:
                for ci in self._compute_instances(gi):  # CIs first: the GI is IN_USE while they exist
                    N.nvmlComputeInstanceDestroy(ci)
                N.nvmlGpuInstanceDestroy(gi)
            except N.NVMLError as exc:
                raise self._translate(exc, f"destroy {placement}") from exc
            return
        raise NotFoundError(f"no GPU instance {placement} on {gpu_uuid}")

    def read_power(self, gpu_uuid: str) -> PowerReading:
        N = self.N
        handle = self._handle(gpu_uuid)
        power_w = energy_j = None
        try:
            power_w = N.nvmlDeviceGetPowerUsage(handle) / 1000.0  # mW
        except N.NVMLError:
            pass
        try:
            energy_j = N.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0  # mJ since driver load
        except N.NVMLError:
            pass
        return PowerReading(power_w=power_w, energy_j=energy_j)

    def power_limits(self, gpu_uuid: str) -> PowerLimits:
        N = self.N
        handle = self._handle(gpu_uuid)
        try:
            low, high = N.nvmlDeviceGetPowerManagementLimitConstraints(handle)
            default = N.nvmlDeviceGetPowerManagementDefaultLimit(handle)
            current = N.nvmlDeviceGetPowerManagementLimit(handle)
        except N.NVMLError as exc:
            raise self._translate(exc, f"power limits of {gpu_uuid}") from exc
        return PowerLimits(min_w=low / 1000.0, max_w=high / 1000.0, default_w=default / 1000.0,
                           current_w=current / 1000.0)

    def set_power_limit(self, gpu_uuid: str, watts: float) -> None:
        handle = self._handle(gpu_uuid)
        try:
            self.N.nvmlDeviceSetPowerManagementLimit(handle, int(round(watts * 1000.0)))
        except self.N.NVMLError as exc:
            raise self._translate(exc, f"nvmlDeviceSetPowerManagementLimit({watts:g} W)") from exc

    def supported_sm_clocks(self, gpu_uuid: str) -> list[int]:
        N = self.N
        handle = self._handle(gpu_uuid)
        try:
            memory = max(N.nvmlDeviceGetSupportedMemoryClocks(handle), default=None)
            if memory is None:
                raise NotSupportedError(f"GPU {gpu_uuid} lists no supported memory clock")
            clocks = N.nvmlDeviceGetSupportedGraphicsClocks(handle, int(memory))
        except N.NVMLError as exc:
            raise self._translate(exc, f"supported clocks of {gpu_uuid}") from exc
        return sorted({int(c) for c in clocks}, reverse=True)

    def set_locked_clocks(self, gpu_uuid: str, min_mhz: int, max_mhz: int) -> None:
        handle = self._handle(gpu_uuid)
        try:
            self.N.nvmlDeviceSetGpuLockedClocks(handle, int(min_mhz), int(max_mhz))
        except self.N.NVMLError as exc:
            raise self._translate(exc, f"nvmlDeviceSetGpuLockedClocks({min_mhz}, {max_mhz})") from exc

    def reset_locked_clocks(self, gpu_uuid: str) -> None:
        handle = self._handle(gpu_uuid)
        try:
            self.N.nvmlDeviceResetGpuLockedClocks(handle)
        except self.N.NVMLError as exc:
            raise self._translate(exc, "nvmlDeviceResetGpuLockedClocks") from exc

    def instance_activity(self, gpu_uuid: str) -> dict[str, float] | None:
        # NVML has no per-GI utilisation on A100 (N/A; nvmlDeviceGetUtilizationRates is NOT_SUPPORTED on a
        # MIG-mode GPU); the energy split then falls back to the static compute-slice weights.
        return None

    def close(self) -> None:
        try:
            self.N.nvmlShutdown()
        except self.N.NVMLError:
            pass
