import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from greenserve.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NvmlBackend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NVML_BACKEND_UNSPECIFIED: _ClassVar[NvmlBackend]
    NVML_BACKEND_NVML: _ClassVar[NvmlBackend]
    NVML_BACKEND_SIMULATED: _ClassVar[NvmlBackend]

class LayoutStepKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LAYOUT_STEP_KIND_UNSPECIFIED: _ClassVar[LayoutStepKind]
    LAYOUT_STEP_KIND_DESTROY: _ClassVar[LayoutStepKind]
    LAYOUT_STEP_KIND_CREATE: _ClassVar[LayoutStepKind]
    LAYOUT_STEP_KIND_ENABLE_MIG: _ClassVar[LayoutStepKind]
    LAYOUT_STEP_KIND_DISABLE_MIG: _ClassVar[LayoutStepKind]

class ApplyState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPLY_STATE_UNSPECIFIED: _ClassVar[ApplyState]
    APPLY_STATE_PENDING: _ClassVar[ApplyState]
    APPLY_STATE_RUNNING: _ClassVar[ApplyState]
    APPLY_STATE_SUCCEEDED: _ClassVar[ApplyState]
    APPLY_STATE_ROLLED_BACK: _ClassVar[ApplyState]
    APPLY_STATE_FAILED: _ClassVar[ApplyState]
NVML_BACKEND_UNSPECIFIED: NvmlBackend
NVML_BACKEND_NVML: NvmlBackend
NVML_BACKEND_SIMULATED: NvmlBackend
LAYOUT_STEP_KIND_UNSPECIFIED: LayoutStepKind
LAYOUT_STEP_KIND_DESTROY: LayoutStepKind
LAYOUT_STEP_KIND_CREATE: LayoutStepKind
LAYOUT_STEP_KIND_ENABLE_MIG: LayoutStepKind
LAYOUT_STEP_KIND_DISABLE_MIG: LayoutStepKind
APPLY_STATE_UNSPECIFIED: ApplyState
APPLY_STATE_PENDING: ApplyState
APPLY_STATE_RUNNING: ApplyState
APPLY_STATE_SUCCEEDED: ApplyState
APPLY_STATE_ROLLED_BACK: ApplyState
APPLY_STATE_FAILED: ApplyState

class GetInventoryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetInventoryResponse(_message.Message):
    __slots__ = ("gpus", "backend", "driver_version")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[_common_pb2.Gpu]
    backend: NvmlBackend
    driver_version: str
    def __init__(self, gpus: _Optional[_Iterable[_Union[_common_pb2.Gpu, _Mapping]]] = ..., backend: _Optional[_Union[NvmlBackend, str]] = ..., driver_version: _Optional[str] = ...) -> None: ...

class ListLayoutsRequest(_message.Message):
    __slots__ = ("gpu_model", "profiles", "driver_branch")
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    DRIVER_BRANCH_FIELD_NUMBER: _ClassVar[int]
    gpu_model: _common_pb2.GpuModel
    profiles: _containers.RepeatedScalarFieldContainer[str]
    driver_branch: int
    def __init__(self, gpu_model: _Optional[_Union[_common_pb2.GpuModel, str]] = ..., profiles: _Optional[_Iterable[str]] = ..., driver_branch: _Optional[int] = ...) -> None: ...

class ListLayoutsResponse(_message.Message):
    __slots__ = ("layouts",)
    LAYOUTS_FIELD_NUMBER: _ClassVar[int]
    layouts: _containers.RepeatedCompositeFieldContainer[_common_pb2.MigLayout]
    def __init__(self, layouts: _Optional[_Iterable[_Union[_common_pb2.MigLayout, _Mapping]]] = ...) -> None: ...

class LayoutStep(_message.Message):
    __slots__ = ("kind", "placement")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    kind: LayoutStepKind
    placement: _common_pb2.MigPlacement
    def __init__(self, kind: _Optional[_Union[LayoutStepKind, str]] = ..., placement: _Optional[_Union[_common_pb2.MigPlacement, _Mapping]] = ...) -> None: ...

class DiffLayoutsRequest(_message.Message):
    __slots__ = ("gpu_model", "to")
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    gpu_model: _common_pb2.GpuModel
    to: _common_pb2.MigLayout
    def __init__(self, gpu_model: _Optional[_Union[_common_pb2.GpuModel, str]] = ..., to: _Optional[_Union[_common_pb2.MigLayout, _Mapping]] = ..., **kwargs) -> None: ...

class DiffLayoutsResponse(_message.Message):
    __slots__ = ("steps", "kept")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[LayoutStep]
    kept: _containers.RepeatedCompositeFieldContainer[_common_pb2.MigPlacement]
    def __init__(self, steps: _Optional[_Iterable[_Union[LayoutStep, _Mapping]]] = ..., kept: _Optional[_Iterable[_Union[_common_pb2.MigPlacement, _Mapping]]] = ...) -> None: ...

class ApplyLayoutRequest(_message.Message):
    __slots__ = ("layout", "plan_version", "dry_run", "drain_timeout_s")
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    DRAIN_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    layout: _common_pb2.MigLayout
    plan_version: int
    dry_run: bool
    drain_timeout_s: float
    def __init__(self, layout: _Optional[_Union[_common_pb2.MigLayout, _Mapping]] = ..., plan_version: _Optional[int] = ..., dry_run: _Optional[bool] = ..., drain_timeout_s: _Optional[float] = ...) -> None: ...

class ApplyRecord(_message.Message):
    __slots__ = ("apply_id", "gpu_uuid", "steps", "done_steps", "state", "error", "instances", "started_at", "ended_at")
    APPLY_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    DONE_STEPS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    apply_id: str
    gpu_uuid: str
    steps: _containers.RepeatedCompositeFieldContainer[LayoutStep]
    done_steps: int
    state: ApplyState
    error: str
    instances: _containers.RepeatedCompositeFieldContainer[_common_pb2.MigInstance]
    started_at: _timestamp_pb2.Timestamp
    ended_at: _timestamp_pb2.Timestamp
    def __init__(self, apply_id: _Optional[str] = ..., gpu_uuid: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[LayoutStep, _Mapping]]] = ..., done_steps: _Optional[int] = ..., state: _Optional[_Union[ApplyState, str]] = ..., error: _Optional[str] = ..., instances: _Optional[_Iterable[_Union[_common_pb2.MigInstance, _Mapping]]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ended_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ApplyLayoutResponse(_message.Message):
    __slots__ = ("record",)
    RECORD_FIELD_NUMBER: _ClassVar[int]
    record: ApplyRecord
    def __init__(self, record: _Optional[_Union[ApplyRecord, _Mapping]] = ...) -> None: ...

class GetApplyRequest(_message.Message):
    __slots__ = ("apply_id",)
    APPLY_ID_FIELD_NUMBER: _ClassVar[int]
    apply_id: str
    def __init__(self, apply_id: _Optional[str] = ...) -> None: ...

class GetApplyResponse(_message.Message):
    __slots__ = ("record",)
    RECORD_FIELD_NUMBER: _ClassVar[int]
    record: ApplyRecord
    def __init__(self, record: _Optional[_Union[ApplyRecord, _Mapping]] = ...) -> None: ...

class GetEnergyRequest(_message.Message):
    __slots__ = ("gpu_uuids",)
    GPU_UUIDS_FIELD_NUMBER: _ClassVar[int]
    gpu_uuids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, gpu_uuids: _Optional[_Iterable[str]] = ...) -> None: ...

class InstanceEnergy(_message.Message):
    __slots__ = ("mig_uuid", "power_w", "energy_j")
    MIG_UUID_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    mig_uuid: str
    power_w: float
    energy_j: float
    def __init__(self, mig_uuid: _Optional[str] = ..., power_w: _Optional[float] = ..., energy_j: _Optional[float] = ...) -> None: ...

class GpuEnergy(_message.Message):
    __slots__ = ("gpu_uuid", "power_w", "energy_j", "instances", "sampled_at", "idle_power_w", "unallocated_power_w", "unallocated_energy_j", "split_rule")
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_FIELD_NUMBER: _ClassVar[int]
    IDLE_POWER_W_FIELD_NUMBER: _ClassVar[int]
    UNALLOCATED_POWER_W_FIELD_NUMBER: _ClassVar[int]
    UNALLOCATED_ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    SPLIT_RULE_FIELD_NUMBER: _ClassVar[int]
    gpu_uuid: str
    power_w: float
    energy_j: float
    instances: _containers.RepeatedCompositeFieldContainer[InstanceEnergy]
    sampled_at: _timestamp_pb2.Timestamp
    idle_power_w: float
    unallocated_power_w: float
    unallocated_energy_j: float
    split_rule: str
    def __init__(self, gpu_uuid: _Optional[str] = ..., power_w: _Optional[float] = ..., energy_j: _Optional[float] = ..., instances: _Optional[_Iterable[_Union[InstanceEnergy, _Mapping]]] = ..., sampled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., idle_power_w: _Optional[float] = ..., unallocated_power_w: _Optional[float] = ..., unallocated_energy_j: _Optional[float] = ..., split_rule: _Optional[str] = ...) -> None: ...

class GetEnergyResponse(_message.Message):
    __slots__ = ("gpus",)
    GPUS_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuEnergy]
    def __init__(self, gpus: _Optional[_Iterable[_Union[GpuEnergy, _Mapping]]] = ...) -> None: ...

class ConvertMigPartedConfigRequest(_message.Message):
    __slots__ = ("yaml", "layouts", "gpu_model")
    YAML_FIELD_NUMBER: _ClassVar[int]
    LAYOUTS_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    yaml: str
    layouts: NamedLayouts
    gpu_model: _common_pb2.GpuModel
    def __init__(self, yaml: _Optional[str] = ..., layouts: _Optional[_Union[NamedLayouts, _Mapping]] = ..., gpu_model: _Optional[_Union[_common_pb2.GpuModel, str]] = ...) -> None: ...

class NamedLayouts(_message.Message):
    __slots__ = ("name", "layouts")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LAYOUTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    layouts: _containers.RepeatedCompositeFieldContainer[_common_pb2.MigLayout]
    def __init__(self, name: _Optional[str] = ..., layouts: _Optional[_Iterable[_Union[_common_pb2.MigLayout, _Mapping]]] = ...) -> None: ...

class ConvertMigPartedConfigResponse(_message.Message):
    __slots__ = ("configs", "yaml")
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    YAML_FIELD_NUMBER: _ClassVar[int]
    configs: _containers.RepeatedCompositeFieldContainer[NamedLayouts]
    yaml: str
    def __init__(self, configs: _Optional[_Iterable[_Union[NamedLayouts, _Mapping]]] = ..., yaml: _Optional[str] = ...) -> None: ...
