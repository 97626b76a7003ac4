"""A stand-in for the `pynvml` module that behaves like NVML on an A100 / H100 with MIG.

Used ONLY because no GPU is available in CI: the NVML backend runs unchanged against it, passing the
same ctypes objects (``byref`` counts and placements, pointer arrays) it would pass to the real library.
Constants, struct types and the NVMLError classes are the real ones from pynvml; only the functions
that would reach libnvidia-ml are replaced.

The device model is written independently of ``greenserve.common.mig_geometry``: the placement table is the
`nvidia-smi mig -lgipp` output printed in NVIDIA's MIG User Guide
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/, "Getting Started with MIG", List GPU Instance Profiles),
the profiles are its `-lgip` rows, and the errors are the NVML return codes of the NVML API reference
(https://docs.nvidia.com/deploy/nvml-api/, "Multi Instance GPU Management": INSUFFICIENT_RESOURCES on overlap,
IN_USE with processes or compute instances, a pending mode change until reset on A100, NOT_SUPPORTED when MIG is
off).
"""

from __future__ import annotations

import ctypes
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any

import pynvml as real

# `nvidia-smi mig -lgipp` (identical on A100-40GB, H100 80GB): profile id -> (starts, size)
LGIPP: dict[int, tuple[tuple[int, ...], int]] = {
    19: ((0, 1, 2, 3, 4, 5, 6), 1),
    20: ((0, 1, 2, 3, 4, 5, 6), 1),
    15: ((0, 2, 4, 6), 2),
    14: ((0, 2, 4), 2),
    9: ((0, 4), 4),
    5: ((0,), 4),
    0: ((0,), 8),
}

# GI profile constant -> (profile id, slices, instanceCount, name, memory MiB)
A100_40GB = {
    0: (19, 1, 7, "MIG 1g.5gb", 4864), 7: (20, 1, 1, "MIG 1g.5gb+me", 4864), 9: (15, 1, 4, "MIG 1g.10gb", 9856),
    1: (14, 2, 3, "MIG 2g.10gb", 9856), 2: (9, 3, 2, "MIG 3g.20gb", 19968), 3: (5, 4, 1, "MIG 4g.20gb", 19968),
    4: (0, 7, 1, "MIG 7g.40gb", 40192),
}
H100_80GB = {
    0: (19, 1, 7, "MIG 1g.10gb", 9984), 7: (20, 1, 1, "MIG 1g.10gb+me", 9984), 9: (15, 1, 4, "MIG 1g.20gb", 20096),
    1: (14, 2, 3, "MIG 2g.20gb", 20096), 2: (9, 3, 2, "MIG 3g.40gb", 40448), 3: (5, 4, 1, "MIG 4g.40gb", 40448),
    4: (0, 7, 1, "MIG 7g.80gb", 81152),
}
DEVICES = {
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", 0x20B010DE, 40960, A100_40GB, True),
    "H100-80GB": ("NVIDIA H100 80GB HBM3", 0x233010DE, 81559, H100_80GB, False),
    # no MIG (Turing): nvmlDeviceGetMigMode and every MIG call answer NOT_SUPPORTED (NVML API reference)
    "T4": ("Tesla T4", 0x1EB810DE, 15360, {}, False),
}


# Power management and clocks, as `nvidia-smi -q -d POWER,SUPPORTED_CLOCKS` reports them on these boards:
# (min, max = default power limit in mW, memory clock MHz, graphics clocks from, down to, step MHz)
POWER_CLOCKS = {
    "A100-40GB": (100_000, 400_000, 1215, 1410, 210, 15),
    "H100-80GB": (200_000, 700_000, 2619, 1980, 345, 15),
    "T4": (60_000, 70_000, 5001, 1590, 300, 15),
}


def _raise(code: int) -> None:
    raise real.NVMLError(code)


def _addr(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def _out(ref: Any) -> Any:
    """The object behind a ctypes.byref(...) argument."""
    return ref._obj


@dataclass
class FakeCI:
    id: int
    profile_id: int
    struct: Any
    mig_struct: Any
    uuid: str
    processes: int = 0


@dataclass
class FakeGI:
    id: int
    profile_id: int
    start: int
    size: int
    slices: int
    memory_mib: int
    struct: Any
    cis: dict[int, FakeCI] = field(default_factory=dict)


@dataclass
class FakeDevice:
    model: str
    uuid: str
    struct: Any
    mig_current: int = 0
    mig_pending: int = 0
    gis: dict[int, FakeGI] = field(default_factory=dict)
    gpu_processes: int = 0
    power_mw: int = 60_000
    energy_mj: int = 0
    set_mig_status: int | None = None  # force an activation status (tests of IN_USE / RESET_REQUIRED)
    power_limit_mw: int | None = None  # None: the default limit
    locked_clocks: tuple[int, int] | None = None
    root: bool = True  # False: the power and clock setters answer NO_PERMISSION

    @property
    def spec(self) -> tuple[str, int, int, dict[int, tuple[int, int, int, str, int]], bool]:
        return DEVICES[self.model]


class FakeNvml:
    """Module-like object: attribute access falls back to the real pynvml (constants, structs, errors)."""

    def __init__(self, models: list[tuple[str, bool]], *, driver: str = "550.54.15", init_error: int | None = None) -> None:
        self._init_error = init_error
        self._driver = driver
        self.devices: list[FakeDevice] = []
        self._by_addr: dict[int, Any] = {}
        self.calls: list[str] = []
        for model, mig in models:
            struct = real.struct_c_nvmlDevice_t()
            dev = FakeDevice(model=model, uuid=f"GPU-{uuidlib.uuid4()}", struct=struct,
                             mig_current=int(mig), mig_pending=int(mig))
            self.devices.append(dev)
            self._by_addr[ctypes.addressof(struct)] = dev
        self.initialised = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(real, name)

    # -- lookup ---------------------------------------------------------------------------------

    def _device(self, handle: Any) -> FakeDevice:
        obj = self._by_addr.get(_addr(handle))
        if not isinstance(obj, FakeDevice):
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return obj

    def _gi(self, handle: Any) -> tuple[FakeDevice, FakeGI]:
        obj = self._by_addr.get(_addr(handle))
        if not isinstance(obj, tuple) or not isinstance(obj[1], FakeGI):
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        dev, gi = obj
        if gi.id not in dev.gis:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return dev, gi

    @staticmethod
    def _handle(struct: Any, kind: Any) -> Any:
        return ctypes.cast(ctypes.pointer(struct), kind)

    def _check_init(self) -> None:
        if not self.initialised:
            _raise(real.NVML_ERROR_UNINITIALIZED)

    # -- init / system --------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self._init_error is not None:
            _raise(self._init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised = max(0, self.initialised - 1)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self._driver

    # -- devices --------------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check_init()
        if not 0 <= index < len(self.devices):
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return self._handle(self.devices[index].struct, real.c_nvmlDevice_t)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        self._check_init()
        for dev in self.devices:
            if dev.uuid == uuid:
                return self._handle(dev.struct, real.c_nvmlDevice_t)
        _raise(real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._device(handle).spec[0]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        obj = self._by_addr.get(_addr(handle))
        if isinstance(obj, FakeDevice):
            return obj.uuid
        if isinstance(obj, tuple) and isinstance(obj[1], FakeCI):
            return obj[1].uuid
        _raise(real.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        info = real.nvmlPciInfo_t()
        info.pciDeviceId = self._device(handle).spec[1]
        return info

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        mem = real.c_nvmlMemory_t()
        obj = self._by_addr.get(_addr(handle))
        if isinstance(obj, FakeDevice):
            if obj.mig_current:  # MIG parent: aggregate only with privileges
                _raise(real.NVML_ERROR_NO_PERMISSION)
            mem.total = obj.spec[2] * 1024 * 1024
        elif isinstance(obj, tuple) and isinstance(obj[1], FakeCI):
            mem.total = obj[0].memory_mib * 1024 * 1024
        else:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return mem

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._device(handle).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._device(handle).energy_mj

    # -- power limit and clocks -----------------------------------------------------------------

    def _power(self, handle: Any) -> tuple[FakeDevice, tuple[int, int, int, int, int, int]]:
        dev = self._device(handle)
        return dev, POWER_CLOCKS[dev.model]

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        _dev, (low, high, *_rest) = self._power(handle)
        return [low, high]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        return self._power(handle)[1][1]

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        dev, spec = self._power(handle)
        return spec[1] if dev.power_limit_mw is None else dev.power_limit_mw

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: int) -> None:
        dev, (low, high, *_rest) = self._power(handle)
        assert isinstance(limit, int), "pynvml passes c_uint(limit): milliwatts as an int"
        if not dev.root:
            _raise(real.NVML_ERROR_NO_PERMISSION)
        if not low <= limit <= high:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        self.calls.append(f"SetPowerManagementLimit({limit})")
        dev.power_limit_mw = None if limit == high else limit

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: Any) -> list[int]:
        return [self._power(handle)[1][2]]

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: Any, memoryClockMHz: int) -> list[int]:
        _dev, (_low, _high, memory, top, bottom, step) = self._power(handle)
        if memoryClockMHz != memory:
            _raise(real.NVML_ERROR_NOT_FOUND)
        return list(range(top, bottom - 1, -step))

    def nvmlDeviceSetGpuLockedClocks(self, handle: Any, minGpuClockMHz: int, maxGpuClockMHz: int) -> None:
        dev, spec = self._power(handle)
        assert isinstance(minGpuClockMHz, int) and isinstance(maxGpuClockMHz, int)
        if not dev.root:
            _raise(real.NVML_ERROR_NO_PERMISSION)
        if minGpuClockMHz > maxGpuClockMHz or maxGpuClockMHz > spec[3]:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        self.calls.append(f"SetGpuLockedClocks({minGpuClockMHz},{maxGpuClockMHz})")
        dev.locked_clocks = (minGpuClockMHz, maxGpuClockMHz)

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        dev, _spec = self._power(handle)
        if not dev.root:
            _raise(real.NVML_ERROR_NO_PERMISSION)
        self.calls.append("ResetGpuLockedClocks")
        dev.locked_clocks = None

    # -- MIG mode -------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        dev = self._device(handle)
        if not dev.spec[3]:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        return [dev.mig_current, dev.mig_pending]

    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        dev = self._device(handle)
        if not dev.spec[3]:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        self.calls.append(f"SetMigMode({mode})")
        if mode not in (0, 1):
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        if dev.set_mig_status is not None:
            return dev.set_mig_status
        if dev.gpu_processes or any(ci.processes for gi in dev.gis.values() for ci in gi.cis.values()):
            return real.NVML_ERROR_IN_USE  # activation status, not an exception (nvml.h)
        if mode == 0 and dev.gis:
            _raise(real.NVML_ERROR_IN_USE)
        dev.mig_pending = mode
        if not dev.spec[4]:  # Hopper: no reset needed
            dev.mig_current = mode
        return real.NVML_SUCCESS

    def reset(self, index: int) -> None:
        """`nvidia-smi -r`: pending mode takes effect, GIs/CIs vanish."""
        dev = self.devices[index]
        if dev.gpu_processes or any(ci.processes for gi in dev.gis.values() for ci in gi.cis.values()):
            _raise(real.NVML_ERROR_IN_USE)
        dev.mig_current = dev.mig_pending
        dev.gis.clear()

    # -- GPU instances --------------------------------------------------------------------------

    def _profile(self, dev: FakeDevice, const: int) -> tuple[int, int, int, str, int]:
        if not dev.mig_current:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        if const >= real.NVML_GPU_INSTANCE_PROFILE_COUNT:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        table = dev.spec[3]
        if const not in table:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        return table[const]

    def _profile_by_id(self, dev: FakeDevice, profile_id: int) -> tuple[int, int, int, str, int]:
        for entry in dev.spec[3].values():
            if entry[0] == profile_id:
                return entry
        _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        raise AssertionError

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> Any:
        dev = self._device(handle)
        pid, slices, count, name, mem = self._profile(dev, profile)
        info = real.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id, info.sliceCount, info.instanceCount, info.memorySizeMB = pid, slices, count, mem
        info.name = name.encode()
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, handle: Any, profileId: int, placementsRef: Any, countRef: Any) -> int:
        dev = self._device(handle)
        self._profile_by_id(dev, profileId)
        starts, size = LGIPP[profileId]
        count = _out(countRef)
        if placementsRef is None:
            count.value = len(starts)
            return real.NVML_SUCCESS
        if count.value < len(starts):
            _raise(real.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, start in enumerate(starts):
            placementsRef[i].start, placementsRef[i].size = start, size
        count.value = len(starts)
        return real.NVML_SUCCESS

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profileId: int, placement: Any) -> Any:
        dev = self._device(handle)
        if not dev.mig_current:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        pid, slices, count, _name, mem = self._profile_by_id(dev, profileId)
        req = _out(placement)  # the caller must pass ctypes.byref(c_nvmlGpuInstancePlacement_t)
        starts, size = LGIPP[pid]
        if req.start not in starts or req.size != size:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        mask = ((1 << size) - 1) << req.start
        used = 0
        for gi in dev.gis.values():
            used |= ((1 << gi.size) - 1) << gi.start
        same = sum(1 for gi in dev.gis.values() if gi.profile_id == pid)
        compute = slices + sum(gi.slices for gi in dev.gis.values())
        if used & mask or same >= count or compute > 7:
            _raise(real.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = next(n for n in range(1, 64) if n not in dev.gis)
        struct = real.struct_c_nvmlGpuInstance_t()
        gi = FakeGI(id=gi_id, profile_id=pid, start=req.start, size=size, slices=slices, memory_mib=mem, struct=struct)
        dev.gis[gi_id] = gi
        self._by_addr[ctypes.addressof(struct)] = (dev, gi)
        self.calls.append(f"CreateGpuInstanceWithPlacement({pid},{req.start},{req.size})")
        return self._handle(struct, real.c_nvmlGpuInstance_t)

    def nvmlDeviceGetGpuInstances(self, handle: Any, profileId: int, gpuInstancesRef: Any, countRef: Any) -> int:
        dev = self._device(handle)
        if not dev.mig_current:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        self._profile_by_id(dev, profileId)
        found = [gi for gi in sorted(dev.gis.values(), key=lambda g: g.id) if gi.profile_id == profileId]
        if len(found) > len(gpuInstancesRef):
            _raise(real.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, gi in enumerate(found):
            gpuInstancesRef[i] = self._handle(gi.struct, real.c_nvmlGpuInstance_t)
        _out(countRef).value = len(found)
        return real.NVML_SUCCESS

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        _dev, gi = self._gi(gpuInstance)
        info = real.c_nvmlGpuInstanceInfo_t()
        info.id, info.profileId = gi.id, gi.profile_id
        info.placement.start, info.placement.size = gi.start, gi.size
        return info

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        dev, gi = self._gi(gpuInstance)
        if gi.cis:
            _raise(real.NVML_ERROR_IN_USE)  # compute instances still exist
        del dev.gis[gi.id]
        self.calls.append(f"GpuInstanceDestroy({gi.start})")
        return real.NVML_SUCCESS

    # -- compute instances ----------------------------------------------------------------------

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, device: Any, profile: int, engProfile: int, version: int = 2) -> Any:
        _dev, gi = self._gi(device)
        # Full-size CI only; NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7}_SLICE = 0, 1, 2, 3, 4.
        slices_by_const = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}
        if engProfile != real.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED or slices_by_const.get(profile) != gi.slices:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        info = real.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id, info.sliceCount, info.instanceCount = profile, gi.slices, 1
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        dev, gi = self._gi(gpuInstance)
        if gi.cis:
            _raise(real.NVML_ERROR_INSUFFICIENT_RESOURCES)
        struct, mig_struct = real.struct_c_nvmlComputeInstance_t(), real.struct_c_nvmlDevice_t()
        ci = FakeCI(id=0, profile_id=profileId, struct=struct, mig_struct=mig_struct, uuid=f"MIG-{uuidlib.uuid4()}")
        gi.cis[0] = ci
        self._by_addr[ctypes.addressof(struct)] = (dev, gi, ci)
        self._by_addr[ctypes.addressof(mig_struct)] = (gi, ci)
        return self._handle(struct, real.c_nvmlComputeInstance_t)

    def _ci(self, handle: Any) -> tuple[FakeDevice, FakeGI, FakeCI]:
        obj = self._by_addr.get(_addr(handle))
        if not isinstance(obj, tuple) or len(obj) != 3:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        dev, gi, ci = obj
        if gi.id not in dev.gis or gi.cis.get(ci.id) is not ci:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return dev, gi, ci

    def nvmlGpuInstanceGetComputeInstances(self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any) -> int:
        _dev, gi = self._gi(gpuInstance)
        found = [ci for ci in gi.cis.values() if ci.profile_id == profileId]
        for i, ci in enumerate(found):
            computeInstancesRef[i] = self._handle(ci.struct, real.c_nvmlComputeInstance_t)
        _out(countRef).value = len(found)
        return real.NVML_SUCCESS

    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any:
        _dev, _gi, ci = self._ci(computeInstance)
        info = real.c_nvmlComputeInstanceInfo_t()
        info.id, info.profileId = ci.id, ci.profile_id
        return info

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        _dev, gi, ci = self._ci(computeInstance)
        if ci.processes:
            _raise(real.NVML_ERROR_IN_USE)
        del gi.cis[ci.id]
        return real.NVML_SUCCESS

    # -- MIG device handles ---------------------------------------------------------------------

    def _mig_list(self, dev: FakeDevice) -> list[tuple[FakeGI, FakeCI]]:
        return [(gi, ci) for gi in sorted(dev.gis.values(), key=lambda g: g.id) for ci in gi.cis.values()]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        dev = self._device(handle)
        return 7 if dev.mig_current else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        dev = self._device(handle)
        migs = self._mig_list(dev)
        if index >= len(migs):
            _raise(real.NVML_ERROR_NOT_FOUND)
        return self._handle(migs[index][1].mig_struct, real.c_nvmlDevice_t)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        gi, _ci = self._by_addr[_addr(handle)]
        return gi.id

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        _gi, ci = self._by_addr[_addr(handle)]
        return ci.id

    # -- what a workload does -------------------------------------------------------------------

    def start_process(self, mig_uuid: str) -> None:
        for dev in self.devices:
            for _gi, ci in self._mig_list(dev):
                if ci.uuid == mig_uuid:
                    ci.processes += 1
                    return
        raise KeyError(mig_uuid)
